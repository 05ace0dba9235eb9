package main

import (
	"fmt"
	"log/slog"
	"net/netip"
	"os"

	"github.com/spf13/cobra"

	"github.com/spore-run/spore/internal/netns"
	"github.com/spore-run/spore/internal/node"
	"github.com/spore-run/spore/internal/server"
)

func newUpCmd(g *globalFlags) *cobra.Command {
	var cfg server.Config
	var reserveMiB int64
	var egressFloor, egressDeny, dnsUpstreams []string
	var dnsPort int
	floorDefault := []string{}
	for _, p := range netns.DefaultFloor() {
		floorDefault = append(floorDefault, p.String())
	}
	cmd := &cobra.Command{
		Use:   "up",
		Short: "Start the all-in-one server: API, proxy and the local node",
		Long: `Start Spore on this host: the E2B-compatible API and the proxy for in-sandbox
traffic on --listen, and the local node (re-attaching to sandboxes that kept
running, recovering interrupted operations, building the default templates
base and code-interpreter-v1 when missing or stale).

The API key comes from SPORE_API_KEY, or is generated on first start, stored
(hashed) and written to <data-dir>/api-key.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if reserveMiB < -1 {
				return fmt.Errorf("--memory-reserve must be -1 (no limit) or a size in MiB, got %d", reserveMiB)
			}
			cfg.MemoryReserve = reserveMiB << 20
			floor, err := netns.ParsePrefixes(egressFloor)
			if err != nil {
				return fmt.Errorf("--egress-floor: %w", err)
			}
			extra, err := netns.ParsePrefixes(egressDeny)
			if err != nil {
				return fmt.Errorf("--egress-deny: %w", err)
			}
			// Never nil: an empty --egress-floor means no floor but the host's addresses.
			cfg.EgressFloor = append(append([]netip.Prefix{}, floor...), extra...)
			if cfg.DNSUpstreams, err = node.ParseUpstreams(dnsUpstreams); err != nil {
				return err
			}
			if dnsPort < 0 || dnsPort > 65535 {
				return fmt.Errorf("--dns-port must be 0-65535, got %d", dnsPort)
			}
			cfg.DNSPort = uint16(dnsPort)
			cfg.DataDir = g.dataDir
			cfg.APIKey = os.Getenv("SPORE_API_KEY")
			cfg.Logger = slog.New(slog.NewTextHandler(os.Stderr, nil))
			cfg.Ready = func(addr, key string) {
				fmt.Fprintf(cmd.OutOrStdout(), "Spore is up on http://%s\n", addr)
				if key != "" && os.Getenv("SPORE_API_KEY") == "" {
					fmt.Fprintf(cmd.OutOrStdout(), "API key: %s (kept in %s)\n", key, server.KeyFile(g.dataDir))
				}
				fmt.Fprintf(cmd.OutOrStdout(), "E2B SDKs: E2B_API_URL=http://%s E2B_SANDBOX_URL=http://%s E2B_API_KEY=<key>\n", addr, addr)
			}
			return server.Run(cmd.Context(), cfg)
		},
	}
	f := cmd.Flags()
	f.StringVar(&cfg.Listen, "listen", "127.0.0.1:3000", "address to serve the API and the proxy on")
	f.StringVar(&cfg.RootFSDir, "rootfs-dir", "", "root filesystems (default <data-dir>/rootfs)")
	f.StringVar(&cfg.Runsc, "runsc", "", "runsc binary (default <data-dir>/bin/runsc)")
	f.StringVar(&cfg.EnvdBinary, "envd", "", "spore-envd binary (default: beside this binary)")
	f.StringVar(&cfg.NetPrefix, "net-prefix", "sp", "prefix of this server's network namespaces and interfaces")
	f.StringVar(&cfg.CgroupParent, "cgroup-parent", "/spore", "cgroup under which sandboxes run")
	f.Int64Var(&reserveMiB, "memory-reserve", 0, "MiB of host memory kept free: creates that would eat into it are refused with 429 (0: 1024, -1: no limit)")
	f.StringVar(&cfg.Cgroups, "cgroups", "runsc", "who manages sandboxes' cgroups: runsc, or driver (cgroup v1: ~15 ms faster starts and restores, but sandboxes see the host's memory and CPU count)")
	f.StringArrayVar(&cfg.RunscFlags, "runsc-flag", nil, "extra global runsc flag, repeatable (--runsc-flag=--debug --runsc-flag=--debug-log=/tmp/runsc/ shows runsc's own timeline)")
	f.IntVar(&cfg.PoolSize, "pool", 2, "sandboxes of each default template kept restored ahead of time (fast creates)")
	f.StringSliceVar(&egressFloor, "egress-floor", floorDefault, "destinations (CIDRs) no sandbox reaches whatever its allowOut: replaces the default list; the host's own addresses are always added")
	f.StringSliceVar(&egressDeny, "egress-deny", nil, "more destinations (CIDRs) added to the egress floor")
	f.StringSliceVar(&dnsUpstreams, "dns-upstream", nil, "resolvers (addr or addr:port) the sandboxes' DNS forwarder asks (default: the nameservers of /etc/resolv.conf)")
	f.IntVar(&dnsPort, "dns-port", 0, "port of the sandboxes' DNS forwarder on the host side of their links (0: the one used last, else a free one)")
	return cmd
}

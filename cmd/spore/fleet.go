package main

import (
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/spf13/cobra"

	"github.com/spore-run/spore/internal/fleet"
	"github.com/spore-run/spore/internal/node"
)

func newFleetCmd(g *globalFlags) *cobra.Command {
	cmd := &cobra.Command{
		Use:   "fleet",
		Short: "Start or remove a whole fleet on this machine (PostgreSQL, an S3 server, node agents in namespaces, API replicas)",
	}
	cmd.AddCommand(newFleetUpCmd(g), newFleetDownCmd(g), newFleetUpgradeCmd(g), newFleetPurgeNodeCmd(g), newFleetCACmd(), newFleetCertCmd())
	return cmd
}

func fleetDir(g *globalFlags, dir string) string {
	if dir != "" {
		return dir
	}
	return filepath.Join(g.dataDir, "fleet")
}

func newFleetUpCmd(g *globalFlags) *cobra.Command {
	var cfg fleet.Config
	var dir string
	var verbose bool
	cmd := &cobra.Command{
		Use:   "up",
		Short: "Start a fleet on this machine",
		Long: `Start a whole Spore fleet on this machine, to try it: a throwaway PostgreSQL
cluster, an S3 server (versitygw, from ` + "`make s3-tools`" + `) holding the
snapshots the nodes share, --nodes node agents (each in a network namespace of its own,
<prefix>f<K>, linked to the host on 10.201.K.0/30, with its own data
directory) and --replicas API replicas on 127.0.0.1:<base-port>... .
Everything is recorded in <dir>/fleet.json; ` + "`spore fleet down`" + ` removes it all.
Nothing beyond the machine reaches the fleet (the replicas' listeners are
firewalled to loopback and the nodes' links).

The nodes use the runtime ` + "`make setup`" + ` installed under --data-dir (rootfs,
runsc); --node-arg adds flags to every ` + "`spore node`" + `.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			cfg.Dir = fleetDir(g, dir)
			cfg.NodeArgs = append([]string{"--rootfs-dir", filepath.Join(g.dataDir, "rootfs"), "--runsc", filepath.Join(g.dataDir, "bin", "runsc")}, cfg.NodeArgs...)
			level := slog.LevelWarn
			if verbose {
				level = slog.LevelInfo
			}
			cfg.Logger = slog.New(slog.NewTextHandler(cmd.ErrOrStderr(), &slog.HandlerOptions{Level: level}))
			t0 := time.Now()
			what := "PostgreSQL"
			if cfg.BlobStore == "" {
				what += ", an S3 server"
			}
			fmt.Fprintf(cmd.ErrOrStderr(), "spore fleet: starting %s, %d nodes, %d API replicas in %s (nodes build their templates on first start)...\n", what, cfg.Nodes, cfg.Replicas, cfg.Dir)
			st, err := fleet.Up(cmd.Context(), cfg)
			if err != nil {
				return err
			}
			key, err := os.ReadFile(st.KeyFile)
			if err != nil {
				return err
			}
			out := cmd.OutOrStdout()
			fmt.Fprintf(out, "Fleet up in %.1f s: %d nodes, %d API replicas, PostgreSQL on 127.0.0.1:%d\n", time.Since(t0).Seconds(), len(st.Nodes), len(st.APIURLs), st.Postgres.Port)
			if st.S3 != nil {
				fmt.Fprintf(out, "S3 (versitygw): %s, bucket %s, keys in %s\n", st.S3.Endpoint, st.S3.Bucket, st.S3.CredentialsFile)
			}
			for i, u := range st.APIURLs {
				fmt.Fprintf(out, "API replica %d: %s\n", i+1, u)
			}
			for _, n := range st.Nodes {
				fmt.Fprintf(out, "node %d: %s at %s (netns %s, data %s)\n", n.Index, n.ID, n.Listen, n.Netns, n.DataDir)
			}
			fmt.Fprintf(out, "API key: %s (kept in %s)\n", strings.TrimSpace(string(key)), st.KeyFile)
			fmt.Fprintf(out, "E2B SDKs: E2B_API_URL=%s E2B_SANDBOX_URL=%s E2B_API_KEY=<key>\n", st.APIURLs[0], st.APIURLs[0])
			fmt.Fprintf(out, "Logs in %s; remove it all with: spore fleet down --dir %s\n", filepath.Join(st.Dir, "logs"), st.Dir)
			return nil
		},
	}
	f := cmd.Flags()
	f.IntVar(&cfg.Nodes, "nodes", 3, "node agents")
	f.IntVar(&cfg.Replicas, "replicas", 2, "API replicas")
	f.StringVar(&dir, "dir", "", "the fleet's directory (default <data-dir>/fleet)")
	f.IntVar(&cfg.BasePort, "base-port", fleet.DefaultBasePort, "API replica i listens on base-port+i")
	f.StringVar(&cfg.Prefix, "prefix", fleet.DefaultPrefix, "1-2 letters naming the fleet's namespaces (<prefix>f<K>) and firewall table")
	f.StringVar(&cfg.BlobStore, "blob-store", "", "the nodes' shared blob store (see spore node --blob-store; default: an S3 server the fleet starts; {host} is replaced by each node's gateway address)")
	f.StringVar(&cfg.S3Server, "s3-server", "", "the versitygw binary of the fleet's S3 server (default $SPORE_VERSITYGW, else the one `make s3-tools` built)")
	f.StringArrayVar(&cfg.NodeArgs, "node-arg", nil, "extra flag for every `spore node` (repeatable; host flags such as --memory-reserve=512)")
	f.StringArrayVar(&cfg.APIArgs, "api-arg", nil, "extra flag for every `spore api` (repeatable)")
	f.DurationVar(&cfg.ReadyTimeout, "ready-timeout", 10*time.Minute, "how long to wait for every process to answer")
	f.BoolVarP(&verbose, "verbose", "v", false, "log each step")
	return cmd
}

func newFleetDownCmd(g *globalFlags) *cobra.Command {
	var dir string
	cmd := &cobra.Command{
		Use:   "down",
		Short: "Stop and remove the fleet: its processes, sandboxes, namespaces, links, firewall table and directory",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			d := fleetDir(g, dir)
			t0 := time.Now()
			log := slog.New(slog.NewTextHandler(cmd.ErrOrStderr(), &slog.HandlerOptions{Level: slog.LevelWarn}))
			if err := fleet.Down(cmd.Context(), d, log); err != nil {
				return err
			}
			fmt.Fprintf(cmd.OutOrStdout(), "Fleet in %s removed in %.1f s\n", d, time.Since(t0).Seconds())
			return nil
		},
	}
	cmd.Flags().StringVar(&dir, "dir", "", "the fleet's directory (default <data-dir>/fleet)")
	return cmd
}

func newFleetUpgradeCmd(g *globalFlags) *cobra.Command {
	var dir, exe string
	var verbose bool
	cmd := &cobra.Command{
		Use:   "upgrade --executable PATH",
		Short: "Replace every node agent, then every API replica, one at a time, with another spore binary (a rolling upgrade)",
		Long: `Replace the fleet's spore processes one at a time with --executable, while
clients keep using the fleet. Each node is drained (its sandboxes hibernated,
and made durable in the blob store, so each resumes on another node at its next
connect), stopped once it holds nothing, started on the new binary, and
undrained once it registered again and is ready. Then each API replica is
stopped (it finishes the requests it has) and started on the new binary while
the others serve. PostgreSQL and the S3 server are left alone. See
docs/deploy.md, "Rolling upgrade".`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			d := fleetDir(g, dir)
			level := slog.LevelWarn
			if verbose {
				level = slog.LevelInfo
			}
			log := slog.New(slog.NewTextHandler(cmd.ErrOrStderr(), &slog.HandlerOptions{Level: level}))
			t0 := time.Now()
			steps, err := fleet.RollingUpgrade(cmd.Context(), d, exe, "", log)
			out := cmd.OutOrStdout()
			for _, s := range steps {
				if s.Ready.IsZero() {
					continue
				}
				if s.NodeID != "" {
					late := ""
					if s.NotDurable > 0 {
						late = fmt.Sprintf(" (%d not durable yet when stopped)", s.NotDurable)
					}
					fmt.Fprintf(out, "%s (%s): drained (%d sandboxes hibernated, %d calls)%s, down %.1f s, step %.1f s\n",
						s.Name, s.NodeID, s.Hibernated, s.Drains, late, s.Ready.Sub(s.Stopped).Seconds(), s.Done.Sub(s.Began).Seconds())
				} else {
					fmt.Fprintf(out, "%s: down %.1f s\n", s.Name, s.Ready.Sub(s.Stopped).Seconds())
				}
			}
			if err != nil {
				return err
			}
			fmt.Fprintf(out, "Fleet in %s upgraded to %s in %.1f s\n", d, exe, time.Since(t0).Seconds())
			return nil
		},
	}
	f := cmd.Flags()
	f.StringVar(&exe, "executable", "", "the new spore binary's `PATH` (checked first: \"PATH version\" must print \"spore <version>\")")
	f.StringVar(&dir, "dir", "", "the fleet's directory (default <data-dir>/fleet)")
	f.BoolVarP(&verbose, "verbose", "v", false, "log each step")
	cmd.MarkFlagRequired("executable")
	return cmd
}

// newFleetPurgeNodeCmd is what `spore fleet down` runs inside each node's
// namespace: the node's own cleanup of what its agent left.
func newFleetPurgeNodeCmd(g *globalFlags) *cobra.Command {
	var cfg node.Config
	cmd := &cobra.Command{
		Use:    "purge-node",
		Short:  "Remove a stopped node agent's sandboxes, networks, mounts and cgroups (run by `spore fleet down`)",
		Hidden: true,
		Args:   cobra.NoArgs,
		// It gets the node agent's host flags; those it does not need are ignored.
		FParseErrWhitelist: cobra.FParseErrWhitelist{UnknownFlags: true},
		RunE: func(cmd *cobra.Command, _ []string) error {
			cfg.DataDir = g.dataDir
			cfg.Logger = slog.New(slog.NewTextHandler(cmd.ErrOrStderr(), &slog.HandlerOptions{Level: slog.LevelWarn}))
			return fleet.PurgeNode(cmd.Context(), cfg)
		},
	}
	f := cmd.Flags()
	f.StringVar(&cfg.RootFSDir, "rootfs-dir", "", "root filesystems")
	f.StringVar(&cfg.Runsc, "runsc", "", "runsc binary")
	f.StringVar(&cfg.EnvdBinary, "envd", "", "spore-envd binary")
	f.StringVar(&cfg.NetPrefix, "net-prefix", "", "the node's network prefix")
	f.StringVar(&cfg.CgroupParent, "cgroup-parent", "", "the node's cgroup parent")
	f.StringVar(&cfg.Cgroups, "cgroups", "runsc", "who managed the node's cgroups")
	return cmd
}

package main

import (
	"fmt"
	"log/slog"
	"os"
	"strconv"
	"time"

	"github.com/spf13/cobra"

	"github.com/spore-run/spore/internal/server"
)

func newNodeCmd(g *globalFlags) *cobra.Command {
	var cfg server.NodeConfig
	var ff *fleetFlags
	var labels []string
	var metricsTokenFile string
	var checkHost func() error
	cmd := &cobra.Command{
		Use:   "node",
		Short: "Run a node agent of a fleet (or drain/undrain one)",
		Long: `Run a node agent: this host's engine, networks, envd and templates, serving the
node contract (Connect-RPC) and the node's side of the traffic proxy on
--listen (TLS), both only to API replicas of its fleet (their certificates).
It registers with the replicas' fleet listener (--api-url https://...) and
heartbeats every 2 s; control planes reach it at --advertise-addr. Its
certificate is kept in <data-dir>/fleet: the first start enrolls for one with
the join token (--join-token-file) and the fleet CA (--fleet-ca); it renews
itself. Its ID is --node-id, or the one kept in <data-dir>/node-id (minted on
first start). --insecure-fleet --cluster-token-file: cleartext and a shared
token instead, for trusted test networks only.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if err := checkHost(); err != nil {
				return err
			}
			var err error
			if cfg.Fleet, err = ff.config(); err != nil {
				return err
			}
			if cfg.Labels, err = parseKV("label", labels); err != nil {
				return err
			}
			if metricsTokenFile != "" {
				if cfg.MetricsToken, err = server.ReadMetricsToken(metricsTokenFile); err != nil {
					return err
				}
			}
			cfg.Host.DataDir = g.dataDir
			cfg.Host.Logger = slog.New(slog.NewTextHandler(os.Stderr, nil))
			cfg.Host.Ready = func(addr, _ string) {
				fmt.Fprintf(cmd.OutOrStdout(), "Spore node on %s (advertised as %s)\n", addr, cfg.AdvertiseAddr)
			}
			return server.RunNode(cmd.Context(), cfg)
		},
	}
	f := cmd.Flags()
	f.StringVar(&cfg.Host.Listen, "listen", "127.0.0.1:3001", "address to serve the node RPC and proxy on")
	f.StringVar(&cfg.APIURL, "api-url", "", "URL of the API (a replica or the load balancer) to register with; several replicas: comma-separated, tried in turn")
	ff = addFleetFlags(f, false)
	f.StringVar(&cfg.AdvertiseAddr, "advertise-addr", "", "host:port control planes reach --listen at")
	f.StringSliceVar(&labels, "labels", nil, "node labels for placement selectors, k=v,...")
	f.StringVar(&cfg.NodeID, "node-id", "", "node ID (default: kept in <data-dir>/node-id)")
	f.StringVar(&cfg.MetricsListen, "metrics-listen", "", "serve this host's Prometheus metrics (GET /metrics) on this address, to scrapes presenting the --metrics-token-file token as their bearer (docs/metrics.md); empty: none")
	f.StringVar(&metricsTokenFile, "metrics-token-file", "", "file holding the token a metrics scrape presents (Authorization: Bearer; at least 16 characters)")
	checkHost = addHostFlags(f, &cfg.Host)
	for _, name := range []string{"api-url", "advertise-addr"} {
		cmd.MarkFlagRequired(name)
	}
	cf := &cliFlags{g: g}
	for _, c := range []*cobra.Command{newNodeDrainCmd(cf, true), newNodeDrainCmd(cf, false)} {
		c.Flags().BoolVar(&cf.json, "json", false, "print JSON")
		cmd.AddCommand(c)
	}
	return cmd
}

func newNodeDrainCmd(f *cliFlags, drain bool) *cobra.Command {
	use, short := "drain NODE", "Stop placements on a node and hibernate its sandboxes"
	if !drain {
		use, short = "undrain NODE", "Let placements use a drained node again"
	}
	return &cobra.Command{
		Use:   use,
		Short: short,
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			c, err := f.client()
			if err != nil {
				return err
			}
			if !drain {
				if err := c.UndrainNode(cmd.Context(), args[0]); err != nil {
					return err
				}
				fmt.Fprintf(cmd.OutOrStdout(), "%s undrained\n", args[0])
				return nil
			}
			res, err := c.DrainNode(cmd.Context(), args[0])
			if err != nil {
				return err
			}
			if f.json {
				return printJSON(cmd.OutOrStdout(), res)
			}
			fmt.Fprintf(cmd.OutOrStdout(), "%s drained: %d sandboxes hibernated\n", args[0], res.Hibernated)
			return nil
		},
	}
}

func newNodesCmd(f *cliFlags) *cobra.Command {
	return &cobra.Command{
		Use:   "nodes",
		Short: "List the fleet's nodes",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			c, err := f.client()
			if err != nil {
				return err
			}
			list, err := c.Nodes(cmd.Context())
			if err != nil {
				return err
			}
			if f.json {
				return printJSON(cmd.OutOrStdout(), list)
			}
			var rows [][]string
			for _, n := range list {
				rows = append(rows, []string{n.NodeID, n.Addr, n.State, strconv.FormatBool(n.Draining), strconv.Itoa(n.Sandboxes),
					fmt.Sprintf("%d/%d", n.MemoryUsedMB, n.MemoryAllocatableMB),
					fmt.Sprintf("%d ×%g", n.MemoryCapacityMB, n.MemoryOvercommit), fmt.Sprintf("%g ×%g", n.VCPUs, n.CPUOvercommit),
					(time.Duration(n.HeartbeatAgeMs) * time.Millisecond).Round(100 * time.Millisecond).String()})
			}
			table(cmd.OutOrStdout(), "NODE\tADDR\tSTATE\tDRAINING\tSANDBOXES\tLIMITS MB USED/PLACEABLE\tMEMORY MB\tCPUS\tHEARTBEAT AGE", rows)
			return nil
		},
	}
}

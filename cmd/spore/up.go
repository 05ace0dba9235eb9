package main

import (
	"fmt"
	"log/slog"
	"os"
	"time"

	"github.com/spf13/cobra"

	"github.com/spore-run/spore/internal/audit"
	"github.com/spore-run/spore/internal/server"
)

func newUpCmd(g *globalFlags) *cobra.Command {
	var cfg server.Config
	var metricsTokenFile string
	var checkHost func() error
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
			if err := checkHost(); err != nil {
				return err
			}
			if cfg.AuditRetention < time.Hour {
				return fmt.Errorf("--audit-retention must be at least 1h, got %v", cfg.AuditRetention)
			}
			if metricsTokenFile != "" {
				var err error
				if cfg.MetricsToken, err = server.ReadMetricsToken(metricsTokenFile); err != nil {
					return err
				}
			}
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
	checkHost = addHostFlags(f, &cfg)
	f.DurationVar(&cfg.AuditRetention, "audit-retention", audit.DefaultRetention, "how long the audit trail keeps a record (API calls, sandbox events; `spore audit`)")
	defaultQuotasFlag(f, &cfg.DefaultTeamQuotas)
	metricsTokenFlag(f, &metricsTokenFile)
	f.IntVar(&cfg.PoolSize, "pool", 2, "sandboxes of each default template kept restored ahead of time (fast creates)")
	f.StringVar(&cfg.Domain, "domain", os.Getenv("SPORE_DOMAIN"), "the sandboxes' domain: create and connect answers name it, so an SDK's getHost(port) is {port}-{sandboxID}.DOMAIN, which the proxy serves (point wildcard DNS *.DOMAIN at this server; env SPORE_DOMAIN)")
	return cmd
}

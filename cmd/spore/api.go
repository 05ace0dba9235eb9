package main

import (
	"fmt"
	"log/slog"
	"os"
	"strings"
	"time"

	"github.com/spf13/cobra"

	"github.com/spore-run/spore/internal/audit"
	"github.com/spore-run/spore/internal/nodeapi"
	"github.com/spore-run/spore/internal/server"
)

func newAPICmd() *cobra.Command {
	var cfg server.APIConfig
	var metricsTokenFile string
	var keyFile, dbFile string
	var ff *fleetFlags
	cmd := &cobra.Command{
		Use:   "api",
		Short: "Run a stateless API replica of a fleet: REST API, proxy, lifecycle, placement",
		Long: `Run an API replica: the E2B-compatible API and the in-sandbox traffic proxy on
--listen, over a shared metadata store (--database-url: postgres://..., or
sqlite:///path / a path for one replica) and the node agents that registered
with it (spore node). Any number of replicas may share one PostgreSQL.

Replicas and nodes authenticate each other with certificates of a fleet CA
(--fleet-ca, --fleet-ca-key: spore fleet ca init): nodes enroll and register on
the fleet listener (--fleet-listen, TLS) with the join token
(--join-token-file) the first time, with their certificate after; every call
inside the fleet is mutual TLS. --insecure-fleet --cluster-token-file keeps the
old cleartext and shared token, for trusted test networks only.

The API key: --api-key-file (or SPORE_API_KEY) adds one (stored hashed);
without either, keys already in the store are used, or with --data-dir one
is generated as spore up does.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if cfg.AuditRetention < time.Hour {
				return fmt.Errorf("--audit-retention must be at least 1h, got %v", cfg.AuditRetention)
			}
			if cfg.DrainGrace < 0 || cfg.DrainGrace > nodeapi.MaxQuiesceGrace {
				return fmt.Errorf("--drain-grace %v: want 0 to %v", cfg.DrainGrace, nodeapi.MaxQuiesceGrace)
			}
			var err error
			if metricsTokenFile != "" {
				if cfg.MetricsToken, err = server.ReadMetricsToken(metricsTokenFile); err != nil {
					return err
				}
			}
			if cfg.Fleet, err = ff.config(); err != nil {
				return err
			}
			if dbFile != "" {
				b, err := os.ReadFile(dbFile)
				if err != nil {
					return fmt.Errorf("--database-url-file: %w", err)
				}
				if cfg.DatabaseURL = strings.TrimSpace(string(b)); cfg.DatabaseURL == "" {
					return fmt.Errorf("--database-url-file %s is empty", dbFile)
				}
			}
			if cfg.DatabaseURL == "" {
				return fmt.Errorf("no database: give --database-url-file (or SPORE_DATABASE_URL; --database-url shows the URL, and any password in it, to every user of the host)")
			}
			cfg.APIKey = os.Getenv("SPORE_API_KEY")
			if keyFile != "" {
				b, err := os.ReadFile(keyFile)
				if err != nil {
					return fmt.Errorf("--api-key-file: %w", err)
				}
				if cfg.APIKey = strings.TrimSpace(string(b)); cfg.APIKey == "" {
					return fmt.Errorf("--api-key-file %s is empty", keyFile)
				}
			}
			cfg.Logger = slog.New(slog.NewTextHandler(os.Stderr, nil))
			cfg.Ready = func(addr, key string) {
				fmt.Fprintf(cmd.OutOrStdout(), "Spore API on http://%s\n", addr)
				if key != "" && cfg.APIKey == "" {
					fmt.Fprintf(cmd.OutOrStdout(), "API key: %s (kept in %s)\n", key, server.KeyFile(cfg.DataDir))
				}
			}
			return server.RunAPI(cmd.Context(), cfg)
		},
	}
	f := cmd.Flags()
	f.StringVar(&cfg.Listen, "listen", "127.0.0.1:3000", "address to serve the API, the proxy and node registration on")
	f.DurationVar(&cfg.AuditRetention, "audit-retention", audit.DefaultRetention, "how long the audit trail keeps a record (API calls, sandbox events; `spore audit`); every replica prunes what is older")
	defaultQuotasFlag(f, &cfg.DefaultTeamQuotas)
	metricsTokenFlag(f, &metricsTokenFile)
	f.DurationVar(&cfg.DrainGrace, "drain-grace", 10*time.Second, "how long a node drain waits for the requests in flight to a running sandbox (a command, a file transfer) before it hibernates it; a stream still open then is cut (at most 10m)")
	f.StringVar(&cfg.DatabaseURL, "database-url", os.Getenv("SPORE_DATABASE_URL"), "metadata store: postgres://user@host/db, sqlite:///path or a path (env SPORE_DATABASE_URL; a URL with a password: --database-url-file)")
	f.StringVar(&dbFile, "database-url-file", "", "a file holding the database URL (keeps its password off the command line)")
	ff = addFleetFlags(f, true)
	f.StringVar(&keyFile, "api-key-file", "", "file holding an API key to accept")
	f.StringVar(&cfg.DataDir, "data-dir", "", "where a generated API key is kept (none: keys must exist or be given)")
	f.IntVar(&cfg.PoolSize, "pool", 2, "warm-pool sandboxes per default template across the fleet (every replica serves from it; give all replicas the same)")
	f.StringVar(&cfg.Domain, "domain", os.Getenv("SPORE_DOMAIN"), "the sandboxes' domain: create and connect answers name it, so an SDK's getHost(port) is {port}-{sandboxID}.DOMAIN, which the proxy serves (point wildcard DNS *.DOMAIN at this server; env SPORE_DOMAIN)")
	f.StringVar(&cfg.BlobStore, "blob-store", os.Getenv("SPORE_BLOB_STORE"), "the nodes' shared blob store (as spore node --blob-store), where files uploaded for template builds go; none: such uploads are refused (env SPORE_BLOB_STORE)")
	f.StringVar(&cfg.SecretsKeyFile, "secrets-key-file", "", "file holding the key secrets are sealed with in the store (32 bytes in base64: head -c 32 /dev/urandom | base64); every replica needs the same one (default: <data-dir>/secrets-key, generated on first start)")
	return cmd
}

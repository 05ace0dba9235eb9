// Package server runs the all-in-one Spore: the node (engine, networks,
// envd, templates), the metadata store, the control plane, the API and the
// proxy, on one listener.
package server

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/spore-run/spore/internal/api"
	"github.com/spore-run/spore/internal/apikey"
	"github.com/spore-run/spore/internal/audit"
	"github.com/spore-run/spore/internal/blob/blobconf"
	"github.com/spore-run/spore/internal/control"
	"github.com/spore-run/spore/internal/engine"
	"github.com/spore-run/spore/internal/metrics"
	"github.com/spore-run/spore/internal/node"
	"github.com/spore-run/spore/internal/nodeapi"
	"github.com/spore-run/spore/internal/nodeapi/local"
	"github.com/spore-run/spore/internal/proxy"
	"github.com/spore-run/spore/internal/store"
	"github.com/spore-run/spore/internal/store/sqlite"
	"github.com/spore-run/spore/internal/teammetrics"
)

// Config configures the server.
type Config struct {
	DataDir      string
	Listen       string // 127.0.0.1:3000
	RootFSDir    string
	Runsc        string
	EnvdBinary   string
	NetPrefix    string
	CgroupParent string
	// APIKey, when set, is accepted (added to the store); otherwise one
	// is generated on first start, stored (hashed) and written to
	// <data>/api-key.
	APIKey string
	Logger *slog.Logger
	// Ready is called once the server listens.
	Ready func(addr, apiKey string)
	// RunscFlags are extra global runsc flags; Cgroups who manages
	// sandboxes' cgroups (see node.Config).
	RunscFlags []string
	Cgroups    string
	// MemoryReserve is host memory new sandboxes may not use, in bytes
	// (0: engine.DefaultMemoryReserve; negative: no limit).
	MemoryReserve int64
	// Overcommit is how many times the host's real memory and CPUs
	// placement may promise to sandboxes' limits (each 0: the defaults of
	// nodeapi/local).
	Overcommit nodeapi.Overcommit
	// PoolSize is how many sandboxes of each default template are kept
	// restored ahead of time (0: none).
	PoolSize int
	// Domain is the sandboxes' domain announced to SDKs (see api.Config).
	Domain string
	// EgressFloor, DNSUpstreams and DNSPort: see node.Config.
	EgressFloor []netip.Prefix
	NoIPv6      bool // see node.Config
	// RestoreTargets: see node.Config (0: the default, negative: none).
	RestoreTargets int
	// RestoreTargetsBurst: see node.Config (0: the default, negative: no
	// growth).
	RestoreTargetsBurst int
	// ReservedNetworks: see node.Config (0: the default, negative: none).
	ReservedNetworks int
	// Launches: see node.Config (0: the default, negative: no bound).
	Launches int
	// BackgroundLoadMB: see node.Config.
	BackgroundLoadMB int64
	DNSUpstreams     []netip.AddrPort
	DNSPort          uint16
	// InsecureRegistries, PrivateRegistries, RegistryAuthFile: see
	// node.Config.
	InsecureRegistries []string
	PrivateRegistries  []string
	RegistryAuthFile   string
	// EgressRetention: see node.Config.
	EgressRetention time.Duration
	// AuditRetention is how long the audit trail keeps a record
	// (docs/teams.md); 0: audit.DefaultRetention.
	AuditRetention time.Duration
	// DefaultTeamQuotas are a new team's quotas when none are given
	// (api.Config).
	DefaultTeamQuotas store.Quotas
	// MetricsToken, when set, is accepted by GET /metrics besides
	// operator keys (api.Config).
	MetricsToken  string
	EgressCAFiles []string
	// BlobStore names the blob store snapshots are made durable in (see
	// blobconf.Open); "" is the role's default: <data-dir>/blobs for
	// `spore up`, none for a node agent.
	BlobStore string
	// ChunkCacheBytes bounds the node's chunk cache (0: the default).
	ChunkCacheBytes int64
	// peerClient reaches the node's peers as a member of the fleet
	// (a node agent's); peerScheme is their URLs' scheme.
	peerClient *http.Client
	peerScheme string
}

// KeyFile is where a generated API key is kept (root-only).
func KeyFile(dataDir string) string { return filepath.Join(dataDir, "api-key") }

// Run serves until ctx ends.
func Run(ctx context.Context, cfg Config) error {
	if err := api.ValidateDomain(cfg.Domain); err != nil {
		return err
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.NewTextHandler(os.Stderr, nil))
	}
	log := cfg.Logger
	if err := os.MkdirAll(cfg.DataDir, 0o700); err != nil {
		return err
	}
	if cfg.BlobStore == "" {
		cfg.BlobStore = filepath.Join(cfg.DataDir, "blobs")
	}
	n, err := openNode(ctx, cfg)
	if err != nil {
		return err
	}
	defer n.Close()
	st, err := sqlite.Open(ctx, filepath.Join(cfg.DataDir, "spore.db"))
	if err != nil {
		return err
	}
	defer st.Close()
	// The audit trail's writer outlives everything that records (the
	// deferred closes below run before its own).
	aw := audit.NewWriter(st, log)
	defer aw.Close()
	go audit.Prune(ctx, st, audit.RetentionOr(cfg.AuditRetention), audit.PruneEvery, log)
	go teammetrics.Run(ctx, st, 0, nil, log) // E2B's team metrics: every replica samples
	key, err := ensureKey(ctx, st, cfg, log)
	if err != nil {
		return err
	}
	// The one node of `spore up`, in process, behind the same contract a
	// remote node agent serves; it registers itself in the store.
	ln0 := local.New(n.Engine, local.Config{ID: LocalNodeID, Reserved: reserveOf(cfg.MemoryReserve), Overcommit: cfg.Overcommit,
		Sync: n.Sync, CPUFeatures: n.CPUFeatures, Images: n})
	box, err := secretsBox("", cfg.DataDir)
	if err != nil {
		return err
	}
	ctl := control.New(control.Config{Store: store.Timed(st), Nodes: control.Nodes{LocalNodeID: ln0}, Logger: log, Secrets: box, Audit: aw})
	defer ctl.Close()
	if err := ctl.RegisterNodes(ctx); err != nil {
		return fmt.Errorf("register node: %w", err)
	}
	if err := ctl.Reconcile(ctx); err != nil {
		return fmt.Errorf("reconcile: %w", err)
	}
	go ctl.Run(ctx, time.Second)
	go ctl.RunReconcile(ctx, control.ReconcileEvery)
	poolDone := make(chan struct{})
	go func() {
		defer close(poolDone)
		ctl.RunPool(ctx, control.PoolConfig{Templates: []string{node.TemplateBase, node.TemplateCodeInterpreter}, Size: cfg.PoolSize})
	}()
	defer func() { <-poolDone }()
	bs, err := newBuilds(ctx, ctl, store.Timed(st), cfg.BlobStore, LocalNodeID, log)
	if err != nil {
		return err
	}
	defer bs.Close()
	keys := apikey.NewChecker(st).WithLogger(log)
	reg := metrics.NewRegistry()
	reg.MustRegister(metrics.NewHost(func(ctx context.Context) metrics.HostFigures { return hostFigures(ctx, n) }))
	px := proxy.New(ctl, keys.Check, log)
	reg.MustRegister(metrics.NewProxy("replica", proxyFigures(px)))
	handler := api.New(api.Config{Control: ctl, Store: st, Proxy: px, Logger: log, Metrics: reg,
		Node: func() api.NodeReport { return nodeReport(n) }, Domain: cfg.Domain, Keys: keys, Builds: bs.Service, Blobs: bs.Blobs, Audit: aw,
		DefaultTeamQuotas: cfg.DefaultTeamQuotas, MetricsToken: cfg.MetricsToken,
		VolumeContent: func(ctx context.Context, v store.Volume) (*os.Root, error) {
			// The one node holds every volume: one whose content is
			// written before any sandbox mounts it is made here.
			if v.NodeID == "" {
				if _, err := st.UpdateVolume(ctx, "", v.ID, func(x *store.Volume) error {
					if x.NodeID == "" {
						x.NodeID = LocalNodeID
					}
					return nil
				}); err != nil {
					return nil, err
				}
			}
			return n.VolumeRoot(ctx, v.ID, v.SizeBytes)
		}})
	ln, err := net.Listen("tcp", cfg.Listen)
	if err != nil {
		return err
	}
	bs.listening(ln.Addr().String())
	hs := &http.Server{Handler: handler, ReadHeaderTimeout: 30 * time.Second}
	errc := make(chan error, 1)
	go func() { errc <- hs.Serve(ln) }()
	log.Info("spore up", "listen", ln.Addr().String(), "data_dir", cfg.DataDir,
		"sandboxes", len(n.Engine.List(ctx)), "snapshots", len(n.Engine.Snapshots().List()))
	if cfg.Ready != nil {
		cfg.Ready(ln.Addr().String(), key)
	}
	select {
	case <-ctx.Done():
	case err := <-errc:
		if !errors.Is(err, http.ErrServerClosed) {
			return err
		}
	}
	sctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	hs.Shutdown(sctx)
	log.Info("stopped; sandboxes keep running and are re-attached at the next start")
	return nil
}

// openNode opens the host's node (engine, networks, envd) and builds
// the default templates when missing or stale.
func openNode(ctx context.Context, cfg Config) (*node.Node, error) {
	blobs, err := blobconf.Open(ctx, cfg.BlobStore)
	if err != nil {
		return nil, err
	}
	n, err := node.Open(ctx, node.Config{
		Blobs: blobs, ChunkCacheBytes: cfg.ChunkCacheBytes, PeerClient: cfg.peerClient,
		DataDir: cfg.DataDir, RootFSDir: cfg.RootFSDir, Runsc: cfg.Runsc, EnvdBinary: cfg.EnvdBinary,
		NetPrefix: cfg.NetPrefix, CgroupParent: cfg.CgroupParent, MemoryReserve: cfg.MemoryReserve, RunscFlags: cfg.RunscFlags, Cgroups: cfg.Cgroups, Logger: cfg.Logger,
		EgressFloor: cfg.EgressFloor, NoIPv6: cfg.NoIPv6, RestoreTargets: cfg.RestoreTargets, RestoreTargetsBurst: cfg.RestoreTargetsBurst, ReservedNetworks: cfg.ReservedNetworks, Launches: cfg.Launches, BackgroundLoadMB: cfg.BackgroundLoadMB, DNSUpstreams: cfg.DNSUpstreams, DNSPort: cfg.DNSPort,
		InsecureRegistries: cfg.InsecureRegistries, PrivateRegistries: cfg.PrivateRegistries, RegistryAuthFile: cfg.RegistryAuthFile, EgressRetention: cfg.EgressRetention, EgressCAFiles: cfg.EgressCAFiles,
	})
	if err != nil {
		return nil, err
	}
	if cfg.peerClient != nil && n.Sync != nil {
		// A node agent of a fleet: snapshots restore across nodes only over
		// one build of the root filesystem, the one the blob store holds.
		if _, err := n.ShareRootFS(ctx, "base"); err != nil {
			n.Close()
			return nil, fmt.Errorf("share the root filesystem: %w", err)
		}
	}
	if err := n.EnsureTemplates(ctx); err != nil {
		n.Close()
		return nil, err
	}
	return n, nil
}

// LocalNodeID is the in-process node's ID (sandbox rows of `spore up`
// name it).
const LocalNodeID = "local"

// reserveOf is the node's admission reserve as capacity (bytes given;
// 0: the engine's default; negative: none).
func reserveOf(bytes int64) nodeapi.Resources {
	switch {
	case bytes < 0:
		return nodeapi.Resources{}
	case bytes == 0:
		bytes = engine.DefaultMemoryReserve
	}
	return nodeapi.Resources{MemoryMB: bytes >> 20}
}

// ensureKey makes sure an API key is accepted and returns it when known:
// the configured one (cfg.APIKey, an admin key; a newer configured key
// revokes the older, see apikey.EnsureConfigured), or the one generated
// into the data directory at the first start.
func ensureKey(ctx context.Context, st store.Store, cfg Config, log *slog.Logger) (string, error) {
	if cfg.APIKey != "" {
		return cfg.APIKey, apikey.EnsureConfigured(ctx, st, cfg.APIKey, log)
	}
	if b, err := os.ReadFile(KeyFile(cfg.DataDir)); err == nil {
		return strings.TrimSpace(string(b)), nil
	}
	n, err := st.CountAPIKeys(ctx)
	if err != nil {
		return "", err
	}
	if n > 0 {
		return "", nil // keys exist; the generated one was moved away
	}
	key, _, err := apikey.Create(ctx, st, nil, apikey.Spec{Name: "generated by spore up", Role: store.RoleOperator, Source: store.SourceGenerated})
	if err != nil {
		return "", err
	}
	if err := os.WriteFile(KeyFile(cfg.DataDir), []byte(key+"\n"), 0o600); err != nil {
		return "", err
	}
	return key, nil
}

// nodeReport is the node's housekeeping for GET /debug/stats.
func nodeReport(n *node.Node) api.NodeReport {
	r := api.NodeReport{Quarantined: []string{}, PendingCleanups: len(n.Engine.PendingCleanups())}
	for _, q := range n.Engine.Quarantined() {
		r.Quarantined = append(r.Quarantined, q.Sandbox+": "+q.Reason)
	}
	return r
}

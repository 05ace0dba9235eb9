package server

import (
	"bytes"
	"context"
	"crypto/tls"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/spore-run/spore/internal/api"
	"github.com/spore-run/spore/internal/apikey"
	"github.com/spore-run/spore/internal/audit"
	"github.com/spore-run/spore/internal/chunk"
	"github.com/spore-run/spore/internal/control"
	"github.com/spore-run/spore/internal/fleetauth"
	"github.com/spore-run/spore/internal/ids"
	"github.com/spore-run/spore/internal/metrics"
	"github.com/spore-run/spore/internal/node"
	"github.com/spore-run/spore/internal/nodeapi"
	"github.com/spore-run/spore/internal/nodeapi/local"
	"github.com/spore-run/spore/internal/nodeapi/rpc"
	"github.com/spore-run/spore/internal/proxy"
	"github.com/spore-run/spore/internal/secrets"
	"github.com/spore-run/spore/internal/snapsync"
	"github.com/spore-run/spore/internal/store"
	"github.com/spore-run/spore/internal/store/postgres"
	"github.com/spore-run/spore/internal/store/sqlite"
	"github.com/spore-run/spore/internal/teammetrics"
	"github.com/spore-run/spore/internal/volume/content"
)

// APIConfig configures `spore api`: a stateless API replica (REST API,
// proxy, lifecycle, placement) over a shared store and remote nodes.
type APIConfig struct {
	Listen string
	// Domain is the sandboxes' domain announced to SDKs (see api.Config).
	Domain string
	// DatabaseURL: postgres://... (or postgresql://), sqlite:///path, or
	// a file path (SQLite).
	DatabaseURL string
	// Fleet is how the replica and the nodes authenticate each other.
	Fleet FleetConfig
	// APIKey, when set, is accepted (stored hashed). Otherwise keys must
	// exist in the store, or DataDir is set and one is generated there
	// as `spore up` does.
	APIKey   string
	DataDir  string
	PoolSize int
	// BlobStore holds the files uploaded for template builds (see
	// blobconf.Open): the nodes' shared one, so that any replica can run
	// a build whose files another took. "" or "none": uploads refused.
	BlobStore string
	// SecretsKeyFile holds the key the secrets API seals values with
	// (secrets.LoadKey): every replica needs the same one. "": the key
	// in DataDir (generated there on first start), else no secrets API.
	SecretsKeyFile string
	// DrainGrace is how long a drain waits for the requests in flight to
	// a sandbox before it hibernates it (control.Config; 0: 10 s).
	DrainGrace time.Duration
	// AuditRetention, DefaultTeamQuotas, MetricsToken: see Config.
	AuditRetention    time.Duration
	DefaultTeamQuotas store.Quotas
	MetricsToken      string
	Logger            *slog.Logger
	Ready             func(addr, apiKey string)
}

// SecretsKeyFile is where a server keeps a generated secrets key.
func SecretsKeyFile(dataDir string) string { return filepath.Join(dataDir, "secrets-key") }

// secretsBox opens the secrets key: file when set, else the one in
// dataDir (generated on first start); neither: nil (the secrets API
// answers unavailable).
func secretsBox(file, dataDir string) (*secrets.Box, error) {
	var key []byte
	var err error
	switch {
	case file != "":
		key, err = secrets.LoadKey(file)
	case dataDir != "":
		key, err = secrets.EnsureKey(SecretsKeyFile(dataDir))
	default:
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	return secrets.NewBox(key)
}

// OpenStore opens the metadata store a database URL names.
func OpenStore(ctx context.Context, dbURL string) (store.Store, error) {
	switch {
	case strings.HasPrefix(dbURL, "postgres://"), strings.HasPrefix(dbURL, "postgresql://"):
		return postgres.Open(ctx, dbURL)
	case strings.HasPrefix(dbURL, "sqlite://"):
		return sqlite.Open(ctx, strings.TrimPrefix(dbURL, "sqlite://"))
	case dbURL == "":
		return nil, fmt.Errorf("no database URL")
	case strings.Contains(dbURL, "://"):
		return nil, fmt.Errorf("database URL %q: want postgres://, sqlite:// or a path", dbURL)
	default:
		return sqlite.Open(ctx, dbURL)
	}
}

// RunAPI serves an API replica until ctx ends. The node registry is the
// store's node rows (an RPC client per node address), refreshed every
// HeartbeatEvery and whenever a node registers.
func RunAPI(ctx context.Context, cfg APIConfig) error {
	if err := api.ValidateDomain(cfg.Domain); err != nil {
		return err
	}
	if cfg.DrainGrace < 0 || cfg.DrainGrace > nodeapi.MaxQuiesceGrace {
		return fmt.Errorf("--drain-grace %v: want 0 to %v", cfg.DrainGrace, nodeapi.MaxQuiesceGrace)
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.NewTextHandler(os.Stderr, nil))
	}
	log := cfg.Logger
	st, err := OpenStore(ctx, cfg.DatabaseURL)
	if err != nil {
		return err
	}
	defer st.Close()
	fleet, enroller, err := cfg.Fleet.replicaFleet(st, log)
	if err != nil {
		return err
	}
	if m := fleet.Member(); m != nil {
		if ca := enroller.CA; ca != nil {
			go fleetauth.RenewReplica(ctx, m, ca, log)
		}
	}
	var key string
	if cfg.APIKey != "" || cfg.DataDir != "" {
		if cfg.DataDir != "" {
			if err := os.MkdirAll(cfg.DataDir, 0o700); err != nil {
				return err
			}
		}
		if key, err = ensureKey(ctx, st, Config{APIKey: cfg.APIKey, DataDir: cfg.DataDir}, log); err != nil {
			return err
		}
	} else if n, err := st.CountAPIKeys(ctx); err != nil {
		return err
	} else if n == 0 {
		return fmt.Errorf("no API key: pass --api-key-file (or --data-dir to generate one)")
	}
	box, err := secretsBox(cfg.SecretsKeyFile, cfg.DataDir)
	if err != nil {
		return err
	}
	if box == nil {
		// Secrets in the store need the key to be of any use: a replica
		// started without it would answer 503 to every secret, and create
		// sandboxes whose credential injection is silently off.
		if page, _, err := st.ListSecrets(ctx, "", 1, ""); err != nil {
			return err
		} else if len(page) > 0 {
			return fmt.Errorf("the store holds secrets, but this replica has no secrets key: give it --secrets-key-file (every replica the same key: docs/deploy.md)")
		}
		log.Warn("no secrets key (--secrets-key-file or --data-dir): the secrets API answers 503")
	}
	reg := newRegistry(fleet, log)
	ready, err := reg.refresh(ctx, st)
	if err != nil {
		return err
	}
	aw := audit.NewWriter(st, log)
	defer aw.Close() // after the control plane's and the API's work (deferred below)
	go audit.Prune(ctx, st, audit.RetentionOr(cfg.AuditRetention), audit.PruneEvery, log)
	go teammetrics.Run(ctx, st, 0, nil, log) // E2B's team metrics: every replica samples
	ctl := control.New(control.Config{Store: store.Timed(st), Nodes: reg, Logger: log, Hop: reg.hop, Secrets: box, DrainGrace: cfg.DrainGrace, Audit: aw})
	defer ctl.Close()
	for _, id := range ready {
		ctl.Follow(id)
	}
	go func() {
		t := time.NewTicker(HeartbeatEvery)
		defer t.Stop()
		for {
			select {
			case <-ctx.Done():
				return
			case <-t.C:
			}
			ready, err := reg.refresh(ctx, st)
			if err != nil {
				log.Warn("node registry refresh", "err", err)
				continue
			}
			for _, id := range ready {
				ctl.Follow(id) // a no-op for a node already followed
			}
		}
	}()
	go ctl.Run(ctx, time.Second)
	go ctl.MonitorNodes(ctx, time.Second)
	go ctl.RunReconcile(ctx, control.ReconcileEvery)
	poolDone := make(chan struct{})
	go func() {
		defer close(poolDone)
		ctl.RunPool(ctx, control.PoolConfig{Templates: []string{node.TemplateBase, node.TemplateCodeInterpreter}, Size: cfg.PoolSize})
	}()
	defer func() { <-poolDone }()
	bs, err := newBuilds(ctx, ctl, store.Timed(st), cfg.BlobStore, ids.New('r'), log)
	if err != nil {
		return err
	}
	defer bs.Close()
	keys := apikey.NewChecker(st).WithLogger(log)
	px := proxy.New(ctl, keys.Check, log).WithHop(reg.hopTransport, fleet.Scheme())
	mreg := metrics.NewRegistry()
	mreg.MustRegister(metrics.NewProxy("replica", proxyFigures(px)))
	apiH := api.New(api.Config{Control: ctl, Store: st, Proxy: px, Metrics: mreg, Logger: log, Domain: cfg.Domain, Keys: keys, Builds: bs.Service, Blobs: bs.Blobs, Audit: aw,
		DefaultTeamQuotas: cfg.DefaultTeamQuotas, MetricsToken: cfg.MetricsToken, VolumeForward: volumeForwarder(st, reg, fleet, log)})
	mux := http.NewServeMux()
	register := registerHandler(ctl, st, reg, fleet, log)
	if fleet.IsSecure() {
		// Nodes register and enroll on the fleet listener (TLS; a
		// client certificate when they have one), never on the API's.
		fm := http.NewServeMux()
		fm.Handle("PUT "+RegisterPath+"{id}", register)
		fm.Handle("POST "+fleetauth.EnrollPath, enroller.Handler(fleet))
		fln, err := net.Listen("tcp", cfg.Fleet.Listen)
		if err != nil {
			return fmt.Errorf("--fleet-listen: %w", err)
		}
		fs := rpc.Server(fm, fleet.ServerTLS(tls.VerifyClientCertIfGiven))
		go fs.ServeTLS(fln, "", "")
		defer fs.Close()
		log.Info("fleet listener (TLS: node registration and enrollment)", "listen", fln.Addr().String(), "replica", fleet.Member().Identity().String())
	} else {
		mux.Handle("PUT "+RegisterPath+"{id}", register)
	}
	mux.Handle("/", apiH)
	return serveClients(ctx, cfg.Listen, mux, log, func(addr string) {
		bs.listening(addr)
		log.Info("spore api", "listen", addr, "nodes", len(ready))
		if cfg.Ready != nil {
			cfg.Ready(addr, key)
		}
	})
}

// serve runs an HTTP server on listen until ctx ends.
func serve(ctx context.Context, listen string, h http.Handler, log *slog.Logger, ready func(addr string)) error {
	ln, err := net.Listen("tcp", listen)
	if err != nil {
		return err
	}
	return serveOn(ctx, ln, rpc.Server(h, nil), log, ready) // HTTP/1.1 and h2c (the node RPC), no write timeout (streams)
}

// LameDuck bounds how long an API replica that is stopping keeps serving
// the client connections it has (serveClients).
const LameDuck = 5 * time.Second

// serveClients is serve for an API replica's clients, with a lame-duck
// phase when ctx ends: it stops accepting (a load balancer, or a client
// trying the next replica, goes elsewhere) but keeps serving the
// connections it has, every answer closing its connection (HTTP/2: a
// GOAWAY), until none is left or LameDuck has passed; then it shuts down
// as serve does. Without it the shutdown closed idle keep-alive
// connections at once, and a request a client sent on one just then was
// lost unanswered ("fetch failed", which a client cannot tell from a
// request that ran: TestRollingUpgrade). Clients close their idle
// connections themselves within seconds (undici: 4 s).
func serveClients(ctx context.Context, listen string, h http.Handler, log *slog.Logger, ready func(addr string)) error {
	ln, err := net.Listen("tcp", listen)
	if err != nil {
		return err
	}
	var closing atomic.Bool
	var open atomic.Int64
	hs := rpc.Server(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if closing.Load() {
			w.Header().Set("Connection", "close")
		}
		h.ServeHTTP(w, r)
	}), nil)
	hs.ConnState = func(_ net.Conn, st http.ConnState) {
		switch st {
		case http.StateNew:
			open.Add(1)
		case http.StateClosed, http.StateHijacked:
			open.Add(-1)
		}
	}
	stopping := func() {
		closing.Store(true)
		ln.Close()
		t0 := time.Now()
		for open.Load() > 0 && time.Since(t0) < LameDuck {
			time.Sleep(20 * time.Millisecond)
		}
		log.Info("stopping: no longer accepting; the connections left close after their answers", "left", open.Load(), "took", time.Since(t0).Round(time.Millisecond))
	}
	return serveOnThen(ctx, ln, hs, log, ready, stopping)
}

// serveOn runs hs on ln until ctx ends: over TLS when hs has a TLS
// configuration.
func serveOn(ctx context.Context, ln net.Listener, hs *http.Server, log *slog.Logger, ready func(addr string)) error {
	return serveOnThen(ctx, ln, hs, log, ready, nil)
}

// serveOnThen is serveOn that runs stopping (when set) once ctx ends,
// before the shutdown.
func serveOnThen(ctx context.Context, ln net.Listener, hs *http.Server, log *slog.Logger, ready func(addr string), stopping func()) error {
	errc := make(chan error, 1)
	go func() {
		if hs.TLSConfig != nil {
			errc <- hs.ServeTLS(ln, "", "")
		} else {
			errc <- hs.Serve(ln)
		}
	}()
	ready(ln.Addr().String())
	select {
	case <-ctx.Done():
		if stopping != nil {
			stopping()
		}
	case err := <-errc:
		if !errors.Is(err, http.ErrServerClosed) {
			return err
		}
	}
	sctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	hs.Shutdown(sctx)
	return nil
}

// NodeConfig configures `spore node`: a node agent. Host holds the
// node's own settings (data dir, runsc, rootfs, networks, reserve, as
// for `spore up`); its Listen is where the node RPC and the node's proxy
// answer.
type NodeConfig struct {
	Host   Config
	APIURL string
	// Fleet is how the node and the replicas authenticate each other
	// (FleetConfig: a node uses CAFile, JoinToken, or Insecure and Token).
	Fleet         FleetConfig
	AdvertiseAddr string // host:port control planes reach Listen at
	Labels        map[string]string
	NodeID        string // "": the one kept in <data>/node-id, minted on first start
	// MetricsListen, when set, serves the host's Prometheus metrics
	// (GET /metrics, docs/metrics.md) there to scrapes that present
	// MetricsToken as their bearer.
	MetricsListen string
	MetricsToken  string
}

// NodeIDFile keeps a node agent's ID across restarts.
func NodeIDFile(dataDir string) string { return filepath.Join(dataDir, "node-id") }

func nodeID(cfg NodeConfig) (string, error) {
	if cfg.NodeID != "" {
		return cfg.NodeID, ids.Validate("node ID", cfg.NodeID)
	}
	if b, err := os.ReadFile(NodeIDFile(cfg.Host.DataDir)); err == nil {
		id := strings.TrimSpace(string(b))
		return id, ids.Validate("node ID in "+NodeIDFile(cfg.Host.DataDir), id)
	}
	id := ids.New('n')
	return id, os.WriteFile(NodeIDFile(cfg.Host.DataDir), []byte(id+"\n"), 0o600)
}

// RunNode runs a node agent until ctx ends: the node (engine, networks,
// templates), its contract over Connect-RPC and its proxy on Listen (both
// to API replicas of the fleet only: their certificates, or in an
// insecure fleet the cluster token; nothing there answers anyone else),
// its chunks to its peers, and a registration with the API every
// HeartbeatEvery.
func RunNode(ctx context.Context, cfg NodeConfig) error {
	hc := cfg.Host
	if hc.Logger == nil {
		hc.Logger = slog.New(slog.NewTextHandler(os.Stderr, nil))
	}
	log := hc.Logger
	if _, _, err := net.SplitHostPort(cfg.AdvertiseAddr); err != nil {
		return fmt.Errorf("--advertise-addr %q: want host:port: %w", cfg.AdvertiseAddr, err)
	}
	for _, u := range apiURLs(cfg.APIURL) {
		apiURL, err := url.Parse(u)
		if err != nil || (apiURL.Scheme != "http" && apiURL.Scheme != "https") || apiURL.Host == "" {
			return fmt.Errorf("--api-url %q: want http(s)://host:port (comma-separated for several replicas)", u)
		}
	}
	if err := os.MkdirAll(hc.DataDir, 0o700); err != nil {
		return err
	}
	id, err := nodeID(cfg)
	if err != nil {
		return err
	}
	fleet, err := cfg.Fleet.nodeFleet(ctx, hc.DataDir, id, cfg.AdvertiseAddr, apiURLs(cfg.APIURL), log)
	if err != nil {
		return err
	}
	hc.peerClient, hc.peerScheme = fleet.Client(fleetauth.IsRole(fleetauth.RoleNode), 0), fleet.Scheme()
	n, err := openNode(ctx, hc)
	if err != nil {
		return err
	}
	defer n.Close()
	ln0 := local.New(n.Engine, local.Config{ID: id, Addr: cfg.AdvertiseAddr, Labels: cfg.Labels, Reserved: reserveOf(hc.MemoryReserve), Overcommit: hc.Overcommit,
		Sync: n.Sync, CPUFeatures: n.CPUFeatures, Images: n, PeerScheme: fleet.Scheme()})
	var reg *prometheus.Registry
	if cfg.MetricsListen != "" {
		if cfg.MetricsToken == "" {
			return fmt.Errorf("--metrics-listen needs --metrics-token-file: a scrape presents that token")
		}
		reg = metrics.NewRegistry()
		reg.MustRegister(metrics.NewHost(func(ctx context.Context) metrics.HostFigures { return hostFigures(ctx, n) }))
	}
	h, err := NodeHandler(ctx, ln0, fleet, n.Sync, n, reg, log)
	if err != nil {
		return err
	}
	if reg != nil {
		serve, err := listenMetrics(ctx, cfg.MetricsListen, MetricsHandler(reg, cfg.MetricsToken, log), log)
		if err != nil {
			return err
		}
		go serve()
	}
	return serveFleet(ctx, hc.Listen, h, fleet, log, func(addr string) {
		log.Info("spore node", "node_id", id, "listen", addr, "advertise", cfg.AdvertiseAddr, "api", cfg.APIURL,
			"sandboxes", len(n.Engine.List(ctx)), "fleet_tls", fleet.IsSecure())
		go heartbeat(ctx, cfg, id, ln0, fleet, log)
		if hc.Ready != nil {
			hc.Ready(addr, "")
		}
	})
}

// NodeHandler is what a node agent serves, each part to whom it is for:
// (its proxy's figures registered with reg, when given)
// the node RPC and, for requests naming a sandbox (E2b-Sandbox-Id), the
// node's proxy to that sandbox's local address, to API replicas; its
// cached chunks and its snapshots' manifests (sync, when given) to peer
// nodes and replicas. Callers are fleet members by their certificates
// (mutual TLS), or, in an insecure fleet, holders of the cluster token
// (for the proxy only in proxy.ClusterTokenHeader: its Authorization
// belongs to the sandbox). Anything else is 401. The proxy ends its
// streams to an instance when it goes, until ctx ends (see nodeResolver);
// the node's Quiesce waits for what it forwards (gatedNode).
// VolumeRooter opens a volume's directory on a node (node.Node.VolumeRoot).
type VolumeRooter interface {
	VolumeRoot(ctx context.Context, volumeID string, size int64) (*os.Root, error)
}

func NodeHandler(ctx context.Context, n nodeapi.Node, fleet *fleetauth.Fleet, sync *snapsync.Syncer, vols VolumeRooter, reg prometheus.Registerer, log *slog.Logger) (http.Handler, error) {
	nodePx := proxy.New(newNodeResolver(ctx, n, log), func(context.Context, string) bool { return false }, log).AsNodeSide()
	if reg != nil {
		reg.MustRegister(metrics.NewProxy("node", proxyFigures(nodePx)))
	}
	rpcPath, rpcH, err := rpc.NewFleetHandler(gatedNode{n, nodePx}, fleet)
	if err != nil {
		return nil, err
	}
	replicas := fleetauth.Roles(fleetauth.RoleReplica)
	members := fleetauth.Roles(fleetauth.RoleNode, fleetauth.RoleReplica)
	px := fleet.Guard(nodePx, true, replicas)
	var chunks, manifests http.Handler
	if sync != nil && sync.Cache() != nil {
		ch, err := chunk.NewHandler(sync.Cache(), log)
		if err != nil {
			return nil, err
		}
		chunks, manifests = fleet.Guard(ch, false, members), fleet.Guard(sync.ManifestHandler(), false, members)
	}
	refuse := fleet.Guard(http.NotFoundHandler(), false, members)
	var volumes http.Handler = refuse
	if vols != nil {
		// A volume's files, for a replica that checked the volume's token.
		volumes = fleet.Guard(content.Handler(func(r *http.Request, id string) (*os.Root, error) {
			size, err := strconv.ParseInt(r.Header.Get(content.SizeHeader), 10, 64)
			if err != nil {
				return nil, content.StatusError(http.StatusBadRequest, "no volume size")
			}
			return vols.VolumeRoot(r.Context(), id, size)
		}), true, replicas)
	}
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		switch {
		case r.Header.Get("E2b-Sandbox-Id") != "":
			px.ServeHTTP(w, r) // a request naming a sandbox goes to it, whatever its path
		case strings.HasPrefix(r.URL.Path, "/volumecontent/"):
			volumes.ServeHTTP(w, r)
		case strings.HasPrefix(r.URL.Path, rpcPath):
			rpcH.ServeHTTP(w, r) // checks the caller itself (Connect's Unauthenticated)
		case chunks != nil && strings.HasPrefix(r.URL.Path, chunk.PeerPath):
			chunks.ServeHTTP(w, r)
		case manifests != nil && strings.HasPrefix(r.URL.Path, snapsync.ManifestPath):
			manifests.ServeHTTP(w, r)
		default:
			refuse.ServeHTTP(w, r)
		}
	}), nil
}

// serveFleet is serve for a member's listener: TLS that requires a fleet
// certificate, or cleartext (h2c) when the fleet is insecure.
func serveFleet(ctx context.Context, listen string, h http.Handler, fleet *fleetauth.Fleet, log *slog.Logger, ready func(addr string)) error {
	if !fleet.IsSecure() {
		return serve(ctx, listen, h, log, ready)
	}
	ln, err := net.Listen("tcp", listen)
	if err != nil {
		return err
	}
	return serveOn(ctx, ln, rpc.Server(h, fleet.ServerTLS(tls.RequireAndVerifyClientCert)), log, ready)
}

// apiURLs splits --api-url: one URL, or several (API replicas without a
// load balancer in front) separated by commas.
func apiURLs(s string) []string {
	var out []string
	for _, u := range strings.Split(s, ",") {
		if u = strings.TrimSpace(u); u != "" {
			out = append(out, u)
		}
	}
	if len(out) == 0 {
		out = []string{""}
	}
	return out
}

// heartbeat registers the node with the API every HeartbeatEvery until
// ctx ends; the first successful registration of this process says
// Joined (the API reconciles the node then).
func heartbeat(ctx context.Context, cfg NodeConfig, id string, n nodeapi.Node, fleet *fleetauth.Fleet, log *slog.Logger) {
	c := fleet.Client(fleetauth.IsRole(fleetauth.RoleReplica), 90*time.Second)
	urls := apiURLs(cfg.APIURL)
	cur := 0 // the replica that answered last
	joined := true
	failing := false
	for {
		// Each round tries the replicas in turn from the last one that
		// answered: one replica's death costs no heartbeat.
		var err error
		for i := range urls {
			k := (cur + i) % len(urls)
			if err = register(ctx, c, strings.TrimRight(urls[k], "/")+RegisterPath+id, cfg, n, joined); err == nil || ctx.Err() != nil {
				cur = k
				break
			}
		}
		switch {
		case err == nil:
			if joined || failing {
				log.Info("registered with the API", "node_id", id, "api", cfg.APIURL)
			}
			joined, failing = false, false
		case ctx.Err() != nil:
			return
		case !failing:
			log.Warn("register with the API (retrying every 2 s)", "node_id", id, "api", cfg.APIURL, "err", err)
			failing = true
		}
		select {
		case <-ctx.Done():
			return
		case <-time.After(HeartbeatEvery):
		}
	}
}

func register(ctx context.Context, c *http.Client, target string, cfg NodeConfig, n nodeapi.Node, joined bool) error {
	info, err := n.Info(ctx)
	if err != nil {
		return err
	}
	body, _ := json.Marshal(Registration{Info: info, Addr: cfg.AdvertiseAddr, Joined: joined})
	req, err := http.NewRequestWithContext(ctx, http.MethodPut, target, bytes.NewReader(body))
	if err != nil {
		return err
	}
	req.Header.Set("Content-Type", "application/json")
	resp, err := c.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusNoContent {
		var b [512]byte
		k, _ := resp.Body.Read(b[:])
		return fmt.Errorf("%s: %s", resp.Status, strings.TrimSpace(string(b[:k])))
	}
	return nil
}

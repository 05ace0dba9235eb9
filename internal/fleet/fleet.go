// Package fleet starts a whole Spore fleet on one machine and removes it
// again (`spore fleet up` / `spore fleet down`): a throwaway PostgreSQL
// cluster, N node agents each in a network namespace of its own with its
// own data directory, and M API replicas. It is for trying the fleet and
// for the fleet tests; production runs the same processes on many hosts
// (docs/deploy.md).
//
// Everything `up` makes is recorded in the fleet directory's state file
// (StateFile) before or right after it is made, so that `down` removes
// exactly that: the processes by PID and start time, the namespaces, the
// links, the firewall table, the directory. Nothing beyond the machine
// reaches the fleet: PostgreSQL listens on 127.0.0.1, the nodes on their
// private links, and the API replicas' wildcard listeners are firewalled
// to loopback and the nodes' links.
package fleet

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/spore-run/spore/internal/errdefs"
	"github.com/spore-run/spore/internal/fleetauth"
	"github.com/spore-run/spore/internal/ids"
	"github.com/spore-run/spore/internal/pgcluster"
	"github.com/spore-run/spore/internal/s3server"
	"github.com/spore-run/spore/internal/secrets"
)

// Config is what `spore fleet up` starts.
type Config struct {
	Dir      string // the fleet's directory (must not exist, or be empty)
	Nodes    int    // node agents, 1..
	Replicas int    // API replicas, 1..
	// BasePort: replica i (0-based) serves on BasePort+i.
	BasePort int
	// Prefix names the fleet's namespaces (<Prefix>f<K>) and is the start
	// of each node's network prefix; 1-2 lowercase letters.
	Prefix string
	// Executable is the spore binary (default: the running one).
	Executable string
	// NodeArgs are extra flags for every `spore node` (--rootfs-dir,
	// --runsc, ...); APIArgs for every `spore api`.
	NodeArgs, APIArgs []string
	// BlobStore is every node's --blob-store, where snapshots are shared.
	// Default (""): an S3 server the fleet starts (see s3.go). Otherwise
	// "none", a directory all the nodes of this host see, or an s3:// URL;
	// "{host}" in it becomes the node's gateway address, where a server on
	// the host answers it (an S3 server listening on every address:
	// s3://bucket?endpoint=http://{host}:9000).
	BlobStore string
	// S3Server is the versitygw binary of the default blob store (default:
	// $SPORE_VERSITYGW, else the one `make s3-tools` built).
	S3Server string
	// NodePort is where each node agent listens on its own link.
	NodePort int
	// ReadyTimeout bounds the wait for every process to answer (node
	// agents build their templates on first start).
	ReadyTimeout time.Duration
	Logger       *slog.Logger
}

// Defaults.
const (
	DefaultBasePort = 3100
	DefaultPrefix   = "s"
	DefaultNodePort = 7070
)

var prefixRE = regexp.MustCompile(`^[a-z]{1,2}$`)

func (c *Config) validate() error {
	if c.Dir == "" {
		return errdefs.Invalidf("fleet: no directory")
	}
	abs, err := filepath.Abs(c.Dir)
	if err != nil {
		return err
	}
	c.Dir = abs
	if c.Prefix == "" {
		c.Prefix = DefaultPrefix
	}
	if !prefixRE.MatchString(c.Prefix) {
		return errdefs.Invalidf("fleet: prefix %q: want 1-2 lowercase letters", c.Prefix)
	}
	// A node's network prefix (<Prefix>f<K>) names its sandboxes'
	// namespaces and may have at most 4 characters.
	maxN := maxNodes
	if len(c.Prefix) == 2 {
		maxN = 9
	} else {
		maxN = 99
	}
	if c.Nodes < 1 || c.Nodes > maxN {
		return errdefs.Invalidf("fleet: --nodes %d: want 1-%d (with prefix %q)", c.Nodes, maxN, c.Prefix)
	}
	if c.Replicas < 1 || c.Replicas > 20 {
		return errdefs.Invalidf("fleet: --replicas %d: want 1-20", c.Replicas)
	}
	if c.BasePort == 0 {
		c.BasePort = DefaultBasePort
	}
	if c.BasePort < 1024 || c.BasePort+FleetPortOffset+c.Replicas > 65535 {
		return errdefs.Invalidf("fleet: --base-port %d: want 1024-%d", c.BasePort, 65535-FleetPortOffset-c.Replicas)
	}
	if c.NodePort == 0 {
		c.NodePort = DefaultNodePort
	}
	if c.Executable == "" {
		if c.Executable, err = os.Executable(); err != nil {
			return err
		}
	}
	if c.ReadyTimeout == 0 {
		c.ReadyTimeout = 10 * time.Minute
	}
	if c.Logger == nil {
		c.Logger = slog.New(slog.DiscardHandler)
	}
	return nil
}

// Names of node k's (1-based) network objects.
func netnsName(prefix string, k int) string { return prefix + "f" + strconv.Itoa(k) }
func vethName(prefix string, k int) string  { return prefix + "f" + strconv.Itoa(k) + "h" }
func tableName(prefix string) string        { return "spore-fleet-" + prefix }

// Up starts a fleet as cfg says and returns its state. A fleet already in
// cfg.Dir is errdefs.ErrAlreadyExists. When a step fails, what was made
// is removed again (as by Down) and the step's error returned.
func Up(ctx context.Context, cfg Config) (st *State, err error) {
	if err := cfg.validate(); err != nil {
		return nil, err
	}
	unlock, err := lock(cfg.Dir)
	if err != nil {
		return nil, err
	}
	defer unlock()
	if old, err := Load(cfg.Dir); err == nil {
		return nil, fmt.Errorf("a fleet is up in %s (started %s; %d nodes): `spore fleet down --dir %s` first: %w",
			cfg.Dir, old.Started.Format(time.RFC3339), len(old.Nodes), cfg.Dir, errdefs.ErrAlreadyExists)
	} else if !errdefs.IsNotFound(err) {
		return nil, err
	}
	if ents, err := os.ReadDir(cfg.Dir); err == nil && len(ents) > 0 {
		return nil, fmt.Errorf("%s exists and is not empty (not a fleet's): choose another --dir: %w", cfg.Dir, errdefs.ErrAlreadyExists)
	}
	var nsNames, veths []string
	for k := 1; k <= cfg.Nodes; k++ {
		nsNames, veths = append(nsNames, netnsName(cfg.Prefix, k)), append(veths, vethName(cfg.Prefix, k))
	}
	if err := checkNetFree(nsNames, veths); err != nil {
		return nil, err
	}
	var ports []uint16
	for i := 0; i < cfg.Replicas; i++ {
		for _, port := range []int{cfg.BasePort + i, fleetPort(cfg, i)} {
			ln, err := net.Listen("tcp", ":"+strconv.Itoa(port))
			if err != nil {
				return nil, fmt.Errorf("port %d is taken (replica %d's API or fleet listener; choose --base-port): %w", port, i, errdefs.ErrAlreadyExists)
			}
			ln.Close()
			ports = append(ports, uint16(port))
		}
	}
	if cfg.BlobStore == "" && cfg.S3Server == "" {
		if cfg.S3Server, err = s3server.Bin(); err != nil {
			return nil, fmt.Errorf("the fleet's blob store: %w (or give it another --blob-store: a directory, an s3:// URL, or none)", err)
		}
	}
	if exists, err := tableExists(tableName(cfg.Prefix)); err != nil {
		return nil, fmt.Errorf("nftables: %w", err)
	} else if exists {
		return nil, fmt.Errorf("nftables table inet %s exists (another fleet with prefix %q is up): %w", tableName(cfg.Prefix), cfg.Prefix, errdefs.ErrAlreadyExists)
	}

	// From here on everything made is recorded first, and undone on error.
	// The directory lets the postgres user through to its own cluster.
	if err := os.MkdirAll(cfg.Dir, 0o711); err != nil {
		return nil, err
	}
	os.Chmod(cfg.Dir, 0o711)
	st = &State{Version: stateVersion, Dir: cfg.Dir, Prefix: cfg.Prefix, Started: time.Now().UTC(), Executable: cfg.Executable,
		Dirs: []string{cfg.Dir}, KeyFile: filepath.Join(cfg.Dir, "api-key"), CADir: filepath.Join(cfg.Dir, "fleet-ca"),
		MetricsTokenFile: filepath.Join(cfg.Dir, "metrics-token")}
	if err := st.save(); err != nil {
		os.RemoveAll(cfg.Dir)
		return nil, err
	}
	defer func() {
		if err != nil {
			cfg.Logger.Warn("fleet up failed: removing what it made", "err", err)
			if derr := down(context.WithoutCancel(ctx), st, cfg.Logger); derr != nil {
				err = fmt.Errorf("%w (and removing what was made: %v; the state is in %s: `spore fleet down --dir %s`)", err, derr, statePath(cfg.Dir), cfg.Dir)
			}
			st = nil
		}
	}()
	key := "spore_" + randHex(20)
	if err := os.WriteFile(st.KeyFile, []byte(key+"\n"), 0o600); err != nil {
		return st, err
	}
	if err := os.WriteFile(st.MetricsTokenFile, []byte(randHex(24)+"\n"), 0o600); err != nil {
		return st, err
	}
	// The fleet's CA: replicas and nodes authenticate each other with its
	// certificates (the nodes enroll with its join token at their start).
	if err := fleetauth.InitCA(st.CADir); err != nil {
		return st, err
	}
	// One secrets key for every replica (each would otherwise generate
	// its own, and open none of the others' secrets).
	if _, err := secrets.EnsureKey(filepath.Join(cfg.Dir, "secrets-key")); err != nil {
		return st, err
	}
	for _, d := range []string{"logs", "nodes", "api"} {
		if err := os.MkdirAll(filepath.Join(cfg.Dir, d), 0o700); err != nil {
			return st, err
		}
	}
	if st.IPForwardWas, err = enableForwarding(); err != nil {
		return st, err
	}
	if err := st.save(); err != nil {
		return st, err
	}
	if err := startPostgres(ctx, cfg, st); err != nil {
		return st, fmt.Errorf("PostgreSQL: %w", err)
	}
	if cfg.BlobStore == "" {
		if err := prepareS3(cfg, st); err != nil {
			return st, err
		}
		cfg.BlobStore = st.S3.nodeSpec()
		ports = append(ports, uint16(st.S3.Port))
	}

	st.NftTables = append(st.NftTables, NftName{Family: "inet", Name: tableName(cfg.Prefix)})
	if err := st.save(); err != nil {
		return st, err
	}
	if err := hostTable(tableName(cfg.Prefix), veths, ports); err != nil {
		return st, err
	}
	for k := 1; k <= cfg.Nodes; k++ {
		if err := makeNodeNet(cfg, st, k); err != nil {
			return st, fmt.Errorf("node %d network: %w", k, err)
		}
	}
	if st.S3 != nil {
		if err := startS3(ctx, cfg, st); err != nil {
			return st, err
		}
	}
	for i := 0; i < cfg.Replicas; i++ {
		if err := startAPI(cfg, st, i); err != nil {
			return st, err
		}
	}
	for i := range st.Processes {
		if p := st.Processes[i]; p.Role == "api" {
			if err := waitHTTP(ctx, p, "http://"+strings.TrimPrefix(st.APIURLs[apiIndex(p.Name)], "http://")+"/health", "", cfg.ReadyTimeout); err != nil {
				return st, err
			}
		}
	}
	for k := 1; k <= cfg.Nodes; k++ {
		if err := startNode(cfg, st, k); err != nil {
			return st, err
		}
	}
	if err := waitNodes(ctx, st, key, cfg.ReadyTimeout); err != nil {
		return st, err
	}
	st.Complete = true
	return st, st.save()
}

// fleetPort is replica i's fleet listener (TLS: the nodes register and
// enroll there), FleetPortOffset above its API port.
func fleetPort(cfg Config, i int) int { return cfg.BasePort + FleetPortOffset + i }

// FleetPortOffset puts the replicas' fleet listeners above their API ports.
const FleetPortOffset = 100

func randHex(n int) string {
	b := make([]byte, n)
	rand.Read(b)
	return hex.EncodeToString(b)
}

func apiIndex(name string) int {
	i, _ := strconv.Atoi(strings.TrimPrefix(name, "api-"))
	return i
}

// startPostgres makes and starts the fleet's metadata database.
func startPostgres(ctx context.Context, cfg Config, st *State) error {
	bin, err := pgcluster.Bin()
	if err != nil {
		return err
	}
	port, err := pgcluster.FreePort()
	if err != nil {
		return err
	}
	c := pgcluster.Cluster{Bin: bin, Dir: filepath.Join(cfg.Dir, "postgres"), Port: port}
	st.Postgres = &Postgres{Bin: bin, Dir: c.Dir, Port: port, DSN: c.DSN("spore")}
	if err := st.save(); err != nil {
		return err
	}
	if err := c.Init(ctx); err != nil {
		return err
	}
	p, err := start(c.ServerCmd(), c.LogPath(), "")
	if err != nil {
		return err
	}
	p.Role, p.Name = "postgres", "postgres"
	st.Processes = append(st.Processes, p)
	if err := st.save(); err != nil {
		return err
	}
	rctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	if err := c.WaitReady(rctx, p.gone(rctx)); err != nil {
		return err
	}
	return c.CreateDB(ctx, "spore")
}

// makeNodeNet makes node k's namespace and link, recording each first.
func makeNodeNet(cfg Config, st *State, k int) error {
	ns, veth := netnsName(cfg.Prefix, k), vethName(cfg.Prefix, k)
	host, addr := nodeAddrs(k)
	st.Netns = append(st.Netns, ns)
	if err := st.save(); err != nil {
		return err
	}
	if err := createNetns(ns); err != nil {
		return err
	}
	st.Veths = append(st.Veths, veth)
	if err := st.save(); err != nil {
		return err
	}
	if err := linkNode(ns, veth, host, addr); err != nil {
		return err
	}
	dataDir := filepath.Join(cfg.Dir, "nodes", strconv.Itoa(k))
	// Node k knows every replica (at its gateway), replica (k-1) mod M
	// first: the heartbeats spread, and survive a replica's death.
	var urls []string
	for i := 0; i < cfg.Replicas; i++ {
		urls = append(urls, fmt.Sprintf("https://%s:%d", host, fleetPort(cfg, (k-1+i)%cfg.Replicas)))
	}
	apiURL := strings.Join(urls, ",")
	n := Node{Index: k, ID: ids.New('n'), Netns: ns, Veth: veth, HostAddr: host.String(), Addr: addr.String(),
		Listen: net.JoinHostPort(addr.String(), strconv.Itoa(cfg.NodePort)), DataDir: dataDir,
		NetPrefix: ns, APIURL: apiURL, Metrics: net.JoinHostPort(addr.String(), strconv.Itoa(cfg.NodePort+1))}
	blobs := cfg.BlobStore
	hostArgs := []string{"--data-dir", dataDir, "--net-prefix", n.NetPrefix, "--cgroup-parent", "/spore-fleet-" + ns,
		"--blob-store", strings.ReplaceAll(blobs, "{host}", host.String())}
	n.PurgeArgs = append(append([]string{}, hostArgs...), cfg.NodeArgs...)
	st.Nodes = append(st.Nodes, n)
	return st.save()
}

// startAPI starts replica i on 0.0.0.0:BasePort+i (the host table admits
// loopback and the nodes' links only).
func startAPI(cfg Config, st *State, i int) error {
	port := cfg.BasePort + i
	dataDir := filepath.Join(cfg.Dir, "api", strconv.Itoa(i))
	caCert, caKey, join := fleetauth.CAFiles(st.CADir)
	args := []string{"api", "--listen", "0.0.0.0:" + strconv.Itoa(port), "--database-url", st.Postgres.DSN,
		"--fleet-ca", caCert, "--fleet-ca-key", caKey, "--join-token-file", join,
		"--fleet-listen", "0.0.0.0:" + strconv.Itoa(fleetPort(cfg, i)), "--fleet-name", fmt.Sprintf("api-%d", i),
		"--api-key-file", st.KeyFile, "--data-dir", dataDir,
		"--secrets-key-file", filepath.Join(cfg.Dir, "secrets-key")}
	if st.MetricsTokenFile != "" {
		args = append(args, "--metrics-token-file", st.MetricsTokenFile)
	}
	if cfg.BlobStore != "" && cfg.BlobStore != "none" {
		// The nodes' store, reached from the host: files uploaded for a
		// template build are read by whichever replica runs it.
		args = append(args, "--blob-store", strings.ReplaceAll(cfg.BlobStore, "{host}", "127.0.0.1"))
	}
	args = append(args, cfg.APIArgs...)
	p, err := start(exec.Command(cfg.Executable, args...), filepath.Join(cfg.Dir, "logs", fmt.Sprintf("api-%d.log", i)), "")
	if err != nil {
		return err
	}
	p.Role, p.Name = "api", fmt.Sprintf("api-%d", i)
	st.Processes = append(st.Processes, p)
	st.APIURLs = append(st.APIURLs, fmt.Sprintf("http://127.0.0.1:%d", port))
	return st.save()
}

// NodeArgs are the flags the fleet gives node n's agent.
func (n Node) args(st *State) []string {
	caCert, _, join := fleetauth.CAFiles(st.CADir)
	args := []string{"node", "--listen", n.Listen, "--advertise-addr", n.Listen, "--api-url", n.APIURL,
		"--fleet-ca", caCert, "--join-token-file", join, "--node-id", n.ID, "--labels", "fleet=" + st.Prefix + ",index=" + strconv.Itoa(n.Index)}
	if n.Metrics != "" && st.MetricsTokenFile != "" {
		args = append(args, "--metrics-listen", n.Metrics, "--metrics-token-file", st.MetricsTokenFile)
	}
	return append(args, n.PurgeArgs...)
}

// startNode starts node k's agent inside its namespace.
func startNode(cfg Config, st *State, k int) error {
	n := st.Nodes[k-1]
	p, err := start(exec.Command(cfg.Executable, n.args(st)...), filepath.Join(cfg.Dir, "logs", fmt.Sprintf("node-%d.log", k)), n.Netns)
	if err != nil {
		return err
	}
	p.Role, p.Name = "node", fmt.Sprintf("node-%d", k)
	st.Processes = append(st.Processes, p)
	return st.save()
}

// RestartProc starts again a fleet process that is no longer running
// (tests: after a kill -9, or to restart everything), with the same
// command line, and records its new identity.
func RestartProc(ctx context.Context, dir, name string) (Proc, error) {
	unlock, err := lock(dir)
	if err != nil {
		return Proc{}, err
	}
	defer unlock()
	st, err := Load(dir)
	if err != nil {
		return Proc{}, err
	}
	for i, p := range st.Processes {
		if p.Name != name {
			continue
		}
		if p.alive() {
			return Proc{}, fmt.Errorf("%s (pid %d) still runs: %w", name, p.PID, errdefs.ErrConflict)
		}
		cmd := exec.Command(p.Args[0], p.Args[1:]...)
		switch p.Role {
		case "postgres":
			cmd = pgcluster.Cluster{Bin: st.Postgres.Bin, Dir: st.Postgres.Dir, Port: st.Postgres.Port}.ServerCmd()
		case "s3":
			srv, err := st.S3.server()
			if err != nil {
				return Proc{}, err
			}
			cmd = srv.Command() // its keys are in its environment, not in Args
		}
		np, err := start(cmd, p.Log, p.Netns)
		if err != nil {
			return Proc{}, err
		}
		np.Role, np.Name = p.Role, p.Name
		st.Processes[i] = np
		return np, st.save()
	}
	return Proc{}, fmt.Errorf("no process %q in the fleet in %s: %w", name, dir, errdefs.ErrNotFound)
}

// Stop stops one fleet process (SIGTERM, SIGKILL after grace; kill: SIGKILL
// at once), leaving it recorded so that RestartProc can start it again.
func Stop(ctx context.Context, dir, name string, kill bool) error {
	st, err := Load(dir)
	if err != nil {
		return err
	}
	for _, p := range st.Processes {
		if p.Name == name {
			if kill {
				return p.stop(ctx, syscall.SIGKILL, 0)
			}
			return p.stop(ctx, stopSignal(p.Role), 30*time.Second)
		}
	}
	return fmt.Errorf("no process %q in the fleet in %s: %w", name, dir, errdefs.ErrNotFound)
}

// waitHTTP waits until url answers 2xx (with the API key when set), or p
// dies (its log's tail says why), or timeout.
func waitHTTP(ctx context.Context, p Proc, url, key string, timeout time.Duration) error {
	deadline := time.Now().Add(timeout)
	c := &http.Client{Timeout: 5 * time.Second}
	for {
		req, _ := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
		if key != "" {
			req.Header.Set("X-API-KEY", key)
		}
		resp, err := c.Do(req)
		if err == nil {
			resp.Body.Close()
			if resp.StatusCode/100 == 2 {
				return nil
			}
		}
		if !p.alive() {
			return fmt.Errorf("%s exited at start; its log %s ends with:\n%s", p.Name, p.Log, tail(p.Log, 3000))
		}
		if time.Now().After(deadline) || ctx.Err() != nil {
			return fmt.Errorf("%s did not answer %s within %s (last: %v); its log %s ends with:\n%s", p.Name, url, timeout, err, p.Log, tail(p.Log, 3000))
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// NodeView is a node as GET /nodes reports it.
type NodeView struct {
	NodeID         string `json:"nodeID"`
	State          string `json:"state"`
	Addr           string `json:"addr"`
	HeartbeatAgeMs int64  `json:"heartbeatAgeMs"`
}

// waitNodes waits until every node agent has registered since the call
// and is ready (reconciled), as the first replica sees it: a row may
// still say "ready" from before a restart.
func waitNodes(ctx context.Context, st *State, key string, timeout time.Duration) error {
	start := time.Now()
	deadline := start.Add(timeout)
	c := &http.Client{Timeout: 5 * time.Second}
	want := map[string]bool{}
	for _, n := range st.Nodes {
		want[n.ID] = true
	}
	var last string
	for {
		req, _ := http.NewRequestWithContext(ctx, http.MethodGet, st.APIURLs[0]+"/nodes", nil)
		req.Header.Set("X-API-KEY", key)
		if resp, err := c.Do(req); err == nil {
			var nodes []NodeView
			json.NewDecoder(resp.Body).Decode(&nodes)
			resp.Body.Close()
			ready := 0
			for _, n := range nodes {
				if want[n.NodeID] && n.State == "ready" && time.Now().Add(-time.Duration(n.HeartbeatAgeMs)*time.Millisecond).After(start) {
					ready++
				}
			}
			if ready == len(want) {
				return nil
			}
			last = fmt.Sprintf("%d of %d nodes ready", ready, len(want))
		} else {
			last = err.Error()
		}
		for _, p := range st.Processes {
			if p.Role == "node" && !p.alive() {
				return fmt.Errorf("%s exited at start; its log %s ends with:\n%s", p.Name, p.Log, tail(p.Log, 3000))
			}
		}
		if time.Now().After(deadline) || ctx.Err() != nil {
			return fmt.Errorf("the nodes did not all register within %s (%s)", timeout, last)
		}
		time.Sleep(200 * time.Millisecond)
	}
}

func tail(path string, n int) string {
	b, _ := os.ReadFile(path)
	if len(b) > n {
		b = b[len(b)-n:]
	}
	return string(b)
}

// Down stops and removes the fleet in dir: every process it recorded
// (API replicas, node agents, PostgreSQL), every sandbox the nodes left,
// the namespaces, links and firewall table, and the directory.
// errdefs.ErrNotFound when there is no fleet there.
func Down(ctx context.Context, dir string, log *slog.Logger) error {
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	abs, err := filepath.Abs(dir)
	if err != nil {
		return err
	}
	unlock, err := lock(abs)
	if err != nil {
		return err
	}
	defer unlock()
	st, err := Load(abs)
	if err != nil {
		return err
	}
	return down(ctx, st, log)
}

// down does Down's work under the lock. What fails is reported, and the
// state file stays so that down can be run again.
func down(ctx context.Context, st *State, log *slog.Logger) error {
	var errs []error
	stop := func(roles ...string) {
		for _, role := range roles {
			for _, p := range st.Processes {
				if p.Role == role {
					if err := p.stop(ctx, stopSignal(role), 30*time.Second); err != nil {
						errs = append(errs, err)
					}
				}
			}
		}
	}
	stop("api", "node")
	for _, n := range st.Nodes {
		if err := purgeNode(ctx, st, n, log); err != nil {
			errs = append(errs, fmt.Errorf("node %d: %w", n.Index, err))
		}
	}
	stop("s3", "postgres")
	errs = append(errs, sweepLeftovers(ctx, st, log)...)
	for _, t := range st.NftTables {
		if err := deleteTable(t.Name); err != nil {
			errs = append(errs, err)
		}
	}
	for _, v := range st.Veths {
		if err := deleteLink(v); err != nil {
			errs = append(errs, err)
		}
	}
	for _, ns := range st.Netns {
		if err := deleteNetns(ns); err != nil {
			errs = append(errs, err)
		}
	}
	if st.IPForwardWas != "" {
		if err := os.WriteFile(ipForwardPath, []byte(st.IPForwardWas), 0o644); err != nil {
			errs = append(errs, fmt.Errorf("restore ip_forward: %w", err))
		}
	}
	if err := errors.Join(errs...); err != nil {
		st.save()
		return err
	}
	// Check before the directory (and the state file in it) goes: what
	// remains is reported, and down can be run again.
	var left []string
	for _, l := range Leftovers(st) {
		if !strings.HasPrefix(l, "directory ") {
			left = append(left, l)
		}
	}
	if len(left) > 0 {
		st.save()
		return fmt.Errorf("still on the host after down, not removing %s: %s", st.Dir, strings.Join(left, "; "))
	}
	for i := len(st.Dirs) - 1; i >= 0; i-- {
		if err := os.RemoveAll(st.Dirs[i]); err != nil && !errors.Is(err, fs.ErrNotExist) {
			return err
		}
	}
	log.Info("fleet down", "dir", st.Dir)
	return nil
}

func stopSignal(role string) syscall.Signal {
	if role == "postgres" {
		return syscall.SIGINT // fast shutdown (SIGTERM waits for clients)
	}
	return syscall.SIGTERM
}

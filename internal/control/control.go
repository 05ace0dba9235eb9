// Package control is the control plane's sandbox lifecycle: it validates
// requests, drives the node's engine, keeps the metadata store in step,
// enforces timeouts (kill, or hibernate when autoPause was asked) and
// reconciles the store with the node after a restart.
//
// The engine serializes operations on one sandbox and refuses those that
// do not apply in its state (errdefs.ErrConflict, a 409); control adds the
// API's rules on top (timeouts only extend on connect, pause of a paused
// sandbox is a conflict).
package control

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"net/netip"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/spore-run/spore/internal/audit"
	"github.com/spore-run/spore/internal/egress"
	"github.com/spore-run/spore/internal/errdefs"
	"github.com/spore-run/spore/internal/ids"
	"github.com/spore-run/spore/internal/nodeapi"
	"github.com/spore-run/spore/internal/secrets"
	"github.com/spore-run/spore/internal/store"
	"github.com/spore-run/spore/internal/tenant"
)

// Limits on what a request may ask.
const (
	DefaultTimeout = 300 * time.Second
	MaxTimeout     = 24 * time.Hour
	MaxMetadata    = 64 // pairs
	MaxEnvVars     = 256
)

// Config configures the service.
type Config struct {
	Store store.Store
	// Audit takes the audit trail's sandbox events (nil: none).
	Audit audit.Recorder
	// Nodes are the nodes this control plane drives, by ID.
	Nodes  Registry
	Logger *slog.Logger
	// Holder names this control plane instance in the store's leases
	// (default: a random ID per process).
	Holder string
	// CreateGrace is how long a row in state creating is left to the
	// create that wrote it before the reaper undoes it (default 2 min).
	CreateGrace time.Duration
	// DrainGrace is how long a drain waits for the requests in flight to
	// a running sandbox to end before it hibernates it (nodeapi Quiesce;
	// default 10 s, at most nodeapi.MaxQuiesceGrace): a stream still open
	// then (a background command's, a watch) is cut.
	DrainGrace time.Duration
	// Now is the clock (tests); time.Now by default.
	Now func() time.Time
	// LeaseTTL is how long a store lease (reaper, pool, nodes) lasts
	// without renewal, so how soon another instance takes over the work
	// of one that died (default 15 s; tests shorten it).
	LeaseTTL time.Duration
	// Hop, when set, returns the address of the node-side proxy of a
	// node whose sandboxes this process cannot reach directly (a remote
	// node agent); "" or nil: the sandbox's address is dialed directly
	// (the in-process node of `spore up`).
	Hop func(nodeID string) string
	// Secrets seals and opens the values of the secrets API; nil: the
	// secrets API answers unavailable.
	Secrets *secrets.Box
	// ReapTimeout bounds the reaper's work on one expired sandbox (its
	// lock, its row, its node calls), so a node that hangs on one does
	// not stall the pass (default 90 s: a hibernation's node call).
	ReapTimeout time.Duration
	// PresignSearchRate bounds this replica's searches for the sandbox
	// of a presigned URL that does not name it (presign.go), a second
	// (default PresignSearchRate; negative: no bound, for benchmarks).
	PresignSearchRate float64
	// CleanupTimeout bounds a delete made on the side of an operation
	// (a failed create's kill, a snapshot's or a durable copy's removal,
	// in the background or after the answer), so a node or blob store
	// that hangs holds no goroutine, nor Close, for ever (default 1 min).
	CleanupTimeout time.Duration
}

// Service is the sandbox lifecycle.
type Service struct {
	st    store.Store
	nodes Registry
	cfg   Config
	log   *slog.Logger
	// life serializes decisions about one sandbox's lifetime (the reaper
	// against connect and new timeouts) in this process; see expiry.go.
	life sandboxLocks
	ctx  context.Context // ends at Close
	stop context.CancelFunc
	// following: the nodes whose event streams this instance reads.
	followMu  sync.Mutex
	following map[string]bool

	// targets holds, per sandbox this process routed to, the instance
	// address and a channel closed when that instance goes away, so the
	// proxy's streams to it end; where a sandbox is comes from the store.
	mu      sync.RWMutex
	targets map[string]Target
	gates   map[string]gate // what the proxy checks, per sandbox routed to (resolve.go)
	presign *presignIndex   // running sandboxes' tokens, for presigned URLs (presign.go)
	// poolWake wakes this instance's pool filler (RunPool), if any.
	poolWake chan struct{}
	view     viewCache
	bg       sync.WaitGroup // background work Close waits for (view refreshes)
	// uploads are the background snapshot uploads (durable.go).
	uploads   sync.WaitGroup
	uploading atomic.Int64
	uploadSem chan struct{}
}

// Target is where the proxy sends a sandbox's traffic.
type Target struct {
	Addr  netip.Addr
	State string // store state
	// Gone is closed when the instance behind Addr goes away (kill,
	// hibernate, rollback): proxied streams to it end then, instead of
	// hanging on a network that no longer exists.
	Gone chan struct{}
}

// New returns the service; it follows each node's events (deaths) until
// Close.
func New(cfg Config) *Service {
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	if cfg.Holder == "" {
		cfg.Holder = ids.New('c')
	}
	if cfg.CreateGrace <= 0 {
		cfg.CreateGrace = 2 * time.Minute
	}
	if cfg.DrainGrace <= 0 {
		cfg.DrainGrace = 10 * time.Second
	}
	cfg.DrainGrace = min(cfg.DrainGrace, nodeapi.MaxQuiesceGrace)
	if cfg.Nodes == nil {
		cfg.Nodes = Nodes{}
	}
	if cfg.LeaseTTL <= 0 {
		cfg.LeaseTTL = leaseTTL
	}
	if cfg.ReapTimeout <= 0 {
		cfg.ReapTimeout = defaultReapTimeout
	}
	if cfg.CleanupTimeout <= 0 {
		cfg.CleanupTimeout = defaultCleanupTimeout
	}
	s := &Service{st: cfg.Store, nodes: cfg.Nodes, cfg: cfg, log: cfg.Logger, targets: map[string]Target{}, gates: map[string]gate{}, presign: newPresignIndex(cfg.PresignSearchRate), following: map[string]bool{},
		uploadSem: make(chan struct{}, uploadWorkers)}
	ctx, cancel := context.WithCancel(context.Background())
	s.ctx, s.stop = ctx, cancel
	for _, id := range cfg.Nodes.IDs() {
		n, _ := cfg.Nodes.Node(id)
		s.follow(ctx, id, n)
	}
	return s
}

// Close stops following the nodes' events.
func (s *Service) Close() {
	s.stop()
	s.uploads.Wait()
	s.bg.Wait()
}

// Sandbox is the control plane's full view of a sandbox: its store row
// (token, node and address included).
type Sandbox struct {
	store.Sandbox
}

// CreateRequest is a validated create.
type CreateRequest struct {
	// TeamID is the team the sandbox is made for ("": the default team):
	// the template or snapshot, the secrets and the volumes it names are
	// looked up among that team's.
	TeamID     string
	TemplateID string
	Timeout    time.Duration
	Metadata   map[string]string
	EnvVars    map[string]string
	AutoPause  bool
	// AutoResume: traffic to the sandbox while it is paused or hibernated
	// resumes it (E2B's lifecycle autoResume); needs AutoPause.
	AutoResume    bool
	AllowInternet *bool
	AllowOut      []string
	DenyOut       []string
	// PrivateTraffic: the sandbox's ports take only requests carrying its
	// traffic access token (E2B's network.allowPublicTraffic false).
	PrivateTraffic bool
	// Rules are E2B's network rules (ParseRules): headers set on the
	// sandbox's HTTPS requests to matching domains, from secrets.
	Rules    map[string][]store.NetworkRule
	CPUCount int
	MemoryMB int
	// NodeID, when set, is the node the sandbox must go to (operator
	// only): ErrNotFound for an unknown node, ErrResourceLimit or
	// ErrConflict when it cannot take it.
	NodeID string
	// Volumes are shown in the sandbox (E2B's volumeMounts); it goes to
	// the node that holds their content.
	Volumes []VolumeRequest
}

func (s *Service) now() time.Time { return s.cfg.Now().UTC() }

// ValidateTimeout checks a timeout in seconds from a request.
func ValidateTimeout(seconds int64) (time.Duration, error) {
	if seconds < 0 {
		return 0, errdefs.Invalidf("timeout %d is negative", seconds)
	}
	if seconds == 0 {
		return DefaultTimeout, nil
	}
	if time.Duration(seconds)*time.Second > MaxTimeout {
		return 0, errdefs.Invalidf("timeout %ds is over the maximum of %ds", seconds, int64(MaxTimeout/time.Second))
	}
	return time.Duration(seconds) * time.Second, nil
}

// ParsePolicy turns allow/deny lists of CIDRs, single addresses or domains
// into a network policy.
func ParsePolicy(internet *bool, allow, deny []string) (nodeapi.Policy, error) {
	p := nodeapi.Policy{Internet: internet == nil || *internet}
	parse := func(list []string, domains *[]string) ([]netip.Prefix, error) {
		var out []netip.Prefix
		for _, c := range list {
			c = strings.TrimSpace(c)
			// A domain ("api.example.com", "*.example.com"): judged on
			// the TLS SNI / HTTP Host by the node's egress proxy.
			if egress.IsDomain(c) {
				d, err := egress.ParseDomain(c)
				if err != nil {
					return nil, err
				}
				*domains = append(*domains, d)
				continue
			}
			// IPv4 or IPv6, as E2B takes them (each family's entries
			// go into that family's rules on the node).
			if pr, err := netip.ParsePrefix(c); err == nil && !pr.Addr().Is4In6() && pr.Addr().Zone() == "" {
				out = append(out, pr.Masked())
				continue
			}
			if a, err := netip.ParseAddr(c); err == nil && !a.Is4In6() && a.Zone() == "" {
				out = append(out, netip.PrefixFrom(a, a.BitLen()))
				continue
			}
			return nil, errdefs.Invalidf("%q is not an IPv4 or IPv6 address or CIDR", c)
		}
		return out, nil
	}
	// Capped before parsing: each entry is a rule in the sandbox's
	// gateway (the node refuses more too).
	for name, list := range map[string][]string{"allowOut": allow, "denyOut": deny} {
		if len(list) > nodeapi.MaxPolicyEntries {
			return p, errdefs.Invalidf("%s has %d entries, at most %d", name, len(list), nodeapi.MaxPolicyEntries)
		}
	}
	var err error
	if p.Allow, err = parse(allow, &p.AllowDomains); err != nil {
		return p, err
	}
	if p.Deny, err = parse(deny, &p.DenyDomains); err != nil {
		return p, err
	}
	return p, nil
}

func validateKV(kind string, m map[string]string, max int) error {
	if len(m) > max {
		return errdefs.Invalidf("%d %s entries, at most %d", len(m), kind, max)
	}
	for k, v := range m {
		if k == "" || len(k) > 256 || len(v) > 4096 || strings.ContainsAny(k, "\x00=") || strings.ContainsRune(v, 0) {
			return errdefs.Invalidf("%s key %q is invalid (1-256 characters, no '=' or NUL; values up to 4096)", kind, k)
		}
	}
	return nil
}

// Validate checks a create request without acting on it.
func Validate(r CreateRequest) error {
	if r.AutoResume && !r.AutoPause {
		return errdefs.Invalidf(`"autoResume" needs "autoPause" (onTimeout pause): a sandbox killed at its timeout has nothing to resume`)
	}
	if r.TemplateID != "" && ids.Validate("template ID", r.TemplateID) != nil && ids.ValidateName("template name", r.TemplateID) != nil {
		return errdefs.Invalidf("templateID %q is neither a template name nor a snapshot ID", r.TemplateID)
	}
	if r.Timeout < 0 || r.Timeout > MaxTimeout {
		return errdefs.Invalidf("timeout out of range")
	}
	if err := validateKV("metadata", r.Metadata, MaxMetadata); err != nil {
		return err
	}
	if err := validateKV("envVars", r.EnvVars, MaxEnvVars); err != nil {
		return err
	}
	if r.CPUCount < 0 || r.CPUCount > 64 || r.MemoryMB < 0 || r.MemoryMB > 1<<20 {
		return errdefs.Invalidf("cpuCount (0-64) or memoryMB out of range")
	}
	if r.NodeID != "" {
		if err := ids.Validate("node ID", r.NodeID); err != nil {
			return err
		}
	}
	if _, err := ParsePolicy(r.AllowInternet, r.AllowOut, r.DenyOut); err != nil {
		return err
	}
	if err := validateVolumeRequests(r.Volumes); err != nil {
		return err
	}
	_, err := ParseRules(r.Rules)
	return err
}

// newToken mints a sandbox's envd access token.
func newToken() string {
	b := make([]byte, 24)
	rand.Read(b)
	return hex.EncodeToString(b)
}

// Create makes a sandbox from a template or snapshot. The control plane
// mints the sandbox's ID and token and writes its row (state creating,
// with its node) before it asks the node, so a crash at any point leaves
// a row that names what may exist on the node. A node call that fails
// indefinitely (unavailable, deadline) is tried again with the same ID
// (see retryNodeCall); a create that still fails, or whose answer is
// lost, is undone by killing that ID on the node (the node's create is
// idempotent by ID, its kill of an unknown ID a no-op), here or by the
// reaper once CreateGrace has passed. The chosen node's row is read
// after the row is written: a node that takes no new work now (drained
// through another replica since this one's placement view was read) gets
// nothing, and the create is placed again (drain.go).
func (s *Service) Create(ctx context.Context, r CreateRequest) (Sandbox, error) {
	if r.TemplateID == "" {
		r.TemplateID = "base"
	}
	if err := Validate(r); err != nil {
		return Sandbox{}, err
	}
	policy, err := ParsePolicy(r.AllowInternet, r.AllowOut, r.DenyOut)
	if err != nil {
		return Sandbox{}, err
	}
	var env []string
	keys := make([]string, 0, len(r.EnvVars))
	for k := range r.EnvVars {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	for _, k := range keys {
		env = append(env, k+"="+r.EnvVars[k])
	}
	now := s.now()
	if r.TeamID == "" {
		r.TeamID = store.DefaultTeam
	}
	ctx = tenant.With(ctx, r.TeamID) // the node queues its launch with the team's (engine's launch gate)
	rec := store.Sandbox{
		TeamID: r.TeamID, TemplateID: r.TemplateID, Metadata: r.Metadata, EnvVars: r.EnvVars,
		StartedAt: now, EndAt: now.Add(r.Timeout), AutoPause: r.AutoPause, AutoResume: r.AutoResume, AllowInternet: policy.Internet,
		AllowOut: r.AllowOut, DenyOut: r.DenyOut, PrivateTraffic: r.PrivateTraffic,
	}
	if rec.NetworkRules, err = ParseRules(r.Rules); err != nil {
		return Sandbox{}, err
	}
	if len(rec.NetworkRules) > 0 {
		// Its own CA (a pooled sandbox's too: the node installs it
		// when it hands the sandbox over).
		if rec.EgressCA, err = s.mintCA(""); err != nil {
			return Sandbox{}, err
		}
		if policy, err = s.withRules(ctx, policy, rec, true); err != nil {
			return Sandbox{}, err
		}
	}
	src, err := s.sourceOf(ctx, rec.TeamID, r.TemplateID)
	if err != nil {
		return Sandbox{}, err
	}
	var home string
	if rec.VolumeMounts, home, err = volumesOf(ctx, s.st, rec.TeamID, r.Volumes, src); err != nil {
		return Sandbox{}, err
	}
	if home != "" {
		if r.NodeID != "" && r.NodeID != home {
			return Sandbox{}, errdefs.Conflictf("the volumes asked are on node %s, not %s", home, r.NodeID)
		}
		r.NodeID = home
	}
	return placing(s, func() (Sandbox, error) { return s.createPlaced(ctx, r, rec, src, env, policy) })
}

// createPlaced is one try of Create from the placement on: errNodeClosed
// when the node placed on takes no new work now (nothing was made).
func (s *Service) createPlaced(ctx context.Context, r CreateRequest, rec store.Sandbox, src *sourceInfo, env []string, policy nodeapi.Policy) (Sandbox, error) {
	source := src.sourceID(r.TemplateID)
	nodeID, n, err := s.place(ctx, r, src)
	if err != nil {
		return Sandbox{}, err
	}
	var peers []string
	if src != nil {
		peers = src.peers
	}
	// Placement decides the node (pooled sandboxes count in its use, so
	// the pool does not skew the spread); a pooled sandbox there saves
	// the restore.
	if len(rec.VolumeMounts) == 0 { // a pooled sandbox has no volumes
		if sb, err := s.fromPool(ctx, r, rec, nodeID, env, policy); err == nil || errors.Is(err, errNodeClosed) {
			return sb, err
		}
	}
	rec.ID, rec.NodeID, rec.State, rec.EnvdAccessToken = ids.New('i'), nodeID, store.StateCreating, newToken()
	rec.CPUCount, rec.MemoryMB = r.CPUCount, r.MemoryMB
	if src != nil && len(src.volumes) > 0 {
		// The snapshot's exclusive volumes come as volumes of its own.
		if rec.VolumeMounts, err = s.ownVolumes(ctx, rec.TeamID, rec.ID, nodeID, rec.VolumeMounts); err != nil {
			return Sandbox{}, err
		}
	}
	if err := s.st.CreateSandbox(ctx, rec); err != nil {
		s.dropOwnVolumes(ctx, rec.ID, rec.VolumeMounts)
		return Sandbox{}, err
	}
	// The node's row, read after this row is written: a drain committed
	// through any replica is obeyed here, or finds this row (drain.go).
	if err := s.admitted(ctx, nodeID); err != nil {
		s.dropRow(ctx, rec)
		return Sandbox{}, err
	}
	vols, err := claimVolumes(ctx, s.st, rec.ID, nodeID, rec.VolumeMounts)
	if err != nil {
		s.dropRow(ctx, rec)
		return Sandbox{}, err
	}
	if src != nil && len(src.volumes) > 0 {
		vols = nil // they come with the snapshot (its image has them behind its slots)
	}
	req := nodeapi.CreateRequest{SandboxID: rec.ID, AccessToken: rec.EnvdAccessToken, Template: source,
		Env: env, VCPUs: float64(r.CPUCount), MemoryMB: int64(r.MemoryMB), Policy: &policy, Peers: peers, Volumes: vols}
	ns, err := retryNodeCall(ctx, s, "create", rec.ID, func(ctx context.Context) (nodeapi.Sandbox, error) { return n.Create(ctx, req) })
	if err != nil {
		s.abandon(ctx, rec)
		return Sandbox{}, err
	}
	if src != nil {
		s.noteCopy(ctx, src, nodeID)
	}
	return s.commitCreated(ctx, rec, ns)
}

// commitCreated turns a creating row into a running one with what the
// node reports; when the row changed meanwhile (killed during the
// create) the node's sandbox goes.
func (s *Service) commitCreated(ctx context.Context, rec store.Sandbox, ns nodeapi.Sandbox) (Sandbox, error) {
	rec.State = store.StateRunning
	setFromNode(&rec, ns)
	if rec.Version == 0 {
		rec.Version = 1 // as CreateSandbox wrote it
	}
	got, err := s.st.CompareAndSwapSandbox(ctx, rec)
	var qe *store.QuotaError
	if errors.As(err, &qe) {
		// The node made it larger than its row said (the template's
		// size), past the team's quota: undone, row and all.
		s.abandon(ctx, rec)
		return Sandbox{}, err
	}
	if err != nil {
		s.killOnNode(ctx, rec.NodeID, rec.ID)
		return Sandbox{}, fmt.Errorf("sandbox %s changed while it was created: %w", rec.ID, err)
	}
	s.event(got, "sandbox.created", "from "+got.TemplateID)
	s.setTarget(got.ID, got.Addr, got.State)
	s.presign.note(got.ID, got.EnvdAccessToken)
	return Sandbox{got}, nil
}

// defaultCleanupTimeout is Config.CleanupTimeout's default.
const defaultCleanupTimeout = time.Minute

// cleanupContext is the context of a delete made on the side of an
// operation: it outlives the operation's cancellation (a create is
// undone even when its client went away) but not CleanupTimeout. Before,
// such deletes ran without any deadline: a node that never answered held
// their goroutine (and Close, which waits for background work) for ever.
func (s *Service) cleanupContext(ctx context.Context) (context.Context, context.CancelFunc) {
	return context.WithTimeout(context.WithoutCancel(ctx), s.cfg.CleanupTimeout)
}

// inBackgroundCleanup runs a delete after the answer, in the background,
// until it is done, CleanupTimeout passed or Close (which waits for it);
// f logs its own failure, with the IDs.
func (s *Service) inBackgroundCleanup(f func(ctx context.Context)) {
	if s.ctx.Err() != nil {
		return // closing: what it would remove stays, as after a crash
	}
	s.bg.Add(1)
	go func() {
		defer s.bg.Done()
		ctx, cancel := context.WithTimeout(s.ctx, s.cfg.CleanupTimeout)
		defer cancel()
		f(ctx)
	}()
}

// abandon undoes a create that failed (or whose answer was lost): the
// node's sandbox by that ID, if any, and the row; each within
// CleanupTimeout. A kill that fails leaves a sandbox no row names, which
// the node's periodic reconcile kills (ReconcileNode); a row that
// cannot be deleted stays creating, and the reaper undoes it again once
// CreateGrace has passed.
func (s *Service) abandon(ctx context.Context, rec store.Sandbox) {
	s.killOnNode(ctx, rec.NodeID, rec.ID)
	dctx, cancel := s.cleanupContext(ctx)
	defer cancel()
	if err := s.st.DeleteSandbox(dctx, rec.ID); err != nil && !errdefs.IsNotFound(err) {
		s.log.Error("drop row of failed create (the reaper retries)", "sandbox_id", rec.ID, "node_id", rec.NodeID, "err", err)
		return
	}
	s.dropOwnVolumes(ctx, rec.ID, rec.VolumeMounts)
}

// killOnNode kills a sandbox by ID on a node, ignoring "not there",
// within CleanupTimeout. One that fails leaves a sandbox its row no longer
// names: the node's periodic reconcile kills it.
func (s *Service) killOnNode(ctx context.Context, nodeID, id string) {
	n, err := s.node(nodeID)
	if err == nil {
		kctx, cancel := s.cleanupContext(ctx)
		err = n.Kill(kctx, id)
		cancel()
	}
	if err != nil && !errdefs.IsNotFound(err) {
		s.log.Error("kill sandbox on node (its reconcile kills it)", "sandbox_id", id, "node_id", nodeID, "err", err)
	}
}

// setFromNode copies what the node decides (limits, address) into a row.
func setFromNode(rec *store.Sandbox, ns nodeapi.Sandbox) {
	rec.CPUCount, rec.MemoryMB, rec.DiskSizeMB = int(ns.Limits.VCPUs), int(ns.Limits.MemoryMB), int(ns.Limits.DiskMB)
	rec.Addr = ns.Addr
}

// Get returns one sandbox, from the store.
func (s *Service) Get(ctx context.Context, id string) (Sandbox, error) {
	rec, err := s.row(ctx, id)
	if err != nil {
		return Sandbox{}, err
	}
	return Sandbox{rec}, nil
}

// row reads a sandbox's row for an operation a user asked: a warm-pool
// sandbox is nobody's yet, so it is not found.
func (s *Service) row(ctx context.Context, id string) (store.Sandbox, error) {
	rec, err := s.st.GetSandbox(ctx, id)
	if err == nil && rec.State == store.StatePooled {
		return store.Sandbox{}, errdefs.NotFoundf("sandbox %s not found", id)
	}
	return rec, err
}

// visibleStates are the states List shows when none are asked: a row
// being created is not a sandbox yet.
var visibleStates = []string{store.StateRunning, store.StatePaused, store.StateHibernated, store.StateError}

// List returns a page of sandboxes.
func (s *Service) List(ctx context.Context, f store.SandboxFilter) ([]store.Sandbox, string, error) {
	if len(f.States) == 0 {
		f.States = visibleStates
	}
	return s.st.ListSandboxes(ctx, f)
}

// Kill kills a sandbox and forgets it.
func (s *Service) Kill(ctx context.Context, id string) error {
	rec, err := s.row(ctx, id)
	if err != nil {
		return err
	}
	n, err := s.nodeOf(rec)
	if err != nil {
		return err
	}
	if err := n.Kill(ctx, id); err != nil && !errdefs.IsNotFound(err) {
		// A hibernated sandbox whose image is durable lives on in the
		// blob store while its node is away: it can go from there (the
		// node's copy goes at its reconcile, when it is back).
		if !(rec.State == store.StateHibernated && rec.HibernationDurable && errdefs.IsUnavailable(err)) {
			return err
		}
	}
	s.dropTarget(id)
	if err := s.st.DeleteSandbox(ctx, id); err != nil && !errdefs.IsNotFound(err) {
		return err
	}
	if rec.HibernationDurable && rec.Hibernation != "" {
		s.dropDurable(ctx, rec.Hibernation)
	}
	s.event(rec, "sandbox.killed", "")
	s.egressSummary(rec)
	return nil
}

// Target returns where a sandbox's traffic goes, as last routed by this
// process.
func (s *Service) Target(id string) (Target, bool) {
	s.mu.RLock()
	defer s.mu.RUnlock()
	t, ok := s.targets[id]
	return t, ok
}

func (s *Service) setTarget(id, addr, state string) {
	a, _ := netip.ParseAddr(addr)
	s.mu.Lock()
	defer s.mu.Unlock()
	old, ok := s.targets[id]
	if ok && old.Addr == a {
		old.State = state
		s.targets[id] = old
		return
	}
	if ok {
		close(old.Gone)
	}
	s.targets[id] = Target{Addr: a, State: state, Gone: make(chan struct{})}
}

func (s *Service) dropTarget(id string) {
	s.presign.forget(id)
	s.mu.Lock()
	defer s.mu.Unlock()
	delete(s.gates, id)
	if old, ok := s.targets[id]; ok {
		close(old.Gone)
		delete(s.targets, id)
	}
}

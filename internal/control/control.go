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
	"fmt"
	"log/slog"
	"net/netip"
	"sort"
	"strings"
	"sync"
	"time"

	"github.com/spore-run/spore/internal/engine"
	"github.com/spore-run/spore/internal/errdefs"
	"github.com/spore-run/spore/internal/ids"
	"github.com/spore-run/spore/internal/netns"
	"github.com/spore-run/spore/internal/snapshot"
	"github.com/spore-run/spore/internal/store"
)

// Engine is what control needs of a node's engine.
type Engine interface {
	Create(ctx context.Context, opts engine.CreateOptions) (engine.Sandbox, error)
	Get(ctx context.Context, id string) (engine.Sandbox, error)
	List(ctx context.Context) []engine.Sandbox
	Kill(ctx context.Context, id string) error
	Pause(ctx context.Context, id string) error
	Resume(ctx context.Context, id string) error
	Hibernate(ctx context.Context, id string) error
	Snapshot(ctx context.Context, id string, opts engine.SnapshotOptions) (engine.SnapshotResult, error)
	Fork(ctx context.Context, id string, opts engine.ForkOptions) (engine.ForkResult, error)
	Rollback(ctx context.Context, id, snapshotRef string) (engine.Sandbox, error)
	DeleteSnapshot(ctx context.Context, ref string) error
	SetPolicy(ctx context.Context, id string, p netns.Policy) error
	Reconfigure(ctx context.Context, id string, env []string, p *netns.Policy) (engine.Sandbox, error)
	Snapshots() *snapshot.Repo
}

// Limits on what a request may ask.
const (
	DefaultTimeout = 300 * time.Second
	MaxTimeout     = 24 * time.Hour
	MaxMetadata    = 64 // pairs
	MaxEnvVars     = 256
)

// Config configures the service.
type Config struct {
	Store  store.Store
	Engine Engine
	NodeID string
	Logger *slog.Logger
	// Now is the clock (tests); time.Now by default.
	Now func() time.Time
}

// Service is the sandbox lifecycle.
type Service struct {
	st  store.Store
	eng Engine
	cfg Config
	log *slog.Logger
	// life serializes decisions about one sandbox's lifetime (the reaper
	// against connect and new timeouts); see expiry.go.
	life sandboxLocks

	// lookups caches where each running sandbox is reached, for the proxy.
	mu      sync.RWMutex
	targets map[string]Target
	pool    *pool
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

// New returns the service.
func New(cfg Config) *Service {
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	if cfg.NodeID == "" {
		cfg.NodeID = "local"
	}
	s := &Service{st: cfg.Store, eng: cfg.Engine, cfg: cfg, log: cfg.Logger, targets: map[string]Target{}}
	if n, ok := cfg.Engine.(deathNotifier); ok {
		n.OnDeath(s.sandboxDied)
	}
	return s
}

// Sandbox is the control plane's full view of a sandbox.
type Sandbox struct {
	store.Sandbox
	EngineState     string // running, paused, hibernated (exact)
	EnvdAccessToken string
	Addr            netip.Addr
}

// CreateRequest is a validated create.
type CreateRequest struct {
	TemplateID    string
	Timeout       time.Duration
	Metadata      map[string]string
	EnvVars       map[string]string
	AutoPause     bool
	AllowInternet *bool
	AllowOut      []string
	DenyOut       []string
	CPUCount      int
	MemoryMB      int
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

// ParsePolicy turns allow/deny lists of CIDRs (or single addresses) into a
// network policy.
func ParsePolicy(internet *bool, allow, deny []string) (netns.Policy, error) {
	p := netns.Policy{Internet: internet == nil || *internet}
	parse := func(list []string) ([]netip.Prefix, error) {
		var out []netip.Prefix
		for _, c := range list {
			c = strings.TrimSpace(c)
			if pr, err := netip.ParsePrefix(c); err == nil && pr.Addr().Is4() {
				out = append(out, pr.Masked())
				continue
			}
			if a, err := netip.ParseAddr(c); err == nil && a.Is4() {
				out = append(out, netip.PrefixFrom(a, 32))
				continue
			}
			return nil, errdefs.Invalidf("%q is not an IPv4 address or CIDR", c)
		}
		return out, nil
	}
	// Capped before parsing: each entry is a rule in the sandbox's
	// gateway (netns refuses more too).
	for name, list := range map[string][]string{"allowOut": allow, "denyOut": deny} {
		if len(list) > netns.MaxPolicyEntries {
			return p, errdefs.Invalidf("%s has %d entries, at most %d", name, len(list), netns.MaxPolicyEntries)
		}
	}
	var err error
	if p.Allow, err = parse(allow); err != nil {
		return p, err
	}
	if p.Deny, err = parse(deny); err != nil {
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
	_, err := ParsePolicy(r.AllowInternet, r.AllowOut, r.DenyOut)
	return err
}

// Create makes a sandbox from a template or snapshot.
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
	es, pooled := s.fromPool(ctx, r, env, policy)
	if !pooled {
		var err error
		es, err = s.eng.Create(ctx, engine.CreateOptions{
			Template: r.TemplateID, Env: env, Policy: &policy, VCPUs: float64(r.CPUCount), MemoryMB: int64(r.MemoryMB),
		})
		if err != nil {
			return Sandbox{}, err
		}
	}
	now := s.now()
	rec := store.Sandbox{
		ID: es.ID, TemplateID: r.TemplateID, State: store.StateRunning, Metadata: r.Metadata, EnvVars: r.EnvVars,
		CPUCount: int(es.Run.Limits.VCPUs), MemoryMB: int(es.Run.Limits.MemoryMB), DiskSizeMB: int(es.Run.Limits.DiskMB),
		StartedAt: now, EndAt: now.Add(r.Timeout), AutoPause: r.AutoPause, AllowInternet: policy.Internet,
		AllowOut: r.AllowOut, DenyOut: r.DenyOut, NodeID: s.cfg.NodeID,
	}
	if err := s.st.CreateSandbox(ctx, rec); err != nil {
		if kerr := s.eng.Kill(context.WithoutCancel(ctx), es.ID); kerr != nil {
			s.log.Error("kill sandbox after failed store write", "sandbox_id", es.ID, "err", kerr)
		}
		return Sandbox{}, err
	}
	s.setTarget(es.ID, es.Addr, store.StateRunning)
	return Sandbox{Sandbox: rec, EngineState: string(es.State), EnvdAccessToken: es.Run.AccessToken, Addr: es.Addr}, nil
}

// Get returns one sandbox.
func (s *Service) Get(ctx context.Context, id string) (Sandbox, error) {
	rec, err := s.st.GetSandbox(ctx, id)
	if err != nil {
		return Sandbox{}, err
	}
	es, err := s.eng.Get(ctx, id)
	if err != nil {
		return Sandbox{}, err
	}
	return Sandbox{Sandbox: rec, EngineState: string(es.State), EnvdAccessToken: es.Run.AccessToken, Addr: es.Addr}, nil
}

// List returns a page of sandboxes.
func (s *Service) List(ctx context.Context, f store.SandboxFilter) ([]store.Sandbox, string, error) {
	return s.st.ListSandboxes(ctx, f)
}

// Kill kills a sandbox and forgets it.
func (s *Service) Kill(ctx context.Context, id string) error {
	if _, err := s.st.GetSandbox(ctx, id); err != nil {
		return err
	}
	if err := s.eng.Kill(ctx, id); err != nil && !errdefs.IsNotFound(err) {
		return err
	}
	s.dropTarget(id)
	if err := s.st.DeleteSandbox(ctx, id); err != nil && !errdefs.IsNotFound(err) {
		return err
	}
	return nil
}

// Target returns where a sandbox's traffic goes.
func (s *Service) Target(id string) (Target, bool) {
	s.mu.RLock()
	defer s.mu.RUnlock()
	t, ok := s.targets[id]
	return t, ok
}

func (s *Service) setTarget(id string, addr netip.Addr, state string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	old, ok := s.targets[id]
	if ok && old.Addr == addr {
		old.State = state
		s.targets[id] = old
		return
	}
	if ok {
		close(old.Gone)
	}
	s.targets[id] = Target{Addr: addr, State: state, Gone: make(chan struct{})}
}

func (s *Service) dropTarget(id string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if old, ok := s.targets[id]; ok {
		close(old.Gone)
		delete(s.targets, id)
	}
}

// refreshTarget re-reads a sandbox's address and state from the engine.
func (s *Service) refreshTarget(ctx context.Context, id, state string) {
	if es, err := s.eng.Get(ctx, id); err == nil {
		s.setTarget(id, es.Addr, state)
	}
}

func fmtErr(op, id string, err error) error { return fmt.Errorf("%s %s: %w", op, id, err) }

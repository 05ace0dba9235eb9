package control_test

import (
	"context"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/spore-run/spore/internal/control"
	"github.com/spore-run/spore/internal/control/controltest"
	"github.com/spore-run/spore/internal/errdefs"
	"github.com/spore-run/spore/internal/ids"
	"github.com/spore-run/spore/internal/nodeapi"
	"github.com/spore-run/spore/internal/nodeapi/local"
	"github.com/spore-run/spore/internal/runtime"
	"github.com/spore-run/spore/internal/store"
	"github.com/spore-run/spore/internal/store/postgres"
	"github.com/spore-run/spore/internal/store/sqlite"
	"github.com/spore-run/spore/internal/testenv"
)

// Two control plane instances (replicas) on one store and the same fake
// nodes: the background work (reaper, warm pool, periodic reconcile) is
// done once across them, and nothing one needs lives only in the other.

// countNode counts a node's kills and lists; afterList, when set, runs
// once after a List has read the node (to race a reconcile).
type countNode struct {
	nodeapi.Node
	mu        sync.Mutex
	kills     map[string]int
	lists     int
	afterList func()
}

func (c *countNode) Kill(ctx context.Context, id string) error {
	c.mu.Lock()
	c.kills[id]++
	c.mu.Unlock()
	return c.Node.Kill(ctx, id)
}

func (c *countNode) List(ctx context.Context) ([]nodeapi.Sandbox, error) {
	l, err := c.Node.List(ctx)
	c.mu.Lock()
	c.lists++
	f := c.afterList
	c.afterList = nil
	c.mu.Unlock()
	if f != nil {
		f()
	}
	return l, err
}

func (c *countNode) killed(id string) int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.kills[id]
}

type replClock struct {
	mu sync.Mutex
	t  time.Time
}

func (c *replClock) Now() time.Time { c.mu.Lock(); defer c.mu.Unlock(); return c.t }
func (c *replClock) Add(d time.Duration) {
	c.mu.Lock()
	c.t = c.t.Add(d)
	c.mu.Unlock()
}

type replicas struct {
	t      *testing.T
	a, b   *control.Service
	st     store.Store // a's handle
	stB    store.Store // b's handle
	clk    *replClock
	nodes  map[string]*countNode
	fake   map[string]*controltest.Node
	ttl    time.Duration
	holder map[*control.Service]string
}

// newReplicas opens two store handles on one database (SQLite file or
// PostgreSQL) and a service on each, over fake nodes with the given IDs.
func newReplicas(t *testing.T, backend string, ttl time.Duration, nodeIDs ...string) *replicas {
	t.Helper()
	ctx := context.Background()
	var st1, st2 store.Store
	var err error
	switch backend {
	case "sqlite":
		path := filepath.Join(t.TempDir(), "spore.db")
		if st1, err = sqlite.Open(ctx, path); err == nil {
			st2, err = sqlite.Open(ctx, path)
		}
	case "postgres":
		dsn := testenv.Postgres(t)
		if st1, err = postgres.Open(ctx, dsn); err == nil {
			st2, err = postgres.Open(ctx, dsn)
		}
	}
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { st1.Close(); st2.Close() })
	r := &replicas{t: t, st: st1, stB: st2, clk: &replClock{t: time.Date(2030, 1, 1, 0, 0, 0, 0, time.UTC)},
		nodes: map[string]*countNode{}, fake: map[string]*controltest.Node{}, ttl: ttl, holder: map[*control.Service]string{}}
	reg := control.Nodes{}
	for _, id := range nodeIDs {
		f := controltest.New(t)
		r.fake[id] = f
		r.nodes[id] = &countNode{Node: local.New(f.Engine, local.Config{ID: id}), kills: map[string]int{}}
		reg[id] = r.nodes[id]
	}
	r.a = control.New(control.Config{Store: st1, Nodes: reg, Now: r.clk.Now, Holder: "A", LeaseTTL: ttl})
	r.b = control.New(control.Config{Store: st2, Nodes: reg, Now: r.clk.Now, Holder: "B", LeaseTTL: ttl})
	r.holder[r.a], r.holder[r.b] = "A", "B"
	t.Cleanup(r.a.Close)
	t.Cleanup(r.b.Close)
	if err := r.a.RegisterNodes(ctxFor(t)); err != nil {
		t.Fatal(err)
	}
	return r
}

func (r *replicas) create(s *control.Service, timeout time.Duration) control.Sandbox {
	r.t.Helper()
	sb, err := s.Create(ctxFor(r.t), control.CreateRequest{Timeout: timeout})
	if err != nil {
		r.t.Fatalf("create: %v", err)
	}
	return sb
}

func (r *replicas) gone(id string) bool {
	r.t.Helper()
	_, err := r.st.GetSandbox(ctxFor(r.t), id)
	if err != nil && !errdefs.IsNotFound(err) {
		r.t.Fatal(err)
	}
	return err != nil
}

var backends = []string{"sqlite", "postgres"}

// An expired sandbox is killed once however many replicas reap; when the
// reaper lease's holder dies the other takes over once the lease expires
// (not before), and when it stops cleanly the other takes over at once.
func TestReaperOnceAcrossReplicas(t *testing.T) {
	for _, backend := range backends {
		t.Run(backend, func(t *testing.T) {
			const ttl = 2 * time.Second
			r := newReplicas(t, backend, ttl, "na")
			n := r.nodes["na"]
			ctx := ctxFor(t)
			sb := r.create(r.a, 10*time.Second)
			r.clk.Add(11 * time.Second)
			var wg sync.WaitGroup
			for range 3 {
				for _, s := range []*control.Service{r.a, r.b} {
					wg.Add(1)
					go func() { defer wg.Done(); s.ReapExpired(ctx) }()
				}
			}
			wg.Wait()
			if k := n.killed(sb.ID); k != 1 || !r.gone(sb.ID) {
				t.Fatalf("expired sandbox: %d kills, row gone %v; want 1, true", k, r.gone(sb.ID))
			}

			// Which replica holds the lease now? (Asking as A renews it
			// if it is A's, and takes nothing from B.)
			holder, other := r.a, r.b
			if ok, err := r.st.AcquireLease(ctx, "reaper", "A", ttl); err != nil {
				t.Fatal(err)
			} else if !ok {
				holder, other = r.b, r.a
			}
			t.Logf("reaper lease held by %s", r.holder[holder])

			// The holder dies (stops renewing, keeps its lease).
			sb2 := r.create(other, 10*time.Second)
			r.clk.Add(11 * time.Second)
			other.ReapExpired(ctx)
			if n.killed(sb2.ID) != 0 || r.gone(sb2.ID) {
				t.Fatal("the other replica reaped while the holder's lease was live")
			}
			time.Sleep(ttl + 200*time.Millisecond)
			other.ReapExpired(ctx)
			if k := n.killed(sb2.ID); k != 1 || !r.gone(sb2.ID) {
				t.Fatalf("after the lease expired: %d kills, row gone %v; want 1, true", k, r.gone(sb2.ID))
			}

			// The new holder stops cleanly: it releases the lease.
			rctx, cancel := context.WithCancel(ctx)
			done := make(chan struct{})
			go func() { defer close(done); other.Run(rctx, 20*time.Millisecond) }()
			cancel()
			<-done
			sb3 := r.create(holder, 10*time.Second)
			r.clk.Add(11 * time.Second)
			holder.ReapExpired(ctx)
			if k := n.killed(sb3.ID); k != 1 || !r.gone(sb3.ID) {
				t.Fatalf("after a clean stop: %d kills, row gone %v; want 1, true", k, r.gone(sb3.ID))
			}
		})
	}
}

// waitPooled waits until the store holds want pooled rows of base.
func (r *replicas) waitPooled(want int) []store.Sandbox {
	r.t.Helper()
	deadline := time.Now().Add(time.Minute)
	for {
		rows, _, err := r.st.ListSandboxes(ctxFor(r.t), store.SandboxFilter{States: []string{store.StatePooled}})
		if err != nil {
			r.t.Fatal(err)
		}
		if len(rows) == want {
			return rows
		}
		if time.Now().After(deadline) {
			r.t.Fatalf("%d pooled rows, want %d", len(rows), want)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// runPool fills the pool from s and stops its filler once it is full.
func (r *replicas) runPool(s *control.Service, cfg control.PoolConfig) []store.Sandbox {
	r.t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); s.RunPool(ctx, cfg) }()
	rows := r.waitPooled(cfg.Size * len(cfg.Templates))
	cancel()
	<-done
	return rows
}

func (r *replicas) onNodes() int {
	n := 0
	for _, f := range r.fake {
		n += len(f.Engine.List(context.Background()))
	}
	return n
}

// The warm pool is store rows every replica serves from: filled by one
// replica, invisible to users, kept by reconcile, and each pooled sandbox
// goes to exactly one of many concurrent creates on both replicas (the
// others restore as usual).
func TestWarmPoolAcrossReplicas(t *testing.T) {
	for _, backend := range backends {
		t.Run(backend, func(t *testing.T) {
			// One node: every create is placed where the pool is.
			r := newReplicas(t, backend, 15*time.Second, "na")
			ctx := ctxFor(t)
			pooled := r.runPool(r.a, control.PoolConfig{Templates: []string{"base"}, Size: 3})
			isPooled := map[string]bool{}
			for _, p := range pooled {
				isPooled[p.ID] = true
				if p.NodeID == "" || p.Addr == "" || p.EnvdAccessToken == "" {
					t.Fatalf("pooled row lacks node, address or token: %+v", p)
				}
				if _, err := r.b.Get(ctx, p.ID); !errdefs.IsNotFound(err) {
					t.Fatalf("GET of a pooled sandbox: %v, want not found", err)
				}
			}
			for _, s := range []*control.Service{r.a, r.b} {
				if l, _, err := s.List(ctx, store.SandboxFilter{}); err != nil || len(l) != 0 {
					t.Fatalf("list shows %d sandboxes (%v), want none", len(l), err)
				}
			}
			// Reconcile (any replica) keeps them.
			if err := r.b.ReconcileNode(ctx, "na"); err != nil {
				t.Fatal(err)
			}
			if r.waitPooled(3); r.onNodes() != 3 {
				t.Fatalf("%d sandboxes on the nodes after reconcile, want the 3 pooled", r.onNodes())
			}

			const each = 4
			var wg sync.WaitGroup
			var mu sync.Mutex
			var got []control.Sandbox
			for _, s := range []*control.Service{r.a, r.b} {
				for range each {
					wg.Add(1)
					go func() {
						defer wg.Done()
						sb, err := s.Create(ctx, control.CreateRequest{Timeout: time.Minute, EnvVars: map[string]string{"K": "v"}})
						if err != nil {
							t.Errorf("create: %v", err)
							return
						}
						mu.Lock()
						got = append(got, sb)
						mu.Unlock()
					}()
				}
			}
			wg.Wait()
			seen := map[string]bool{}
			fromPool := 0
			for _, sb := range got {
				if seen[sb.ID] {
					t.Fatalf("sandbox %s given to two creates", sb.ID)
				}
				seen[sb.ID] = true
				if isPooled[sb.ID] {
					fromPool++
				}
				rec, err := r.st.GetSandbox(ctx, sb.ID)
				if err != nil || rec.State != store.StateRunning {
					t.Fatalf("created %s: %+v %v", sb.ID, rec, err)
				}
			}
			if len(got) != 2*each || fromPool != 3 {
				t.Fatalf("%d creates, %d from the pool; want %d, 3", len(got), fromPool, 2*each)
			}
			r.waitPooled(0)
			if r.onNodes() != 2*each {
				t.Fatalf("%d sandboxes on the nodes, want %d", r.onNodes(), 2*each)
			}
		})
	}
}

// Drain kills a node's pooled sandboxes; a pooled sandbox that dies
// leaves the pool instead of showing up as a user's dead sandbox.
func TestWarmPoolDrainAndDeath(t *testing.T) {
	r := newReplicas(t, "sqlite", 15*time.Second, "na", "nb")
	ctx := ctxFor(t)
	pooled := r.runPool(r.a, control.PoolConfig{Templates: []string{"base"}, Size: 2, NodeID: "na"})
	if _, err := r.b.Drain(ctx, "na"); err != nil {
		t.Fatal(err)
	}
	r.waitPooled(0)
	for _, p := range pooled {
		if r.nodes["na"].killed(p.ID) != 1 {
			t.Fatalf("pooled %s not killed by the drain", p.ID)
		}
	}
	if err := r.b.Undrain(ctx, "na"); err != nil {
		t.Fatal(err)
	}
	pooled = r.runPool(r.a, control.PoolConfig{Templates: []string{"base"}, Size: 1, NodeID: "nb"})
	es, err := r.fake["nb"].Engine.Get(ctx, pooled[0].ID)
	if err != nil {
		t.Fatal(err)
	}
	if err := r.fake["nb"].Runtime.Die(es.Instance, runtime.ExitCrashed, "test"); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(time.Minute)
	for !r.gone(pooled[0].ID) {
		if time.Now().After(deadline) {
			t.Fatal("the row of a dead pooled sandbox stays")
		}
		time.Sleep(20 * time.Millisecond)
	}
	if l, _, _ := r.a.List(ctx, store.SandboxFilter{}); len(l) != 0 {
		t.Fatalf("a dead pooled sandbox is listed: %+v", l)
	}
}

// The periodic reconcile handles, without a restart, a row whose
// instance vanished and an instance no row names, leaves creates in
// flight alone (the row creating, or written after the reconcile read
// the rows), and reconciles each node on one replica.
func TestPeriodicReconcile(t *testing.T) {
	r := newReplicas(t, "sqlite", 15*time.Second, "na")
	ctx := ctxFor(t)
	n, f := r.nodes["na"], r.fake["na"]
	vanished := r.create(r.a, time.Hour)
	if err := f.Engine.Kill(ctx, vanished.ID); err != nil { // behind the control plane's back
		t.Fatal(err)
	}
	orphan := ids.New('i')
	if _, err := n.Node.Create(ctx, nodeapi.CreateRequest{SandboxID: orphan, AccessToken: "t", Template: "base"}); err != nil {
		t.Fatal(err)
	}
	// A create in flight: its row (creating) and its sandbox exist, the
	// create has not committed yet.
	now := r.clk.Now()
	inFlight := store.Sandbox{ID: ids.New('i'), TemplateID: "base", State: store.StateCreating, NodeID: "na",
		EnvdAccessToken: "tok", StartedAt: now, EndAt: now.Add(time.Hour)}
	if err := r.st.CreateSandbox(ctx, inFlight); err != nil {
		t.Fatal(err)
	}
	if _, err := n.Node.Create(ctx, nodeapi.CreateRequest{SandboxID: inFlight.ID, AccessToken: "tok", Template: "base"}); err != nil {
		t.Fatal(err)
	}
	// A create that completes while a reconcile runs, after it listed the node.
	var racing control.Sandbox
	n.mu.Lock()
	n.afterList = func() { racing = r.create(r.b, time.Hour) }
	n.mu.Unlock()

	// One replica per node per period.
	if a, b := r.a.ReconcilePass(ctx, time.Minute), r.b.ReconcilePass(ctx, time.Minute); a+b != 1 {
		t.Fatalf("reconciled by A %d, B %d; want once in all", a, b)
	}
	if !r.gone(vanished.ID) {
		t.Fatal("row of a vanished sandbox kept")
	}
	if n.killed(orphan) != 1 {
		t.Fatal("sandbox no row names not killed")
	}
	if n.killed(inFlight.ID) != 0 || r.gone(inFlight.ID) {
		t.Fatal("a create in flight was undone by reconcile")
	}
	if racing.ID == "" || r.gone(racing.ID) || n.killed(racing.ID) != 0 {
		t.Fatalf("a create that completed during the reconcile was undone (%q)", racing.ID)
	}

	// The loop finds what changes later, on its own.
	if err := f.Engine.Kill(ctx, racing.ID); err != nil {
		t.Fatal(err)
	}
	rctx, cancel := context.WithCancel(ctx)
	defer cancel()
	go r.a.RunReconcile(rctx, 20*time.Millisecond)
	deadline := time.Now().Add(30 * time.Second)
	for !r.gone(racing.ID) {
		if time.Now().After(deadline) {
			t.Fatal("periodic reconcile did not drop the row of a vanished sandbox")
		}
		time.Sleep(20 * time.Millisecond)
	}
	if r.gone(inFlight.ID) || n.killed(inFlight.ID) != 0 {
		t.Fatal("periodic reconcile undid a create in flight")
	}
}

// hookStore runs after, once, right after a GetSandbox of that ID has
// read its row (the reaper's re-check), to race it.
type hookStore struct {
	store.Store
	mu    sync.Mutex
	id    string
	after func()
}

func (h *hookStore) GetSandbox(ctx context.Context, id string) (store.Sandbox, error) {
	sb, err := h.Store.GetSandbox(ctx, id)
	h.mu.Lock()
	f := h.after
	if id != h.id {
		f = nil
	} else {
		h.after = nil
	}
	h.mu.Unlock()
	if f != nil {
		f()
	}
	return sb, err
}

// A connect through one replica never loses to the reaper of another: the
// reaper has judged the sandbox expired (its re-check read the row), then
// replica B's connect extends it and answers "running"; the reaper's kill
// must then not happen. It removes the row only at the version it judged
// (DeleteSandboxIf), so B's change wins. Before, the reaper killed it.
func TestConnectOnAnotherReplicaBeatsTheReaper(t *testing.T) {
	for _, backend := range backends {
		t.Run(backend, func(t *testing.T) {
			r := newReplicas(t, backend, 15*time.Second, "na")
			ctx := ctxFor(t)
			sb := r.create(r.a, 10*time.Second)
			r.clk.Add(11 * time.Second)
			hs := &hookStore{Store: r.st, id: sb.ID}
			reaper := control.New(control.Config{Store: hs, Nodes: control.Nodes{"na": r.nodes["na"]}, Now: r.clk.Now, Holder: "C", LeaseTTL: r.ttl})
			t.Cleanup(reaper.Close)
			// The lease is free: A and B hold none yet.
			connected := false
			hs.after = func() {
				got, _, err := r.b.Connect(ctx, sb.ID, 5*time.Minute)
				connected = err == nil && got.State == store.StateRunning
			}
			reaper.ReapExpired(ctx)
			if !connected {
				t.Fatal("the racing connect did not succeed")
			}
			if k := r.nodes["na"].killed(sb.ID); k != 0 || r.gone(sb.ID) {
				t.Fatalf("the reaper killed a sandbox a connect had just extended: %d kills, row gone %v", k, r.gone(sb.ID))
			}
			if _, err := r.nodes["na"].Get(ctx, sb.ID); err != nil {
				t.Fatalf("the sandbox is gone from its node: %v", err)
			}
			// Still reaped once it really expires.
			r.clk.Add(6 * time.Minute)
			reaper.ReapExpired(ctx)
			if k := r.nodes["na"].killed(sb.ID); k != 1 || !r.gone(sb.ID) {
				t.Fatalf("after expiring again: %d kills, row gone %v", k, r.gone(sb.ID))
			}
		})
	}
}

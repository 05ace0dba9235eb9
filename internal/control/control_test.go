package control_test

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/spore-run/spore/internal/control"
	"github.com/spore-run/spore/internal/control/controltest"
	"github.com/spore-run/spore/internal/engine"
	"github.com/spore-run/spore/internal/errdefs"
	"github.com/spore-run/spore/internal/runtime/fake"
	"github.com/spore-run/spore/internal/store"
)

// These tests run the control plane over a fake node (the real engine on
// the fake runtime, see controltest) and a real SQLite store: the fast
// tier's view of timeouts, autoPause, connect, pause and reconcile. The
// real-sandbox equivalents are internal/api TestLifecycle and test/sdk.

// clock is the service's injectable clock, safe for the reaper's
// goroutine.
type clock struct {
	mu sync.Mutex
	t  time.Time
}

func (c *clock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.t
}

func (c *clock) Add(d time.Duration) {
	c.mu.Lock()
	c.t = c.t.Add(d)
	c.mu.Unlock()
}

type harness struct {
	t     *testing.T
	n     *controltest.Node
	nodes control.Nodes // n as the control plane reaches it
	st    store.Store
	ctl   *control.Service
	clk   *clock
}

// newHarness builds the control plane in the test's configuration
// (controltest.ConfigOf): SQLite and the node in process, or PostgreSQL
// and the node over the node protocol.
func newHarness(t *testing.T) *harness {
	t.Helper()
	c := controltest.ConfigOf(t)
	st := c.Store(t)
	h := &harness{t: t, n: controltest.New(t), st: st, clk: &clock{t: time.Date(2030, 1, 1, 0, 0, 0, 0, time.UTC)}}
	h.nodes = control.Nodes{controltest.NodeID: c.Node(t, h.n.Local)}
	h.ctl = control.New(control.Config{Store: st, Nodes: h.nodes, Now: h.clk.Now})
	t.Cleanup(h.ctl.Close)
	return h
}

func ctxFor(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	t.Cleanup(cancel)
	return ctx
}

func (h *harness) create(r control.CreateRequest) control.Sandbox {
	h.t.Helper()
	if r.Timeout == 0 {
		r.Timeout = control.DefaultTimeout
	}
	sb, err := h.ctl.Create(ctxFor(h.t), r)
	if err != nil {
		h.t.Fatalf("create: %v", err)
	}
	return sb
}

// states returns a sandbox's state in the store and on the node ("gone"
// when absent).
func (h *harness) states(id string) (string, string) {
	h.t.Helper()
	ctx := ctxFor(h.t)
	st, ng := "gone", "gone"
	if rec, err := h.st.GetSandbox(ctx, id); err == nil {
		st = rec.State
	} else if !errdefs.IsNotFound(err) {
		h.t.Fatal(err)
	}
	if es, err := h.n.Engine.Get(ctx, id); err == nil {
		ng = string(es.State)
	} else if !errdefs.IsNotFound(err) {
		h.t.Fatal(err)
	}
	return st, ng
}

func (h *harness) nodeState(id string) string {
	h.t.Helper()
	_, n := h.states(id)
	return n
}

func (h *harness) wantStates(id, store, node string) {
	h.t.Helper()
	if s, n := h.states(id); s != store || n != node {
		h.t.Fatalf("%s: store %s, node %s; want %s, %s", id, s, n, store, node)
	}
}

// A timeout kills a sandbox, or hibernates it with autoPause; a paused
// sandbox past its timeout is hibernated; the others are left alone.
func TestTimeouts(t *testing.T) { controltest.Each(t, testTimeouts) }

func testTimeouts(t *testing.T, _ controltest.Config) {
	h := newHarness(t)
	ctx := ctxFor(t)
	killMe := h.create(control.CreateRequest{Timeout: 10 * time.Second})
	keepMe := h.create(control.CreateRequest{Timeout: 10 * time.Second, AutoPause: true})
	paused := h.create(control.CreateRequest{Timeout: 10 * time.Second})
	long := h.create(control.CreateRequest{Timeout: time.Hour})
	if err := h.ctl.Pause(ctx, paused.ID); err != nil {
		t.Fatal(err)
	}
	h.clk.Add(9 * time.Second)
	h.ctl.ReapExpired(ctx)
	h.wantStates(killMe.ID, store.StateRunning, "running")
	h.clk.Add(time.Second) // EndAt reached: "not after now" is expired
	h.ctl.ReapExpired(ctx)
	h.wantStates(killMe.ID, "gone", "gone")
	h.wantStates(keepMe.ID, store.StateHibernated, "hibernated")
	h.wantStates(paused.ID, store.StateHibernated, "hibernated")
	h.wantStates(long.ID, store.StateRunning, "running")
	if _, ok := h.ctl.Target(keepMe.ID); ok {
		t.Fatal("a hibernated sandbox still has a proxy target")
	}
	// Expired again while hibernated: nothing more happens to it.
	h.clk.Add(time.Hour)
	h.ctl.ReapExpired(ctx)
	h.wantStates(keepMe.ID, store.StateHibernated, "hibernated")
	h.wantStates(long.ID, "gone", "gone")
}

// Pause of a paused (or hibernated) sandbox is a conflict, and so is
// hibernating a hibernated one; nothing changes.
func TestPauseConflicts(t *testing.T) { controltest.Each(t, testPauseConflicts) }

func testPauseConflicts(t *testing.T, _ controltest.Config) {
	h := newHarness(t)
	ctx := ctxFor(t)
	sb := h.create(control.CreateRequest{})
	if err := h.ctl.Pause(ctx, sb.ID); err != nil {
		t.Fatal(err)
	}
	if err := h.ctl.Pause(ctx, sb.ID); !errdefs.IsConflict(err) {
		t.Fatalf("pause of paused = %v, want a conflict", err)
	}
	h.wantStates(sb.ID, store.StatePaused, "paused")
	if err := h.ctl.Hibernate(ctx, sb.ID); err != nil {
		t.Fatal(err)
	}
	for name, op := range map[string]func() error{
		"pause":     func() error { return h.ctl.Pause(ctx, sb.ID) },
		"hibernate": func() error { return h.ctl.Hibernate(ctx, sb.ID) },
	} {
		if err := op(); !errdefs.IsConflict(err) {
			t.Fatalf("%s of hibernated = %v, want a conflict", name, err)
		}
	}
	h.wantStates(sb.ID, store.StateHibernated, "hibernated")
	if err := h.ctl.Pause(ctx, "i0000000000000000000"); !errdefs.IsNotFound(err) {
		t.Fatalf("pause of unknown = %v", err)
	}
}

// Connect resumes a paused or hibernated sandbox and only ever extends its
// timeout.
func TestConnect(t *testing.T) { controltest.Each(t, testConnect) }

func testConnect(t *testing.T, _ controltest.Config) {
	h := newHarness(t)
	ctx := ctxFor(t)
	sb := h.create(control.CreateRequest{Timeout: time.Hour})
	end := sb.EndAt
	got, resumed, err := h.ctl.Connect(ctx, sb.ID, 5*time.Second)
	if err != nil || resumed || !got.EndAt.Equal(end) {
		t.Fatalf("connect to running with a shorter timeout: resumed %v, end %v -> %v, %v", resumed, end, got.EndAt, err)
	}
	for _, pause := range []func(context.Context, string) error{h.ctl.Pause, h.ctl.Hibernate} {
		if err := pause(ctx, sb.ID); err != nil {
			t.Fatal(err)
		}
		got, resumed, err = h.ctl.Connect(ctx, sb.ID, 0)
		if err != nil || !resumed || got.State != store.StateRunning || h.nodeState(sb.ID) != "running" || got.Addr == "" {
			t.Fatalf("connect to paused: resumed %v, %+v, %v", resumed, got, err)
		}
		if a, ok := h.ctl.Target(sb.ID); !ok || a.State != store.StateRunning || !a.Addr.IsValid() {
			t.Fatalf("proxy target after connect: %+v %v", a, ok)
		}
	}
	h.clk.Add(2 * time.Hour)
	got, _, err = h.ctl.Connect(ctx, sb.ID, time.Minute)
	if err != nil || !got.EndAt.Equal(h.clk.Now().Add(time.Minute)) {
		t.Fatalf("connect after expiry did not extend to now+1m: %v, %v", got.EndAt, err)
	}
	h.ctl.ReapExpired(ctx)
	h.wantStates(sb.ID, store.StateRunning, "running")
}

// A connect (or a new timeout) never loses to the reaper: whichever
// comes first, a client call that succeeded leaves the sandbox running
// with the new timeout; it is never killed or hibernated under the client
// afterwards. A call that comes after the reaper killed the sandbox gets
// "not found". Each order is forced by holding the first party inside the
// engine with a fake runtime hook while the second one starts.
func TestConnectNeverLosesToReaper(t *testing.T) { controltest.Each(t, testConnectNeverLosesToReaper) }

func testConnectNeverLosesToReaper(t *testing.T, _ controltest.Config) {
	connect := func(h *harness, id string) error {
		_, _, err := h.ctl.Connect(context.Background(), id, time.Hour)
		return err
	}
	setTimeout := func(h *harness, id string) error {
		return h.ctl.SetTimeout(context.Background(), id, time.Hour)
	}
	for _, c := range []struct {
		name         string
		autoPause    bool
		pause        bool    // the sandbox is paused before it expires
		reaperFirst  bool    // the reaper acts first (else the client)
		op           fake.Op // where the first party is held
		client       func(h *harness, id string) error
		mayBeRemoved bool // the client may find the sandbox killed
	}{
		{"reaper kills, then connect", false, false, true, fake.OpKill, connect, true},
		{"reaper kills, then timeout", false, false, true, fake.OpKill, setTimeout, true},
		{"reaper hibernates, then connect", true, false, true, fake.OpPause, connect, false},
		{"connect resumes, then reaper", false, true, false, fake.OpResume, connect, false},
	} {
		t.Run(c.name, func(t *testing.T) {
			h := newHarness(t)
			ctx := ctxFor(t)
			sb := h.create(control.CreateRequest{Timeout: 10 * time.Second, AutoPause: c.autoPause})
			if c.pause {
				if err := h.ctl.Pause(ctx, sb.ID); err != nil {
					t.Fatal(err)
				}
			}
			es, err := h.n.Engine.Get(ctx, sb.ID)
			if err != nil {
				t.Fatal(err)
			}
			reached, release := make(chan struct{}), make(chan struct{})
			var once sync.Once
			h.n.Runtime.Hook(func(op fake.Op, id string) error {
				if op == c.op && id == es.Instance {
					once.Do(func() { close(reached) })
					<-release
				}
				return nil
			})
			h.clk.Add(11 * time.Second)
			reaped, clientErr := make(chan struct{}), make(chan error, 1)
			reap := func() { defer close(reaped); h.ctl.ReapExpired(ctx) }
			call := func() { clientErr <- c.client(h, sb.ID) }
			first, second := reap, call
			if !c.reaperFirst {
				first, second = call, reap
			}
			go first()
			select {
			case <-reached:
			case <-time.After(30 * time.Second):
				t.Fatal("the first party did not reach the engine")
			}
			go second()
			// Let the second party get as far as it can while the first
			// is held (it must wait, or find nothing left to do).
			time.Sleep(200 * time.Millisecond)
			close(release)
			<-reaped
			err = <-clientErr
			h.n.Runtime.Hook(nil)
			st, n := h.states(sb.ID)
			switch {
			case err == nil:
				rec, gerr := h.st.GetSandbox(ctx, sb.ID)
				if gerr != nil || st != store.StateRunning || n != "running" {
					t.Fatalf("the client's call succeeded, then: store %s, node %s (%v); want running", st, n, gerr)
				}
				if !rec.EndAt.After(h.clk.Now()) {
					t.Fatalf("timeout not extended: ends %v, now %v", rec.EndAt, h.clk.Now())
				}
			case c.mayBeRemoved && errdefs.IsNotFound(err) && st == "gone" && n == "gone":
				// The reaper had already killed it: an honest 404.
			default:
				t.Fatalf("client: %v; store %s, node %s", err, st, n)
			}
		})
	}
}

// Reconcile makes the store agree with the node: records of sandboxes the
// node lost go, sandboxes the store does not know are killed, states come
// from the node, and snapshots are listed as the repository holds them.
func TestReconcile(t *testing.T) { controltest.Each(t, testReconcile) }

func testReconcile(t *testing.T, _ controltest.Config) {
	h := newHarness(t)
	ctx := ctxFor(t)
	kept := h.create(control.CreateRequest{})
	lost := h.create(control.CreateRequest{})
	drift := h.create(control.CreateRequest{})
	snap, err := h.ctl.Snapshot(ctx, kept.ID, "keep-me", false)
	if err != nil {
		t.Fatal(err)
	}
	// Behind control's back: the node loses one sandbox, pauses another,
	// runs one the store never heard of, and holds a snapshot the store
	// does not list; the store lists a snapshot the node does not hold.
	if err := h.n.Engine.Kill(ctx, lost.ID); err != nil {
		t.Fatal(err)
	}
	if err := h.n.Engine.Pause(ctx, drift.ID); err != nil {
		t.Fatal(err)
	}
	orphan, err := h.n.Engine.Create(ctx, engine.CreateOptions{Template: "base"})
	if err != nil {
		t.Fatal(err)
	}
	unlisted, err := h.n.Engine.Snapshot(ctx, kept.ID, engine.SnapshotOptions{Names: []string{"unlisted"}})
	if err != nil {
		t.Fatal(err)
	}
	ghost := snap
	ghost.ID, ghost.Names = "s0000000000000000001", nil
	if err := h.st.PutSnapshot(ctx, ghost); err != nil {
		t.Fatal(err)
	}

	// A restarted control plane reconciles.
	ctl := control.New(control.Config{Store: h.st, Nodes: h.nodes, Now: h.clk.Now})
	defer ctl.Close()
	if err := ctl.Reconcile(ctx); err != nil {
		t.Fatal(err)
	}
	h.wantStates(kept.ID, store.StateRunning, "running")
	h.wantStates(lost.ID, "gone", "gone")
	h.wantStates(drift.ID, store.StatePaused, "paused")
	h.wantStates(orphan.ID, "gone", "gone")
	if a, ok := ctl.Target(kept.ID); !ok || a.State != store.StateRunning {
		t.Fatalf("no proxy target for a reconciled running sandbox: %+v", a)
	}
	for id, want := range map[string]bool{snap.ID: true, unlisted.Manifest.ID: true, ghost.ID: false} {
		if _, err := h.st.GetSnapshot(ctx, id); (err == nil) != want {
			t.Errorf("snapshot %s listed = %v, want %v", id, err == nil, want)
		}
	}
}

// A proxy target's Gone channel closes when its instance goes: kill,
// hibernate, rollback (a new instance).
func TestTargetsGone(t *testing.T) { controltest.Each(t, testTargetsGone) }

func testTargetsGone(t *testing.T, _ controltest.Config) {
	h := newHarness(t)
	ctx := ctxFor(t)
	gone := func(id string) <-chan struct{} {
		t.Helper()
		_, running, found, g := h.ctl.Lookup(id)
		if !found || !running {
			t.Fatalf("lookup %s: found %v running %v", id, found, running)
		}
		return g
	}
	closed := func(what string, g <-chan struct{}) {
		t.Helper()
		select {
		case <-g:
		default:
			t.Fatalf("%s did not close the target's Gone", what)
		}
	}
	sb := h.create(control.CreateRequest{})
	sn, err := h.ctl.Snapshot(ctx, sb.ID, "", false)
	if err != nil {
		t.Fatal(err)
	}
	g := gone(sb.ID)
	if _, err := h.ctl.Rollback(ctx, sb.ID, sn.ID); err != nil {
		t.Fatal(err)
	}
	closed("rollback", g)
	g = gone(sb.ID)
	if err := h.ctl.Hibernate(ctx, sb.ID); err != nil {
		t.Fatal(err)
	}
	closed("hibernate", g)
	if _, _, err := h.ctl.Connect(ctx, sb.ID, 0); err != nil {
		t.Fatal(err)
	}
	g = gone(sb.ID)
	if err := h.ctl.Kill(ctx, sb.ID); err != nil {
		t.Fatal(err)
	}
	closed("kill", g)
	if _, _, found, _ := h.ctl.Lookup(sb.ID); found {
		t.Fatal("a killed sandbox is still a proxy target")
	}
}

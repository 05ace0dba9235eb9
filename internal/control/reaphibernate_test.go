package control_test

import (
	"context"
	"math/rand/v2"
	"os"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/spore-run/spore/internal/control"
	"github.com/spore-run/spore/internal/errdefs"
	"github.com/spore-run/spore/internal/nodeapi"
	"github.com/spore-run/spore/internal/store"
)

// The reaper's hibernation (autoPause, or a paused sandbox past its
// timeout) against a connect through another replica: whichever commits
// first in the store wins. A connect that commits first keeps the sandbox
// running (it is not hibernated); a connect after the reaper's claim
// waits for the hibernation and resumes the sandbox. Either way a connect
// that answers "running" leaves a running sandbox.

// jitter sleeps a random short while; seeded, so a failing interleaving
// can be replayed with SPORE_TEST_SEED.
type jitter struct {
	mu  sync.Mutex
	rnd *rand.Rand
}

func newJitter(t *testing.T) *jitter {
	seed := uint64(time.Now().UnixNano())
	if v := os.Getenv("SPORE_TEST_SEED"); v != "" {
		n, err := strconv.ParseUint(v, 10, 64)
		if err != nil {
			t.Fatalf("SPORE_TEST_SEED=%q: %v", v, err)
		}
		seed = n
	}
	t.Logf("seed %d (replay with SPORE_TEST_SEED=%d)", seed, seed)
	return &jitter{rnd: rand.New(rand.NewPCG(seed, seed))}
}

// sleep waits up to 1.5 ms (before each store and node call).
func (j *jitter) sleep() { j.upTo(1500 * time.Microsecond) }

// head waits up to 5 ms (a party's head start).
func (j *jitter) head() { j.upTo(5 * time.Millisecond) }

func (j *jitter) upTo(max time.Duration) {
	if j == nil {
		return
	}
	j.mu.Lock()
	d := time.Duration(j.rnd.Int64N(int64(max)))
	j.mu.Unlock()
	time.Sleep(d)
}

// hibNode counts a node's hibernations and resumes; beforeHibernate, when
// set, runs once before a Hibernate reaches the node.
type hibNode struct {
	nodeapi.Node
	j               *jitter
	mu              sync.Mutex
	hibernates      map[string]int
	resumes         map[string]int
	beforeHibernate func()
}

func (h *hibNode) Hibernate(ctx context.Context, id string) error {
	h.j.sleep()
	h.mu.Lock()
	h.hibernates[id]++
	f := h.beforeHibernate
	h.beforeHibernate = nil
	h.mu.Unlock()
	if f != nil {
		f()
	}
	return h.Node.Hibernate(ctx, id)
}

func (h *hibNode) Resume(ctx context.Context, id string) (nodeapi.Sandbox, error) {
	h.j.sleep()
	h.mu.Lock()
	h.resumes[id]++
	h.mu.Unlock()
	return h.Node.Resume(ctx, id)
}

func (h *hibNode) counts(id string) (hibernates, resumes int) {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.hibernates[id], h.resumes[id]
}

// raceStore delays sandbox reads and writes by its jitter, signals every
// read of the watched sandbox on reads, and runs after once right after a
// read of it.
type raceStore struct {
	store.Store
	j     *jitter
	mu    sync.Mutex
	id    string
	reads chan string
	after func()
}

func (s *raceStore) watch(id string) {
	s.mu.Lock()
	s.id = id
	s.mu.Unlock()
}

func (s *raceStore) GetSandbox(ctx context.Context, id string) (store.Sandbox, error) {
	s.j.sleep()
	sb, err := s.Store.GetSandbox(ctx, id)
	s.mu.Lock()
	var f func()
	if id == s.id {
		f, s.after = s.after, nil
		select {
		case s.reads <- id:
		default:
		}
	}
	s.mu.Unlock()
	if f != nil {
		f()
	}
	return sb, err
}

func (s *raceStore) UpdateSandbox(ctx context.Context, id string, fn func(*store.Sandbox) error) (store.Sandbox, error) {
	s.j.sleep()
	return s.Store.UpdateSandbox(ctx, id, fn)
}

func (s *raceStore) CompareAndSwapSandbox(ctx context.Context, sb store.Sandbox) (store.Sandbox, error) {
	s.j.sleep()
	return s.Store.CompareAndSwapSandbox(ctx, sb)
}

// reapRace is a reaper replica and a connecting replica, each on its own
// store handle, over one counting node.
type reapRace struct {
	*replicas
	node         *hibNode
	reaper, conn *control.Service
	rs, cs       *raceStore
}

func newReapRace(t *testing.T, backend string, j *jitter) *reapRace {
	r := newReplicas(t, backend, 15*time.Second, "na")
	hn := &hibNode{Node: r.nodes["na"], j: j, hibernates: map[string]int{}, resumes: map[string]int{}}
	reg := control.Nodes{"na": hn}
	rs := &raceStore{Store: r.st, j: j, reads: make(chan string, 1)}
	cs := &raceStore{Store: r.stB, j: j, reads: make(chan string, 1)}
	rr := &reapRace{replicas: r, node: hn, rs: rs, cs: cs,
		reaper: control.New(control.Config{Store: rs, Nodes: reg, Now: r.clk.Now, Holder: "C", LeaseTTL: r.ttl}),
		conn:   control.New(control.Config{Store: cs, Nodes: reg, Now: r.clk.Now, Holder: "D", LeaseTTL: r.ttl})}
	t.Cleanup(rr.reaper.Close)
	t.Cleanup(rr.conn.Close)
	return rr
}

// expiring creates a sandbox (autoPause, or paused) and lets its timeout
// pass.
func (r *reapRace) expiring(paused bool) control.Sandbox {
	r.t.Helper()
	ctx := ctxFor(r.t)
	sb, err := r.a.Create(ctx, control.CreateRequest{Timeout: 10 * time.Second, AutoPause: !paused})
	if err != nil {
		r.t.Fatal(err)
	}
	if paused {
		if err := r.a.Pause(ctx, sb.ID); err != nil {
			r.t.Fatal(err)
		}
	}
	r.clk.Add(11 * time.Second)
	return sb
}

type connected struct {
	sb      control.Sandbox
	resumed bool
	err     error
}

// wantRunning checks what a connect that answered promises: the row and
// the node say running, and the timeout is the connect's.
func (r *reapRace) wantRunning(id string, c connected, timeout time.Duration) {
	r.t.Helper()
	ctx := ctxFor(r.t)
	if c.err != nil || c.sb.State != store.StateRunning {
		r.t.Fatalf("connect: %+v, %v; want running", c.sb.Sandbox, c.err)
	}
	row, err := r.st.GetSandbox(ctx, id)
	if err != nil {
		r.t.Fatal(err)
	}
	ns, err := r.node.Get(ctx, id)
	if err != nil {
		r.t.Fatal(err)
	}
	hib, res := r.node.counts(id)
	if row.State != store.StateRunning || ns.State != nodeapi.StateRunning {
		r.t.Fatalf("connect answered running, then: row %s, node %s (%d hibernations, %d resumes)", row.State, ns.State, hib, res)
	}
	if want := r.clk.Now().Add(timeout); row.EndAt.Before(want) {
		r.t.Fatalf("timeout ends %v, want %v", row.EndAt, want)
	}
	if !row.HibernatingAt.IsZero() {
		r.t.Fatalf("a hibernation claim outlived its hibernation: %v", row.HibernatingAt)
	}
}

// The reaper has judged the sandbox expired (it read the row), then a
// connect through the other replica extends it: the reaper must not
// hibernate it (before the fix it did: 1 hibernation, the client's
// "running" sandbox hibernated under it).
func TestConnectOnAnotherReplicaBeatsTheReaperHibernation(t *testing.T) {
	for _, backend := range backends {
		for _, paused := range []bool{false, true} {
			t.Run(backend+"/"+map[bool]string{false: "autopause", true: "paused"}[paused], func(t *testing.T) {
				r := newReapRace(t, backend, nil)
				ctx := ctxFor(t)
				sb := r.expiring(paused)
				var c connected
				r.rs.watch(sb.ID)
				r.rs.after = func() {
					got, resumed, err := r.conn.Connect(ctx, sb.ID, 5*time.Minute)
					c = connected{got, resumed, err}
				}
				r.reaper.ReapExpired(ctx)
				if hib, _ := r.node.counts(sb.ID); hib != 0 {
					t.Errorf("the reaper hibernated a sandbox a connect had just extended (%d hibernations)", hib)
				}
				r.wantRunning(sb.ID, c, 5*time.Minute)
				// Still reaped once it really expires: hibernated
				// (autoPause), or killed (the paused one runs again, and
				// has no autoPause).
				r.clk.Add(6 * time.Minute)
				r.reaper.ReapExpired(ctx)
				hib, _ := r.node.counts(sb.ID)
				if paused {
					if k := r.nodes["na"].killed(sb.ID); hib != 0 || k != 1 || !r.gone(sb.ID) {
						t.Fatalf("after expiring again: %d hibernations, %d kills, row gone %v; want 0, 1, true", hib, k, r.gone(sb.ID))
					}
					return
				}
				if hib != 1 {
					t.Fatalf("after expiring again: %d hibernations, want 1", hib)
				}
				if row, err := r.st.GetSandbox(ctx, sb.ID); err != nil || row.State != store.StateHibernated || !row.HibernatingAt.IsZero() {
					t.Fatalf("after expiring again: %+v, %v; want hibernated, unclaimed", row, err)
				}
			})
		}
	}
}

// The reverse order: the reaper has claimed the row and is hibernating
// when a connect arrives through the other replica. The connect must not
// answer "running" for the sandbox about to be hibernated: it waits for
// the hibernation and resumes it (before the fix it answered running
// without resuming, and the sandbox was hibernated).
func TestConnectAfterTheReapersClaimResumes(t *testing.T) {
	for _, backend := range backends {
		for _, paused := range []bool{false, true} {
			t.Run(backend+"/"+map[bool]string{false: "autopause", true: "paused"}[paused], func(t *testing.T) {
				r := newReapRace(t, backend, nil)
				ctx := ctxFor(t)
				sb := r.expiring(paused)
				_, resumesBefore := r.node.counts(sb.ID)
				done := make(chan connected, 1)
				r.cs.watch(sb.ID)
				r.node.beforeHibernate = func() {
					go func() {
						got, resumed, err := r.conn.Connect(ctx, sb.ID, 5*time.Minute)
						done <- connected{got, resumed, err}
					}()
					// The connect has read the row before the node
					// hibernates the sandbox.
					select {
					case <-r.cs.reads:
					case <-ctx.Done():
					}
				}
				r.reaper.ReapExpired(ctx)
				c := <-done
				if hib, _ := r.node.counts(sb.ID); hib != 1 {
					t.Fatalf("%d hibernations, want 1", hib)
				}
				if !c.resumed {
					t.Errorf("the connect did not resume the sandbox the reaper hibernated")
				}
				if _, res := r.node.counts(sb.ID); res-resumesBefore < 1 {
					t.Errorf("no resume reached the node")
				}
				r.wantRunning(sb.ID, c, 5*time.Minute)
			})
		}
	}
}

// Random interleavings of the reaper's hibernation and a connect through
// another replica (seeded delays before every store and node call): a
// connect that answers "running" always leaves a running sandbox, and the
// sandbox is hibernated at most once.
func TestConnectAndReaperHibernationInterleavings(t *testing.T) {
	for _, backend := range backends {
		t.Run(backend, func(t *testing.T) {
			j := newJitter(t)
			r := newReapRace(t, backend, j)
			ctx := ctxFor(t)
			won := map[bool]int{}
			for round := range 24 {
				sb := r.expiring(round%2 == 1)
				var wg sync.WaitGroup
				var c connected
				wg.Add(2)
				// Either may start first, by up to a few milliseconds.
				go func() { defer wg.Done(); j.head(); r.reaper.ReapExpired(ctx) }()
				go func() {
					defer wg.Done()
					j.head()
					got, resumed, err := r.conn.Connect(ctx, sb.ID, 5*time.Minute)
					c = connected{got, resumed, err}
				}()
				wg.Wait()
				hib, _ := r.node.counts(sb.ID)
				if hib > 1 {
					t.Fatalf("round %d: %d hibernations", round, hib)
				}
				r.wantRunning(sb.ID, c, 5*time.Minute)
				won[hib == 0]++
				if err := r.a.Kill(ctx, sb.ID); err != nil {
					t.Fatal(err)
				}
			}
			t.Logf("connect first %d times, reaper first %d times", won[true], won[false])
		})
	}
}

// A reaper that dies between its claim and its record leaves the claim:
// while it is young a connect waits (and gives up with its context, as
// unavailable) and another reaper leaves the sandbox alone; once it is
// stale the node's state decides: the connect resumes a sandbox the node
// hibernated, and goes on with one it did not.
func TestStaleHibernationClaimIsBroken(t *testing.T) {
	for _, hibernated := range []bool{false, true} {
		t.Run(map[bool]string{false: "died before the node call", true: "died after the node call"}[hibernated], func(t *testing.T) {
			r := newReapRace(t, "sqlite", nil)
			ctx := ctxFor(t)
			sb := r.expiring(false)
			row, err := r.st.GetSandbox(ctx, sb.ID)
			if err != nil {
				t.Fatal(err)
			}
			row.HibernatingAt = r.clk.Now()
			if _, err := r.st.CompareAndSwapSandbox(ctx, row); err != nil {
				t.Fatal(err)
			}
			if hibernated {
				if err := r.node.Node.Hibernate(ctx, sb.ID); err != nil {
					t.Fatal(err)
				}
			}
			// Young: the connect waits, the other reaper does nothing.
			short, cancel := context.WithTimeout(ctx, 200*time.Millisecond)
			_, _, err = r.conn.Connect(short, sb.ID, 5*time.Minute)
			cancel()
			if !errdefs.IsUnavailable(err) {
				t.Fatalf("connect during a live claim: %v; want unavailable", err)
			}
			r.reaper.ReapExpired(ctx)
			if hib, _ := r.node.counts(sb.ID); hib != 0 {
				t.Fatalf("a reaper hibernated a sandbox another reaper had claimed (%d)", hib)
			}
			// Stale: the node decides.
			r.clk.Add(3 * time.Minute)
			got, resumed, err := r.conn.Connect(ctx, sb.ID, 5*time.Minute)
			if resumed != hibernated {
				t.Errorf("resumed %v, want %v", resumed, hibernated)
			}
			r.wantRunning(sb.ID, connected{got, resumed, err}, 5*time.Minute)
		})
	}
}

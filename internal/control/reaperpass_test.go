package control_test

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/spore-run/spore/internal/control"
	"github.com/spore-run/spore/internal/nodeapi"
	"github.com/spore-run/spore/internal/store"
)

// The reaper's pass (issue 30, item 10): a per-sandbox deadline, a few
// sandboxes at a time, its lease renewed while it runs.

// hangNode is a node whose Kill of the sandboxes in hang (or of all, with
// all) blocks until its context ends (or the test ends); it counts the
// kills it got, and how many were in flight at once.
type hangNode struct {
	nodeapi.Node
	release chan struct{}
	once    sync.Once

	mu          sync.Mutex
	hang        map[string]bool
	all         bool
	started     map[string]int
	ended       map[string]error
	hadDeadline map[string]bool
	inFlight    int
	maxInFlight int
	onHang      chan string
}

func newHangNode(t *testing.T, n nodeapi.Node) *hangNode {
	h := &hangNode{Node: n, release: make(chan struct{}), hang: map[string]bool{}, started: map[string]int{},
		ended: map[string]error{}, hadDeadline: map[string]bool{}, onHang: make(chan string, 64)}
	t.Cleanup(h.free)
	return h
}

// free lets the hung kills through to the node.
func (h *hangNode) free() { h.once.Do(func() { close(h.release) }) }

func (h *hangNode) Kill(ctx context.Context, id string) error {
	h.mu.Lock()
	hang := h.all || h.hang[id]
	h.started[id]++
	if hang {
		h.inFlight++
		h.maxInFlight = max(h.maxInFlight, h.inFlight)
	}
	h.mu.Unlock()
	if !hang {
		return h.Node.Kill(ctx, id)
	}
	h.onHang <- id
	var err error
	select {
	case <-ctx.Done():
		err = ctx.Err()
	case <-h.release:
		err = h.Node.Kill(context.WithoutCancel(ctx), id)
	}
	_, dl := ctx.Deadline()
	h.mu.Lock()
	h.inFlight--
	h.ended[id], h.hadDeadline[id] = err, dl
	h.mu.Unlock()
	return err
}

func (h *hangNode) kills(id string) int {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.started[id]
}

// leaseStore counts the reaper lease's grants to holder, and refuses
// them once refuse is set (as when another holder took it).
type leaseStore struct {
	store.Store
	holder string
	mu     sync.Mutex
	grants int
	refuse bool
}

func (s *leaseStore) AcquireLease(ctx context.Context, name, holder string, ttl time.Duration) (bool, error) {
	if name != "reaper" || holder != s.holder {
		return s.Store.AcquireLease(ctx, name, holder, ttl)
	}
	s.mu.Lock()
	refuse := s.refuse
	s.mu.Unlock()
	if refuse {
		return false, nil
	}
	ok, err := s.Store.AcquireLease(ctx, name, holder, ttl)
	if ok && err == nil {
		s.mu.Lock()
		s.grants++
		s.mu.Unlock()
	}
	return ok, err
}

func (s *leaseStore) granted() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.grants
}

// expiredSandboxes creates n sandboxes through r.a, each expiring a
// millisecond after the one before (the reaper lists them in that order),
// and moves the clock past their timeouts.
func expiredSandboxes(r *replicas, n int) []string {
	var ids []string
	for range n {
		ids = append(ids, r.create(r.a, 10*time.Second).ID)
		r.clk.Add(time.Millisecond)
	}
	r.clk.Add(11 * time.Second)
	return ids
}

// reaperOver is a control plane that only reaps, over r's store (or st)
// and node na behind n.
func reaperOver(t *testing.T, r *replicas, st store.Store, n nodeapi.Node, ttl, reapTimeout time.Duration) *control.Service {
	if st == nil {
		st = r.st
	}
	s := control.New(control.Config{Store: st, Nodes: control.Nodes{"na": n}, Now: r.clk.Now, Holder: "R", LeaseTTL: ttl, ReapTimeout: reapTimeout})
	t.Cleanup(s.Close)
	return s
}

// A node that hangs on one sandbox's kill: the other expired sandboxes
// are reaped while it hangs, the pass ends once the hung call reaches its
// deadline (ReapTimeout), and the instance it left (its row went first)
// is freed by the node's reconcile. Before, the pass handled the
// sandboxes one by one with no deadline: stuck on the first (the hung
// one), it reaped none of the others.
func TestReaperHungNodeDoesNotStallThePass(t *testing.T) {
	r := newReplicas(t, "sqlite", 15*time.Second, "na")
	ctx := ctxFor(t)
	ids := expiredSandboxes(r, 6)
	hn := newHangNode(t, r.nodes["na"])
	hung := ids[0] // listed first
	hn.hang[hung] = true
	reaper := reaperOver(t, r, nil, hn, 15*time.Second, time.Second)
	done := make(chan struct{})
	go func() { defer close(done); reaper.ReapExpired(ctx) }()

	waitFor(t, 30*time.Second, "the other expired sandboxes were not reaped while one kill hung", func() bool {
		for _, id := range ids[1:] {
			if !r.gone(id) || r.nodes["na"].killed(id) != 1 {
				return false
			}
		}
		return true
	})
	select {
	case <-done:
	case <-time.After(30 * time.Second):
		t.Fatal("the pass did not end 30 s after a kill hung (no per-sandbox deadline)")
	}
	hn.mu.Lock()
	err, dl := hn.ended[hung], hn.hadDeadline[hung]
	hn.mu.Unlock()
	if !errors.Is(err, context.DeadlineExceeded) || !dl {
		t.Fatalf("the hung kill ended with %v (deadline set: %v), want its deadline", err, dl)
	}
	if !r.gone(hung) {
		t.Fatal("the hung sandbox's row stays")
	}
	if err := r.a.ReconcileNode(ctx, "na"); err != nil {
		t.Fatal(err)
	}
	if r.nodes["na"].killed(hung) != 1 {
		t.Fatal("reconcile did not free the instance the cut kill left")
	}
}

// The pass acts on at most 8 sandboxes at once, and reaches every
// expired sandbox in the one pass even when each kill hangs until its
// deadline. Before, one at a time, and the first hung kill held the rest.
func TestReaperBoundsItsConcurrency(t *testing.T) {
	r := newReplicas(t, "sqlite", 15*time.Second, "na")
	ids := expiredSandboxes(r, 12)
	hn := newHangNode(t, r.nodes["na"])
	hn.all = true
	reaperOver(t, r, nil, hn, 15*time.Second, 2*time.Second).ReapExpired(ctxFor(t))
	hn.mu.Lock()
	defer hn.mu.Unlock()
	if hn.maxInFlight != 8 {
		t.Fatalf("%d kills in flight at once, want 8", hn.maxInFlight)
	}
	for _, id := range ids {
		if hn.started[id] != 1 {
			t.Fatalf("sandbox %s got %d kills in the pass, want 1", id, hn.started[id])
		}
	}
}

// A pass longer than the reaper lease's TTL keeps the lease: it is
// renewed while the pass waits on a slow kill, so another replica cannot
// take it and start reaping the same sandboxes. Before, the lease was
// taken once per pass and lapsed in the middle of a long one.
func TestReaperRenewsItsLeaseDuringAPass(t *testing.T) {
	for _, backend := range backends {
		t.Run(backend, func(t *testing.T) {
			const ttl = 2 * time.Second
			r := newReplicas(t, backend, ttl, "na")
			ctx := ctxFor(t)
			ids := expiredSandboxes(r, 1)
			hn := newHangNode(t, r.nodes["na"])
			hn.hang[ids[0]] = true
			ls := &leaseStore{Store: r.st, holder: "R"}
			reaper := reaperOver(t, r, ls, hn, ttl, time.Minute)
			start := time.Now()
			done := make(chan struct{})
			go func() { defer close(done); reaper.ReapExpired(ctx) }()
			<-hn.onHang
			waitFor(t, 30*time.Second, "the reaper lease was not renewed during the pass", func() bool {
				return time.Since(start) > ttl+ttl/2 && ls.granted() >= 4
			})
			if ok, err := r.stB.AcquireLease(ctx, "reaper", "B", ttl); err != nil || ok {
				t.Fatalf("another replica took the reaper lease during a pass longer than its TTL (%v, %v)", ok, err)
			}
			hn.free()
			<-done
			if !r.gone(ids[0]) || r.nodes["na"].killed(ids[0]) != 1 {
				t.Fatal("the slow kill did not finish in its pass")
			}
		})
	}
}

// A pass whose lease is refused at renewal (another holder has it) stops:
// it takes no new sandbox and its node calls are cut, so no two replicas
// reap at once. Before, nothing renewed or checked the lease during a
// pass.
func TestReaperStopsWhenItLosesTheLease(t *testing.T) {
	const ttl = 1500 * time.Millisecond
	r := newReplicas(t, "sqlite", ttl, "na")
	ids := expiredSandboxes(r, 10)
	hn := newHangNode(t, r.nodes["na"])
	hn.all = true
	ls := &leaseStore{Store: r.st, holder: "R"}
	reaper := reaperOver(t, r, ls, hn, ttl, time.Minute)
	done := make(chan struct{})
	go func() { defer close(done); reaper.ReapExpired(ctxFor(t)) }()
	for range 8 {
		<-hn.onHang
	}
	ls.mu.Lock()
	ls.refuse = true
	ls.mu.Unlock()
	select {
	case <-done:
	case <-time.After(30 * time.Second):
		t.Fatal("the pass went on 30 s after its lease was refused")
	}
	attempted, left := 0, 0
	for _, id := range ids {
		switch k := hn.kills(id); {
		case k == 1:
			attempted++
			hn.mu.Lock()
			err := hn.ended[id]
			hn.mu.Unlock()
			if !errors.Is(err, context.Canceled) {
				t.Fatalf("a kill in flight when the lease was lost ended with %v, want canceled", err)
			}
		case k == 0 && !r.gone(id):
			left++
		default:
			t.Fatalf("sandbox %s: %d kills, row gone %v", id, k, r.gone(id))
		}
	}
	if attempted != 8 || left != 2 {
		t.Fatalf("%d kills attempted and %d sandboxes left for the next holder; want 8 and 2", attempted, left)
	}
}

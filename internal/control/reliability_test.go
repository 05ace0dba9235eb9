package control_test

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/spore-run/spore/internal/control"
	"github.com/spore-run/spore/internal/control/controltest"
	"github.com/spore-run/spore/internal/errdefs"
	"github.com/spore-run/spore/internal/nodeapi"
	"github.com/spore-run/spore/internal/proxy"
	"github.com/spore-run/spore/internal/store"
)

// Reliability fixes of issue 30, item 10 (docs/reliability.md): the
// egress audit's data race, lifetime locks freed, background deletes
// bounded, proxy targets pruned. The reaper's are in reaperpass_test.go.

// waitFor polls cond until it holds, failing the test after d.
func waitFor(t *testing.T, d time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(d)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("after %v: %s", d, what)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// An egress audit over several nodes of which one is lost: the lost
// node's failure was appended to the list the other nodes' goroutines
// append to under a mutex, without it (a data race -race reports, and a
// list that could lose a failure). Now the answer is partial and carries
// what the answering nodes have, however often it is asked.
func TestEgressAuditLostNodeRace(t *testing.T) {
	c := controltest.ConfigOf(t)
	st := c.Store(t)
	base := controltest.New(t).Local
	at := time.Date(2026, 11, 30, 12, 0, 0, 0, time.UTC)
	const id = "iaudited00000000002"
	down := fmt.Errorf("%w: node down (test)", errdefs.ErrUnavailable)
	entries := func(dst string, s int) map[string][]nodeapi.EgressEntry {
		return map[string][]nodeapi.EgressEntry{id: {{At: at.Add(time.Duration(s) * time.Second), Proto: "tcp", Dst: dst, Allowed: true}}}
	}
	// Sorted, the lost node comes last: its failure is recorded while
	// the goroutines of the nodes before it record theirs.
	nodes := control.Nodes{
		"na": auditingNode{Node: base, entries: entries("198.19.1.1:443", 1)},
		"nb": auditingNode{Node: base, err: down},
		"nc": auditingNode{Node: base, err: down},
		"nd": auditingNode{Node: base, entries: entries("198.19.1.4:443", 4)},
		"ne": auditingNode{Node: base, err: down},
		"nz": auditingNode{Node: base, err: errors.New("a lost node was asked")},
	}
	ctl := control.New(control.Config{Store: st, Nodes: nodes})
	t.Cleanup(ctl.Close)
	ctx := ctxFor(t)
	if err := ctl.RegisterNodes(ctx); err != nil {
		t.Fatal(err)
	}
	if _, err := st.UpdateNode(ctx, "nz", func(n *store.Node) error { n.State = store.NodeLost; return nil }); err != nil {
		t.Fatal(err)
	}
	for range 20 {
		es, complete, err := ctl.EgressAudit(ctx, id, time.Time{}, 0)
		if err != nil || complete || len(es) != 2 || es[0].Dst != "198.19.1.1:443" || es[1].Dst != "198.19.1.4:443" {
			t.Fatalf("three nodes down, one lost, two answering: %v complete=%v %+v", err, complete, es)
		}
	}
}

// The lifetime locks (connect, new timeout, reaper) keep no entry for a
// sandbox nobody decides on: after sandboxes are created, connected to,
// given timeouts, reaped or killed, none is left; concurrent lockers of
// the same and different sandboxes (-race) exclude each other per
// sandbox, and a waiter that gives up leaves nothing behind. (This map
// was already freed by reference counts; the guard keeps it so. The lock
// map that was never freed is the egress journal's: internal/netaudit
// TestJournalLocksAreFreed.)
func TestLifetimeLocksAreFreed(t *testing.T) { controltest.Each(t, testLifetimeLocksAreFreed) }

func testLifetimeLocksAreFreed(t *testing.T, _ controltest.Config) {
	h := newHarness(t)
	ctx := ctxFor(t)
	var ids []string
	for i := range 8 {
		sb := h.create(control.CreateRequest{Timeout: time.Duration(10+i) * time.Second})
		ids = append(ids, sb.ID)
		if _, _, err := h.ctl.Connect(ctx, sb.ID, time.Minute); err != nil {
			t.Fatal(err)
		}
		if err := h.ctl.SetTimeout(ctx, sb.ID, time.Duration(10+i)*time.Second); err != nil {
			t.Fatal(err)
		}
	}
	h.clk.Add(14 * time.Second) // half of them expire
	h.ctl.ReapExpired(ctx)
	for _, id := range ids {
		if err := h.ctl.Kill(ctx, id); err != nil && !errdefs.IsNotFound(err) {
			t.Fatal(err)
		}
	}
	if n := h.ctl.LifetimeLocks(); n != 0 {
		t.Fatalf("%d lifetime lock entries left after every sandbox was reaped or killed", n)
	}

	var inside [3]atomic.Int32
	var wg sync.WaitGroup
	for g := range 12 {
		wg.Go(func() {
			for i := range 100 {
				k := (g + i) % 3
				if i%10 == 0 {
					// A waiter that gives up at once.
					gctx, cancel := context.WithCancel(ctx)
					cancel()
					if unlock, err := h.ctl.LockLifetime(gctx, fmt.Sprint("ilock", k)); err == nil {
						unlock()
					}
					continue
				}
				unlock, err := h.ctl.LockLifetime(ctx, fmt.Sprint("ilock", k))
				if err != nil {
					t.Error(err)
					return
				}
				if inside[k].Add(1) != 1 {
					t.Errorf("two holders of sandbox %d's lock", k)
				}
				inside[k].Add(-1)
				unlock()
			}
		})
	}
	wg.Wait()
	if n := h.ctl.LifetimeLocks(); n != 0 {
		t.Fatalf("%d lifetime lock entries left after concurrent lockers ended", n)
	}
}

// hangingDeletes is a node whose DeleteSnapshot of the snapshot in hang
// blocks until its context ends (or the test ends) and reports each such
// call's end.
type hangingDeletes struct {
	nodeapi.Node
	hang    *atomic.Value // string
	release chan struct{}
	ended   chan deleteEnd
}

type deleteEnd struct {
	id          string
	err         error
	hadDeadline bool
}

func (h hangingDeletes) DeleteSnapshot(ctx context.Context, ref string) error {
	if id, _ := h.hang.Load().(string); id != ref {
		return h.Node.DeleteSnapshot(ctx, ref)
	}
	var err error
	select {
	case <-ctx.Done():
		err = ctx.Err()
	case <-h.release:
		err = errors.New("released by the test's end")
	}
	_, dl := ctx.Deadline()
	h.ended <- deleteEnd{ref, err, dl}
	return err
}

// A delete made on the side of an operation, in the background, reaches
// a node that never answers: it ends at its deadline (CleanupTimeout)
// instead of holding its goroutine, and Close, for ever. Two of them:
// the durable copy of a hibernation a connect resumed, and the snapshot
// of a template a new one replaced. Before, both ran with no deadline.
func TestBackgroundDeletesEndAtTheirDeadline(t *testing.T) {
	controltest.Each(t, testBackgroundDeletesEndAtTheirDeadline)
}

func testBackgroundDeletesEndAtTheirDeadline(t *testing.T, c controltest.Config) {
	hang := &atomic.Value{}
	hang.Store("")
	release := make(chan struct{})
	ended := make(chan deleteEnd, 16)
	wrapNode = func(_ string, n nodeapi.Node) nodeapi.Node {
		return hangingDeletes{Node: n, hang: hang, release: release, ended: ended}
	}
	f := newDurableFleet(t, c)
	wrapNode = nil
	t.Cleanup(func() { close(release) })
	ctl := control.New(control.Config{Store: f.st, Nodes: f.nodes, Now: f.clk.Now, CleanupTimeout: 300 * time.Millisecond})
	ctx := ctxFor(t)
	awaitEnd := func(what, id string) {
		t.Helper()
		var e deleteEnd
		for e.id != id {
			select {
			case e = <-ended:
			case <-time.After(30 * time.Second):
				t.Fatalf("%s: a delete hung on its node was still waiting 30 s later (no deadline)", what)
			}
		}
		// Over RPC the caller's deadline may reach the node as the
		// stream's cancellation.
		if !e.hadDeadline || (!errors.Is(e.err, context.DeadlineExceeded) && !errors.Is(e.err, context.Canceled)) {
			t.Fatalf("%s: the hung delete of %s ended with %v (deadline set: %v), want its deadline", what, e.id, e.err, e.hadDeadline)
		}
	}

	sb, err := ctl.Create(ctx, control.CreateRequest{Timeout: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	f.hibernateDurable(sb.ID)
	hib := f.row(sb.ID).Hibernation
	hang.Store(hib)
	if _, resumed, err := ctl.Connect(ctx, sb.ID, 0); err != nil || !resumed {
		t.Fatalf("connect: resumed %v, %v", resumed, err)
	}
	awaitEnd("the resumed hibernation's durable copy", hib)

	src, err := ctl.Create(ctx, control.CreateRequest{Timeout: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	old, err := ctl.Snapshot(ctx, src.ID, "tpl-hung", true)
	if err != nil {
		t.Fatal(err)
	}
	hang.Store(old.ID)
	if _, err := ctl.Snapshot(ctx, src.ID, "tpl-hung", true); err != nil {
		t.Fatal(err)
	}
	awaitEnd("the replaced template's snapshot", old.ID)

	closed := make(chan struct{})
	go func() { defer close(closed); ctl.Close() }()
	select {
	case <-closed:
	case <-time.After(30 * time.Second):
		t.Fatal("Close still waits for background deletes 30 s later")
	}
}

// A replica's proxy targets follow what other replicas do: a sandbox
// resolved through replica A and killed through replica B loses its
// entry in A's map at A's next prune, and A's open stream to it ends
// (its Gone closes). A sandbox hibernated through B goes the same way; a
// lookup through A that finds the row gone drops the entry at once; one
// nobody touched keeps it. Before, A kept such entries, and the streams
// through them, for the life of its process.
func TestTargetsPrunedAfterAKillThroughAnotherReplica(t *testing.T) {
	r := newReplicas(t, "sqlite", 15*time.Second, "na")
	ctx := ctxFor(t)
	lookup := func(id string) <-chan struct{} {
		t.Helper()
		_, running, found, gone := r.a.Lookup(id)
		if !found || !running {
			t.Fatalf("lookup of %s through A: found %v, running %v", id, found, running)
		}
		return gone
	}
	isClosed := func(g <-chan struct{}) bool {
		select {
		case <-g:
			return true
		default:
			return false
		}
	}

	killed := r.create(r.a, time.Hour)
	stream := openStream(t, r.a, killed)
	if err := r.b.Kill(ctx, killed.ID); err != nil {
		t.Fatal(err)
	}
	hibernated := r.create(r.a, time.Hour)
	gHib := lookup(hibernated.ID)
	if err := r.b.Hibernate(ctx, hibernated.ID); err != nil {
		t.Fatal(err)
	}
	kept := r.create(r.b, time.Hour)
	gKept := lookup(kept.ID)
	if _, ok := r.a.Target(killed.ID); !ok {
		t.Fatal("A forgot the target before any prune: the test no longer stages the case")
	}
	select {
	case err := <-stream:
		t.Fatalf("the stream ended before A pruned (%v): the test no longer stages the case", err)
	case <-time.After(200 * time.Millisecond):
	}

	n, err := r.a.PruneTargets(ctx)
	if err != nil || n != 2 {
		t.Fatalf("prune: dropped %d (%v), want the killed and the hibernated sandbox's", n, err)
	}
	for _, id := range []string{killed.ID, hibernated.ID} {
		if _, ok := r.a.Target(id); ok {
			t.Fatalf("A still has a target for %s", id)
		}
	}
	if !isClosed(gHib) || isClosed(gKept) {
		t.Fatalf("Gone closed: hibernated %v (want true), untouched %v (want false)", isClosed(gHib), isClosed(gKept))
	}
	select {
	case <-stream:
	case <-time.After(30 * time.Second):
		t.Fatal("A's stream to the sandbox killed through B did not end after the prune")
	}

	// A lookup miss drops the target at once.
	gone := r.create(r.a, time.Hour)
	g := lookup(gone.ID)
	if err := r.b.Kill(ctx, gone.ID); err != nil {
		t.Fatal(err)
	}
	if _, _, found, _ := r.a.Lookup(gone.ID); found {
		t.Fatal("a killed sandbox found")
	}
	if _, ok := r.a.Target(gone.ID); ok || !isClosed(g) {
		t.Fatalf("after a lookup miss: target kept %v, Gone closed %v", ok, isClosed(g))
	}
	if n := r.a.TargetCount(); n != 1 {
		t.Fatalf("A keeps %d targets, want only the untouched sandbox's", n)
	}
}

// openStream opens a streaming exchange with sandbox sb through a proxy
// over replica res (a server on the sandbox's address writes a line and
// then holds the response open), reads the line, and returns a channel
// that gets the stream's end.
func openStream(t *testing.T, res *control.Service, sb control.Sandbox) <-chan error {
	t.Helper()
	ln, err := net.Listen("tcp", net.JoinHostPort(sb.Addr, "0"))
	if err != nil {
		t.Fatal(err)
	}
	srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		io.WriteString(w, "hello\n")
		w.(http.Flusher).Flush()
		<-r.Context().Done()
	})}
	go srv.Serve(ln)
	t.Cleanup(func() { srv.Close() })
	px := httptest.NewServer(proxy.New(res, nil, nil))
	t.Cleanup(px.Close)
	req, err := http.NewRequestWithContext(ctxFor(t), http.MethodGet, px.URL+"/stream", nil)
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("E2b-Sandbox-Id", sb.ID)
	req.Header.Set("E2b-Sandbox-Port", strconv.Itoa(ln.Addr().(*net.TCPAddr).Port))
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { resp.Body.Close() })
	br := bufio.NewReader(resp.Body)
	if line, err := br.ReadString('\n'); err != nil || line != "hello\n" {
		t.Fatalf("through the proxy: %d %q %v", resp.StatusCode, line, err)
	}
	end := make(chan error, 1)
	go func() {
		_, err := io.Copy(io.Discard, br)
		end <- err
	}()
	return end
}

package control_test

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/spore-run/spore/internal/control/controltest"
	"github.com/spore-run/spore/internal/errdefs"
	"github.com/spore-run/spore/internal/nodeapi"
	"github.com/spore-run/spore/internal/store"
)

// quiescingNode records its Quiesce and Hibernate calls; a Quiesce waits
// until hold is closed (requests in flight on the node), or answers err.
type quiescingNode struct {
	nodeapi.Node
	log  *callLog
	hold chan struct{}
	err  error
}

type callLog struct {
	mu    sync.Mutex
	calls []string
}

func (l *callLog) add(s string) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.calls = append(l.calls, s)
}

func (l *callLog) all() []string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return slices.Clone(l.calls)
}

func (n quiescingNode) Quiesce(ctx context.Context, id string, grace time.Duration) (int, error) {
	n.log.add(fmt.Sprintf("quiesce %s %v", id, grace))
	if n.err != nil {
		return 0, n.err
	}
	select {
	case <-n.hold:
	case <-ctx.Done():
		return 1, nil
	}
	return n.Node.Quiesce(ctx, id, grace)
}

func (n quiescingNode) Hibernate(ctx context.Context, id string) error {
	n.log.add("hibernate " + id)
	return n.Node.Hibernate(ctx, id)
}

// A drain quiesces each running sandbox of the node (its proxy forwards
// it nothing new and the requests in flight end, up to DrainGrace) before
// it hibernates any, so that the hibernation cuts no request; paused
// sandboxes take no traffic and are hibernated without. Before, a drain
// hibernated at once and cut the commands in flight (TestRollingUpgrade:
// the stock SDK's "terminated").
func TestDrainQuiescesBeforeItHibernates(t *testing.T) {
	controltest.Each(t, testDrainQuiescesBeforeItHibernates)
}

func testDrainQuiescesBeforeItHibernates(t *testing.T, c controltest.Config) {
	calls, hold := &callLog{}, make(chan struct{})
	wrapNode = func(id string, n nodeapi.Node) nodeapi.Node {
		if id != "na" {
			return n
		}
		return quiescingNode{Node: n, log: calls, hold: hold}
	}
	f := newDurableFleet(t, c)
	wrapNode = nil
	ctx := ctxFor(t)
	a, b, paused := f.onNode("na"), f.onNode("na"), f.onNode("na")
	if err := f.ctl.Pause(ctx, paused.ID); err != nil {
		t.Fatal(err)
	}
	type result struct {
		n   int
		err error
	}
	done := make(chan result, 1)
	go func() {
		n, err := f.ctl.Drain(ctx, "na")
		done <- result{n, err}
	}()
	want := []string{"quiesce " + a.ID + " 10s", "quiesce " + b.ID + " 10s"}
	deadline := time.Now().Add(10 * time.Second)
	for {
		got := calls.all()
		slices.Sort(got)
		slices.Sort(want)
		if slices.Equal(got, want) {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("calls while the requests are in flight: %q, want both running sandboxes quiesced (DrainGrace 10s) and nothing hibernated", got)
		}
		time.Sleep(5 * time.Millisecond)
	}
	select {
	case r := <-done:
		t.Fatalf("the drain ended (%d, %v) while requests were in flight", r.n, r.err)
	case <-time.After(200 * time.Millisecond):
	}
	if got := calls.all(); len(got) != 2 {
		t.Fatalf("a hibernation began before the requests in flight ended: %q", got)
	}
	close(hold)
	r := <-done
	if r.err != nil || r.n != 3 {
		t.Fatalf("drain: %d hibernated, %v; want 3", r.n, r.err)
	}
	got := calls.all()
	for i, c := range got {
		if strings.HasPrefix(c, "quiesce") && i >= 2 {
			t.Errorf("calls %q: a quiesce after a hibernation", got)
		}
		if c == "quiesce "+paused.ID+" 10s" {
			t.Errorf("the paused sandbox was quiesced: %q", got)
		}
	}
	for _, sb := range []string{a.ID, b.ID, paused.ID} {
		if !slices.Contains(got, "hibernate "+sb) || f.row(sb).State != store.StateHibernated {
			t.Errorf("%s: row %s, calls %q", sb, f.row(sb).State, got)
		}
	}
}

// A node that cannot quiesce (one of the release before, mid-upgrade:
// Unimplemented) is drained as before: every sandbox hibernated.
func TestDrainOfANodeThatCannotQuiesce(t *testing.T) {
	controltest.Each(t, testDrainOfANodeThatCannotQuiesce)
}

func testDrainOfANodeThatCannotQuiesce(t *testing.T, c controltest.Config) {
	calls := &callLog{}
	wrapNode = func(id string, n nodeapi.Node) nodeapi.Node {
		if id != "na" {
			return n
		}
		return quiescingNode{Node: n, log: calls, err: fmt.Errorf("%w: unimplemented: /spore.node.v1.Node/Quiesce", errdefs.ErrInternal)}
	}
	f := newDurableFleet(t, c)
	wrapNode = nil
	ctx := ctxFor(t)
	a := f.onNode("na")
	if n, err := f.ctl.Drain(ctx, "na"); err != nil || n != 1 {
		t.Fatalf("drain: %d, %v; want 1", n, err)
	}
	if got := calls.all(); !slices.Equal(got, []string{"quiesce " + a.ID + " 10s", "hibernate " + a.ID}) || f.row(a.ID).State != store.StateHibernated {
		t.Fatalf("calls %q, row %s", got, f.row(a.ID).State)
	}
}

package control_test

import (
	"context"
	"errors"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"github.com/spore-run/spore/internal/control/controltest"
	"github.com/spore-run/spore/internal/errdefs"
	"github.com/spore-run/spore/internal/nodeapi"
	"github.com/spore-run/spore/internal/store"
)

// auditingNode answers EgressAudit from entries (by sandbox), or fails
// with err.
type auditingNode struct {
	nodeapi.Node
	entries map[string][]nodeapi.EgressEntry
	err     error
}

func (n auditingNode) EgressAudit(_ context.Context, id string, since time.Time, limit int) ([]nodeapi.EgressEntry, error) {
	if n.err != nil {
		return nil, n.err
	}
	es, ok := n.entries[id]
	if !ok {
		return nil, errdefs.NotFoundf("no egress audit for %s", id)
	}
	var out []nodeapi.EgressEntry
	for _, e := range es {
		if !e.At.Before(since) {
			out = append(out, e)
		}
	}
	if limit > 0 && len(out) > limit {
		out = out[len(out)-limit:]
	}
	return out, nil
}

// A sandbox that ran on two nodes: the query asks both (through the node
// contract, in process and over RPC), merges their entries by time and
// keeps the newest limit; a node that cannot be asked makes the answer
// partial (complete false) rather than failing it, unless no node had
// anything; a sandbox no node knows is NotFound, a malformed ID invalid.
func TestEgressAuditAcrossNodes(t *testing.T) {
	controltest.Each(t, testEgressAuditAcrossNodes)
}

func testEgressAuditAcrossNodes(t *testing.T, c controltest.Config) {
	t0 := time.Date(2026, 11, 30, 12, 0, 0, 0, time.UTC)
	at := func(s int) time.Time { return t0.Add(time.Duration(s) * time.Second) }
	const id = "iaudited00000000001"
	var failB error
	var askedB atomic.Int32
	wrapNode = func(nodeID string, n nodeapi.Node) nodeapi.Node {
		if nodeID == "na" {
			return auditingNode{Node: n, entries: map[string][]nodeapi.EgressEntry{id: {
				{At: at(1), Proto: "tcp", Dst: "198.19.1.2:443", Allowed: true, BytesIn: 10},
				{At: at(3), Proto: "tcp", Dst: "198.19.1.3:80", Rule: "deny 198.19.1.3/32"},
			}}}
		}
		return failingAudit{auditingNode{Node: n, entries: map[string][]nodeapi.EgressEntry{id: {
			{At: at(2), Proto: "udp", Dst: "198.19.1.4:53", Allowed: true},
			{At: at(4), Proto: "tcp", Dst: "198.19.1.5:22", Allowed: true, Open: true},
		}}}, &failB, &askedB}
	}
	f := newDurableFleet(t, c)
	wrapNode = nil
	ctx := ctxFor(t)

	es, complete, err := f.ctl.EgressAudit(ctx, id, time.Time{}, 0)
	if err != nil || !complete || len(es) != 4 {
		t.Fatalf("both nodes: %v %v %+v", err, complete, es)
	}
	for i, want := range []string{"198.19.1.2:443", "198.19.1.4:53", "198.19.1.3:80", "198.19.1.5:22"} {
		if es[i].Dst != want {
			t.Fatalf("entry %d is %s, want %s (merged by time): %+v", i, es[i].Dst, want, es)
		}
	}
	if es[0].BytesIn != 10 || es[2].Rule != "deny 198.19.1.3/32" || !es[3].Open {
		t.Fatalf("fields lost on the way: %+v", es)
	}
	if es, _, err := f.ctl.EgressAudit(ctx, id, at(2), 2); err != nil || len(es) != 2 || es[0].Dst != "198.19.1.3:80" || es[1].Dst != "198.19.1.5:22" {
		t.Fatalf("since and limit (the newest): %v %+v", err, es)
	}
	failB = fmt.Errorf("%w: node down (test)", errdefs.ErrUnavailable)
	es, complete, err = f.ctl.EgressAudit(ctx, id, time.Time{}, 0)
	if err != nil || complete || len(es) != 2 {
		t.Fatalf("one node down: %v complete=%v %+v", err, complete, es)
	}
	if _, _, err := f.ctl.EgressAudit(ctx, "iunknown00000000001", time.Time{}, 0); !errdefs.IsUnavailable(err) {
		t.Fatalf("unknown sandbox with a node down (it may be there): %v", err)
	}
	// A node marked lost is not asked (it would only time out: here it
	// would fail the test's way, with this error): its part is missing.
	failB = errors.New("a lost node was asked")
	askedB.Store(0)
	if _, err := f.st.UpdateNode(ctx, "nb", func(n *store.Node) error { n.State = store.NodeLost; return nil }); err != nil {
		t.Fatal(err)
	}
	es, complete, err = f.ctl.EgressAudit(ctx, id, time.Time{}, 0)
	if err != nil || complete || len(es) != 2 {
		t.Fatalf("one node lost: %v complete=%v %+v", err, complete, es)
	}
	if n := askedB.Load(); n != 0 {
		t.Fatalf("the lost node was asked %d times", n)
	}
	if _, err := f.st.UpdateNode(ctx, "nb", func(n *store.Node) error { n.State = store.NodeReady; return nil }); err != nil {
		t.Fatal(err)
	}
	failB = nil
	if _, _, err := f.ctl.EgressAudit(ctx, "iunknown00000000001", time.Time{}, 0); !errdefs.IsNotFound(err) {
		t.Fatalf("unknown sandbox: %v", err)
	}
	if _, _, err := f.ctl.EgressAudit(ctx, "bad..id", time.Time{}, 0); !errdefs.IsInvalidArgument(err) {
		t.Fatalf("malformed ID: %v", err)
	}
}

// failingAudit is an auditingNode whose EgressAudit fails while *err is set.
type failingAudit struct {
	auditingNode
	err   *error
	asked *atomic.Int32
}

func (n failingAudit) EgressAudit(ctx context.Context, id string, since time.Time, limit int) ([]nodeapi.EgressEntry, error) {
	n.asked.Add(1)
	if *n.err != nil {
		return nil, *n.err
	}
	return n.auditingNode.EgressAudit(ctx, id, since, limit)
}

package rpc

import (
	"context"
	"testing"
	"time"

	"github.com/spore-run/spore/internal/nodeapi"
	"github.com/spore-run/spore/internal/timing"
)

// timedNode records phases during a Snapshot, as the engine does.
type timedNode struct{ stubNode }

func (n *timedNode) Snapshot(ctx context.Context, id string, _ nodeapi.SnapshotRequest) (nodeapi.SnapshotInfo, error) {
	timing.FromContext(ctx).Add("checkpoint", 30*time.Millisecond)
	timing.FromContext(ctx).Add("envd", 2*time.Millisecond)
	timing.FromContext(ctx).Add("envd", 3*time.Millisecond)
	return nodeapi.SnapshotInfo{ID: id}, nil
}

// TestPhasesCrossTheHop: the phases a node records during a call reach the
// caller's recorder (summed by name), with the call itself as node-rpc; a
// caller without a recorder is not affected.
func TestPhasesCrossTheHop(t *testing.T) {
	c, _ := client(t, &timedNode{})
	ctx, rec := timing.With(ctxFor(t))
	if _, err := c.Snapshot(ctx, "i1", nodeapi.SnapshotRequest{SnapshotID: "s1"}); err != nil {
		t.Fatal(err)
	}
	got := timing.Parse(rec.Header())
	if got["checkpoint"] != 30 || got["envd"] != 5 {
		t.Fatalf("phases after the hop: %q, want checkpoint 30 ms and envd 5 ms", rec.Header())
	}
	if _, ok := got["node-rpc"]; !ok {
		t.Fatalf("no node-rpc phase: %q", rec.Header())
	}
	if _, err := c.Snapshot(ctxFor(t), "i1", nodeapi.SnapshotRequest{SnapshotID: "s2"}); err != nil {
		t.Fatal(err)
	}
}

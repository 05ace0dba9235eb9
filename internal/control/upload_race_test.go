package control_test

import (
	"context"
	"sync/atomic"
	"testing"
	"time"

	"github.com/spore-run/spore/internal/control/controltest"
	"github.com/spore-run/spore/internal/nodeapi"
	"github.com/spore-run/spore/internal/store"
)

// secondUploadNode answers the second Upload of a snapshot as a node does
// for an upload already finished (nothing added), once the first one's
// result is recorded; the first waits until the second has begun, so
// both read the row while it says "uploading".
type secondUploadNode struct {
	nodeapi.Node
	calls          *atomic.Int32
	secondBegan    chan struct{}
	secondReturned chan struct{}
	firstRecorded  func() bool
}

func (n secondUploadNode) Upload(ctx context.Context, id string) (nodeapi.UploadInfo, error) {
	if n.calls.Add(1) == 1 {
		select {
		case <-n.secondBegan:
		case <-time.After(30 * time.Second):
		}
		return n.Node.Upload(ctx, id)
	}
	close(n.secondBegan)
	defer close(n.secondReturned)
	for deadline := time.Now().Add(30 * time.Second); !n.firstRecorded() && time.Now().Before(deadline); {
		time.Sleep(5 * time.Millisecond)
	}
	return nodeapi.UploadInfo{}, nil
}

// Two uploads of one snapshot ending together (the snapshot's own, and
// RetryUploads' for a row it took for abandoned, which the node answers
// with nothing added): the snapshot stays durable with the bytes the
// first stored. Before, the second wrote 0 over them
// (TestSnapshotsAcrossNodes: "durable snapshot: {... StoredBytes:0}").
func TestConcurrentUploadsKeepTheStoredBytes(t *testing.T) {
	controltest.Each(t, testConcurrentUploads)
}

func testConcurrentUploads(t *testing.T, c controltest.Config) {
	var f *durableFleet
	var snapID atomic.Value
	snapID.Store("")
	calls := new(atomic.Int32)
	secondReturned := make(chan struct{})
	wrapNode = func(id string, n nodeapi.Node) nodeapi.Node {
		if id != "na" {
			return n
		}
		return secondUploadNode{Node: n, calls: calls, secondBegan: make(chan struct{}), secondReturned: secondReturned, firstRecorded: func() bool {
			id := snapID.Load().(string)
			return id != "" && f.snapRow(id).Storage == store.StorageDurable
		}}
	}
	f = newDurableFleet(t, c)
	wrapNode = nil
	ctx := ctxFor(t)
	sb := f.onNode("na")
	sn, err := f.ctl.Snapshot(ctx, sb.ID, "", false)
	if err != nil {
		t.Fatal(err)
	}
	snapID.Store(sn.ID)
	// The snapshot's own upload runs in the background: one of the two
	// waits for the other to begin.
	if err := f.ctl.Upload(ctx, sn.ID); err != nil {
		t.Fatal(err)
	}
	select {
	case <-secondReturned:
	case <-time.After(time.Minute):
		t.Fatalf("the second upload never returned (%d calls)", calls.Load())
	}
	// The second's write follows its return at once: the bytes must not
	// turn to 0 then (they did within milliseconds on the old code).
	for deadline := time.Now().Add(2 * time.Second); time.Now().Before(deadline); time.Sleep(5 * time.Millisecond) {
		if got := f.snapRow(sn.ID); got.Storage != store.StorageDurable || got.StoredBytes <= 0 {
			t.Fatalf("after two uploads: %s with %d bytes stored, want durable with the first's bytes", got.Storage, got.StoredBytes)
		}
	}
}

func (f *durableFleet) snapRow(id string) store.Snapshot {
	sn, err := f.st.GetSnapshot(context.Background(), id)
	if err != nil {
		f.t.Fatal(err)
	}
	return sn
}

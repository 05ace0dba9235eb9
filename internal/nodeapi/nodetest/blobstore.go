package nodetest

import (
	"context"
	"testing"
	"time"

	"github.com/spore-run/spore/internal/errdefs"
	"github.com/spore-run/spore/internal/ids"
	"github.com/spore-run/spore/internal/nodeapi"
)

// testBlobStore: without a blob store, the durability calls answer
// Conflict and Info says so; with one (and a peer sharing it), Upload is
// idempotent, a durable snapshot restores on the peer, a hibernated
// sandbox is adopted by the peer and resumes there, and a delete removes
// the durable copy.
func testBlobStore(t *testing.T, s *suite) {
	info, err := s.n.Info(s.ctx)
	if err != nil {
		t.Fatal(err)
	}
	if s.Peer == nil {
		if info.Durable {
			t.Fatal("a target whose node has a blob store must give a Peer sharing it")
		}
		sb := s.create(nodeapi.CreateRequest{})
		snap := s.snapshot(sb.ID)
		_, err := s.n.Upload(s.ctx, snap.ID)
		wantKind(t, "upload without a blob store", err, errdefs.ErrConflict)
		_, err = s.n.Adopt(s.ctx, nodeapi.AdoptRequest{SandboxID: ids.New('i'), Hibernation: ids.New('h')})
		wantKind(t, "adopt without a blob store", err, errdefs.ErrConflict)
		_, err = s.n.CollectGarbage(s.ctx, nodeapi.GCRequest{Grace: time.Hour})
		wantKind(t, "gc without a blob store", err, errdefs.ErrConflict)
		return
	}
	if !info.Durable {
		t.Fatal("a node with a peer does not say it has a blob store")
	}
	sb := s.create(nodeapi.CreateRequest{})
	snap := s.snapshot(sb.ID)
	up, err := s.n.Upload(s.ctx, snap.ID)
	if err != nil || up.TotalBytes <= 0 {
		t.Fatalf("upload: %+v %v", up, err)
	}
	if again, err := s.n.Upload(s.ctx, snap.ID); err != nil || again.StoredBytes != 0 {
		t.Fatalf("upload replayed: %+v %v", again, err)
	}
	_, err = s.n.Upload(s.ctx, ids.New('s'))
	wantKind(t, "upload of an unknown snapshot", err, errdefs.ErrNotFound)
	_, err = s.n.Upload(s.ctx, "../x")
	wantKind(t, "upload of a bad reference", err, errdefs.ErrInvalidArgument)
	// The peer restores it (fetching it from the store).
	id, tok := mint()
	onPeer, err := s.Peer.Create(s.ctx, nodeapi.CreateRequest{SandboxID: id, AccessToken: tok, Template: snap.ID})
	if err != nil || onPeer.State != nodeapi.StateRunning {
		t.Fatalf("create on the peer from a durable snapshot: %+v %v", onPeer, err)
	}
	defer s.Peer.Kill(context.WithoutCancel(s.ctx), id)
	// A hibernated sandbox moves to the peer.
	mover := s.create(nodeapi.CreateRequest{})
	if err := s.n.Hibernate(s.ctx, mover.ID); err != nil {
		t.Fatal(err)
	}
	hib, err := s.n.Get(s.ctx, mover.ID)
	if err != nil || hib.Hibernation == "" {
		t.Fatalf("hibernated: %+v %v", hib, err)
	}
	_, err = s.Peer.Adopt(s.ctx, nodeapi.AdoptRequest{SandboxID: mover.ID, Hibernation: hib.Hibernation})
	wantKind(t, "adopt before the image is durable", err, errdefs.ErrNotFound)
	if _, err := s.n.Upload(s.ctx, hib.Hibernation); err != nil {
		t.Fatal(err)
	}
	req := nodeapi.AdoptRequest{SandboxID: mover.ID, Hibernation: hib.Hibernation}
	adopted, err := s.Peer.Adopt(s.ctx, req)
	if err != nil || adopted.ID != mover.ID || adopted.State != nodeapi.StateHibernated || adopted.AccessToken != mover.AccessToken {
		t.Fatalf("adopt: %+v %v", adopted, err)
	}
	defer s.Peer.Kill(context.WithoutCancel(s.ctx), mover.ID)
	if again, err := s.Peer.Adopt(s.ctx, req); err != nil || again.ID != mover.ID {
		t.Fatalf("adopt replayed: %+v %v", again, err)
	}
	_, err = s.Peer.Adopt(s.ctx, nodeapi.AdoptRequest{SandboxID: ids.New('i'), Hibernation: hib.Hibernation})
	wantKind(t, "adopt of another sandbox's hibernation", err, errdefs.ErrInvalidArgument)
	if _, err := s.Peer.Resume(s.ctx, mover.ID); err != nil {
		t.Fatal(err)
	}
	if got, err := s.Peer.Get(s.ctx, mover.ID); err != nil || got.State != nodeapi.StateRunning {
		t.Fatalf("the adopted sandbox after resume: %+v %v", got, err)
	}
	if _, err := s.Peer.CollectGarbage(s.ctx, nodeapi.GCRequest{Grace: time.Hour}); err != nil {
		t.Fatalf("gc: %v", err)
	}
	// A delete on the node that took it removes the durable copy too: the
	// peer's copy is the peer's until it deletes it.
	if err := s.n.DeleteSnapshot(s.ctx, snap.ID); err != nil {
		t.Fatal(err)
	}
	if err := s.Peer.DeleteSnapshot(s.ctx, snap.ID); err != nil {
		t.Fatalf("delete of the peer's copy: %v", err)
	}
	wantKind(t, "a third delete", s.Peer.DeleteSnapshot(s.ctx, snap.ID), errdefs.ErrNotFound)
	_, err = s.n.Upload(s.ctx, snap.ID)
	wantKind(t, "upload of a deleted snapshot", err, errdefs.ErrNotFound)
}

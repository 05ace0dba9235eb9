package storetest

import (
	"context"
	"testing"

	"github.com/spore-run/spore/internal/errdefs"
	"github.com/spore-run/spore/internal/store"
)

// testResolveRef: a snapshot's ID beats a snapshot's name, which beats a
// template's name; each of the three is found alone (in one team: see
// teams.go for the others).
func testResolveRef(t *testing.T, s store.Store) {
	ctx := context.Background()
	want := func(ref, kind, id string) {
		t.Helper()
		got, err := s.ResolveRef(ctx, teamA, ref)
		switch {
		case kind == "" && !errdefs.IsNotFound(err):
			t.Fatalf("resolve %q = %+v, %v; want not found", ref, got, err)
		case kind == "":
		case err != nil:
			t.Fatalf("resolve %q: %v", ref, err)
		case (got.Snapshot == nil) == (got.Template == nil):
			t.Fatalf("resolve %q = %+v: want exactly one", ref, got)
		case kind == "snapshot" && (got.Snapshot == nil || got.Snapshot.ID != id):
			t.Fatalf("resolve %q = %+v, want snapshot %s", ref, got, id)
		case kind == "template" && (got.Template == nil || got.Template.SnapshotID != id):
			t.Fatalf("resolve %q = %+v, want the template of %s", ref, got, id)
		}
	}
	want("py", "", "")
	if _, err := s.PutTemplate(ctx, store.Template{Name: "py", SnapshotID: "t-py", NodeIDs: []string{"a"}}); err != nil {
		t.Fatal(err)
	}
	want("py", "template", "t-py")
	if err := s.PutSnapshot(ctx, store.Snapshot{ID: "s1", TeamID: teamA, NodeID: "a", Names: []string{"py"}}); err != nil {
		t.Fatal(err)
	}
	want("py", "snapshot", "s1") // a snapshot's name beats a template's
	want("s1", "snapshot", "s1")
	// A snapshot named like another's ID: the ID wins.
	if err := s.PutSnapshot(ctx, store.Snapshot{ID: "s2", TeamID: teamA, Names: []string{"s1"}}); err != nil {
		t.Fatal(err)
	}
	want("s1", "snapshot", "s1")
	if _, err := s.PutTemplate(ctx, store.Template{Name: "s2", SnapshotID: "t-s2"}); err != nil {
		t.Fatal(err)
	}
	want("s2", "snapshot", "s2") // an ID beats a template's name
	if err := s.DeleteSnapshot(ctx, "s1"); err != nil {
		t.Fatal(err)
	}
	want("py", "template", "t-py")
	want("s1", "snapshot", "s2")
	want("", "", "")
}

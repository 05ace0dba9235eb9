package snapshot

import (
	"os"
	"path/filepath"
	"testing"

	"github.com/spore-run/spore/internal/errdefs"
	"github.com/spore-run/spore/internal/ids"
	"github.com/spore-run/spore/internal/runtime"
)

func stage(t *testing.T, r *Repo, payload string) *Staging {
	t.Helper()
	st, err := r.Stage(ids.New('s'))
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(st.ImageDir(), "checkpoint.img"), []byte(payload), 0o600); err != nil {
		t.Fatal(err)
	}
	return st
}

func TestCommitGetListDelete(t *testing.T) {
	dir := t.TempDir()
	r, err := Open(dir)
	if err != nil {
		t.Fatal(err)
	}
	st := stage(t, r, "image-bytes")
	if _, err := r.Get(st.ID()); !errdefs.IsNotFound(err) {
		t.Fatalf("staged snapshot visible before commit: %v", err)
	}
	want := Manifest{
		Names: []string{"first"}, Kind: KindSnapshot, Origin: "isandbox", Parent: "stemplate",
		Template: "base", RootFS: "base", RootFSID: "r1", Runtime: "gvisor/x",
		Run: RunConfig{Args: []string{"/bin/init"}, Env: []string{"A=1"}, Cwd: "/home/user",
			User: runtime.User{UID: 1000, GID: 1000}, Limits: runtime.Limits{VCPUs: 2, MemoryMB: 512, DiskMB: 1024}},
	}
	m, err := st.Commit(want, CommitOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if m.ID != st.ID() || m.SizeBytes != int64(len("image-bytes")) || m.CreatedAt.IsZero() {
		t.Fatalf("committed manifest %+v", m)
	}
	if _, err := st.Commit(want, CommitOptions{}); !errdefs.IsConflict(err) {
		t.Fatalf("second commit = %v, want conflict", err)
	}
	st.Abort() // no-op after commit
	for _, ref := range []string{m.ID, "first"} {
		got, err := r.Get(ref)
		if err != nil || got.ID != m.ID {
			t.Fatalf("Get(%q) = %+v, %v", ref, got, err)
		}
	}
	if b, err := os.ReadFile(filepath.Join(r.ImageDir(m.ID), "checkpoint.img")); err != nil || string(b) != "image-bytes" {
		t.Fatalf("image = %q, %v", b, err)
	}

	// Survives a reopen, with every field.
	r2, err := Open(dir)
	if err != nil {
		t.Fatal(err)
	}
	got, err := r2.Get("first")
	if err != nil {
		t.Fatal(err)
	}
	if got.Run.Limits != want.Run.Limits || got.Run.Cwd != "/home/user" || got.Origin != "isandbox" ||
		got.Parent != "stemplate" || got.RootFSID != "r1" || !got.CreatedAt.Equal(m.CreatedAt) {
		t.Fatalf("reloaded manifest %+v", got)
	}

	// A second snapshot may not take the name unless asked to move it.
	st2 := stage(t, r2, "two")
	if _, err := st2.Commit(Manifest{Names: []string{"first"}, Kind: KindTemplate}, CommitOptions{}); !errdefs.IsAlreadyExists(err) {
		t.Fatalf("commit with a taken name = %v, want already exists", err)
	}
	m2, err := st2.Commit(Manifest{Names: []string{"first"}, Kind: KindTemplate}, CommitOptions{MoveNames: true})
	if err != nil {
		t.Fatal(err)
	}
	if got, _ := r2.Get("first"); got.ID != m2.ID {
		t.Fatalf("name did not move: %+v", got)
	}
	if old, _ := r2.Get(m.ID); len(old.Names) != 0 {
		t.Fatalf("old holder keeps names %v", old.Names)
	}
	if l := r2.List(); len(l) != 2 || l[0].ID != m.ID || l[1].ID != m2.ID {
		t.Fatalf("List = %+v", l)
	}

	if err := r2.Delete(m.ID); err != nil {
		t.Fatal(err)
	}
	if _, err := r2.Get(m.ID); !errdefs.IsNotFound(err) {
		t.Fatalf("Get after delete = %v", err)
	}
	if err := r2.Delete(m.ID); !errdefs.IsNotFound(err) {
		t.Fatalf("second delete = %v", err)
	}
	if _, err := os.Stat(filepath.Join(dir, m.ID)); !os.IsNotExist(err) {
		t.Fatalf("deleted snapshot's files remain: %v", err)
	}
	r3, _ := Open(dir)
	if l := r3.List(); len(l) != 1 || l[0].ID != m2.ID {
		t.Fatalf("after reopen List = %+v", l)
	}
}

// A crash before the commit's rename leaves nothing visible, and the next
// Open removes the staged files.
func TestCrashBeforeCommitLeavesNothing(t *testing.T) {
	dir := t.TempDir()
	r, _ := Open(dir)
	st := stage(t, r, "partial")
	// Simulate a crash after the manifest was written but before the
	// rename: the process dies, nothing else runs.
	if err := os.WriteFile(filepath.Join(dir, stagingDir, st.ID(), manifestFile), []byte(`{"id":"`+st.ID()+`"}`), 0o600); err != nil {
		t.Fatal(err)
	}
	// And a deletion that died after its rename into the trash.
	st2 := stage(t, r, "x")
	m2, _ := st2.Commit(Manifest{Kind: KindSnapshot}, CommitOptions{})
	if err := os.Rename(filepath.Join(dir, m2.ID), filepath.Join(dir, trashDir, m2.ID)); err != nil {
		t.Fatal(err)
	}
	// And a stray directory with no manifest.
	os.MkdirAll(filepath.Join(dir, "sjunk", "image"), 0o700)

	r2, err := Open(dir)
	if err != nil {
		t.Fatal(err)
	}
	if l := r2.List(); len(l) != 0 {
		t.Fatalf("List after crash = %+v, want empty", l)
	}
	for _, d := range []string{stagingDir, trashDir} {
		ents, _ := os.ReadDir(filepath.Join(dir, d))
		if len(ents) != 0 {
			t.Fatalf("%s not emptied: %v", d, ents)
		}
	}
	if _, err := os.Stat(filepath.Join(dir, "sjunk")); !os.IsNotExist(err) {
		t.Fatalf("stray directory kept: %v", err)
	}
}

func TestBadInput(t *testing.T) {
	dir := t.TempDir()
	r, _ := Open(dir)
	for _, id := range []string{"", "../x", "a/b", "..", "."} {
		if _, err := r.Stage(id); !errdefs.IsInvalidArgument(err) {
			t.Errorf("Stage(%q) = %v", id, err)
		}
		if err := r.Delete(id); !errdefs.IsInvalidArgument(err) {
			t.Errorf("Delete(%q) = %v", id, err)
		}
		if _, err := r.Get(id); !errdefs.IsInvalidArgument(err) {
			t.Errorf("Get(%q) = %v", id, err)
		}
	}
	st := stage(t, r, "x")
	if _, err := st.Commit(Manifest{Names: []string{"../evil"}}, CommitOptions{}); !errdefs.IsInvalidArgument(err) {
		t.Fatalf("commit with a bad name = %v", err)
	}
	st.Abort()
	if _, err := Open("relative/dir"); !errdefs.IsInvalidArgument(err) {
		t.Fatalf("Open(relative) = %v", err)
	}
	// Nothing was created outside the repository.
	if _, err := os.Stat(filepath.Join(filepath.Dir(dir), "x")); !os.IsNotExist(err) {
		t.Fatalf("a file appeared outside the repository")
	}
	if l := r.List(); len(l) != 0 {
		t.Fatalf("List = %+v", l)
	}
}

// TestUnsyncedCommit: a snapshot committed before its image is synced is
// visible at once; Sync makes it durable; reopening the repository in the
// same boot (a process crash) syncs it, and in another boot (a power loss)
// discards it whole.
func TestUnsyncedCommit(t *testing.T) {
	dir := t.TempDir()
	r, err := Open(dir)
	if err != nil {
		t.Fatal(err)
	}
	commit := func(name string) Manifest {
		t.Helper()
		st, err := r.StageUnsynced(ids.New('s'))
		if err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(st.ImageDir(), "checkpoint.img"), []byte("image-of-"+name), 0o600); err != nil {
			t.Fatal(err)
		}
		m, err := st.Commit(Manifest{Names: []string{name}, Kind: KindSnapshot}, CommitOptions{})
		if err != nil {
			t.Fatal(err)
		}
		if got, err := r.Get(name); err != nil || got.ID != m.ID || m.SizeBytes != int64(len("image-of-"+name)) {
			t.Fatalf("Get(%q) = %+v, %v (committed %+v)", name, got, err, m)
		}
		if r.Synced(m.ID) {
			t.Fatalf("%s: synced before Sync", name)
		}
		return m
	}
	a, b, c := commit("a"), commit("b"), commit("c")
	if err := r.Sync(a.ID); err != nil || !r.Synced(a.ID) {
		t.Fatalf("Sync: %v (synced %v)", err, r.Synced(a.ID))
	}
	if err := r.Sync(a.ID); err != nil {
		t.Fatalf("second Sync: %v", err)
	}
	// c was committed in another boot: its image may be partial.
	if err := os.WriteFile(filepath.Join(dir, unsyncedDir, c.ID), []byte("another-boot\n"), 0o600); err != nil {
		t.Fatal(err)
	}

	r2, err := Open(dir)
	if err != nil {
		t.Fatal(err)
	}
	for _, m := range []Manifest{a, b} {
		got, err := r2.Get(m.ID)
		if err != nil || !r2.Synced(m.ID) {
			t.Fatalf("%s after reopening: %+v, %v (synced %v)", m.Names[0], got, err, r2.Synced(m.ID))
		}
		if bs, err := os.ReadFile(filepath.Join(r2.ImageDir(m.ID), "checkpoint.img")); err != nil || string(bs) != "image-of-"+m.Names[0] {
			t.Fatalf("image of %s = %q, %v", m.Names[0], bs, err)
		}
	}
	if _, err := r2.Get(c.ID); !errdefs.IsNotFound(err) {
		t.Fatalf("snapshot of another boot kept: %v", err)
	}
	if _, err := r2.Get("c"); !errdefs.IsNotFound(err) {
		t.Fatalf("its name kept: %v", err)
	}
	if lost := r2.Lost(); len(lost) != 1 || lost[0] != c.ID {
		t.Fatalf("Lost = %v, want [%s]", lost, c.ID)
	}
	if _, err := os.Stat(filepath.Join(dir, c.ID)); !os.IsNotExist(err) {
		t.Fatalf("its files: %v", err)
	}
	// The name is free again.
	d := stage(t, r2, "x")
	if _, err := d.Commit(Manifest{Names: []string{"c"}, Kind: KindSnapshot}, CommitOptions{}); err != nil {
		t.Fatal(err)
	}
	if err := r2.Delete(b.ID); err != nil {
		t.Fatal(err)
	}
	if err := r2.Sync(b.ID); !errdefs.IsNotFound(err) {
		t.Fatalf("Sync of a deleted snapshot = %v, want not found", err)
	}
	// An aborted one leaves no marker; one never committed (a crash
	// mid-write) leaves none behind at the next Open.
	ab, err := r2.StageUnsynced(ids.New('s'))
	if err != nil {
		t.Fatal(err)
	}
	ab.Abort()
	if _, err := os.Stat(filepath.Join(dir, unsyncedDir, ab.ID())); !os.IsNotExist(err) {
		t.Fatalf("marker of an aborted snapshot: %v", err)
	}
	if _, err := r2.StageUnsynced(ids.New('s')); err != nil {
		t.Fatal(err)
	}
	if _, err := Open(dir); err != nil {
		t.Fatal(err)
	}
	if ents, _ := os.ReadDir(filepath.Join(dir, unsyncedDir)); len(ents) != 0 {
		t.Fatalf("markers left: %v", ents)
	}
}

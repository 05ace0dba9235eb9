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

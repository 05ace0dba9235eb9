package local

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/spore-run/spore/internal/blob"
	"github.com/spore-run/spore/internal/blob/blobtest"
	"github.com/spore-run/spore/internal/errdefs"
)

func open(t *testing.T, dir string) *Store {
	t.Helper()
	s, err := Open(dir)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	return s
}

func TestConformance(t *testing.T) {
	blobtest.Run(t, func(t *testing.T) blob.Store { return open(t, t.TempDir()) })
}

// A Put that dies midway (here: its process, simulated by a staging
// directory no open store holds) leaves a temporary file; the next Open
// removes it, and never another open store's.
func TestOpenCleansDeadStaging(t *testing.T) {
	dir := t.TempDir()
	live := open(t, dir)
	dead := filepath.Join(dir, stagingDir, "deadbeef")
	if err := os.MkdirAll(dead, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dead, "partial"), []byte("half an object"), 0o644); err != nil {
		t.Fatal(err)
	}
	liveTmp := filepath.Join(dir, live.staging, "in-flight")
	if err := os.WriteFile(liveTmp, []byte("a put in progress"), 0o644); err != nil {
		t.Fatal(err)
	}
	second := open(t, dir)
	if _, err := os.Stat(dead); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("a dead store's staging directory survived Open: %v", err)
	}
	if _, err := os.Stat(liveTmp); err != nil {
		t.Fatalf("Open removed a live store's temporary file: %v", err)
	}
	if err := second.Close(); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(filepath.Join(dir, second.staging)); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("Close left its staging directory: %v", err)
	}
	entries, _ := os.ReadDir(filepath.Join(dir, objectsDir))
	if len(entries) != 0 {
		t.Fatalf("objects/ holds %d entries, want none", len(entries))
	}
}

// A symbolic link planted in the directory never takes the store outside it.
func TestSymlinkEscape(t *testing.T) {
	dir, outside := t.TempDir(), t.TempDir()
	s := open(t, dir)
	ctx := t.Context()
	if err := os.WriteFile(filepath.Join(outside, "secret"), []byte("secret"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(outside, filepath.Join(dir, objectsDir, "link")); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Get(ctx, "link/secret"); err == nil {
		t.Fatal("Get through a symbolic link out of the store succeeded")
	}
	if err := s.Put(ctx, "link/new", strings.NewReader("x"), 1); err == nil {
		t.Fatal("Put through a symbolic link out of the store succeeded")
	}
	if _, err := os.Stat(filepath.Join(outside, "new")); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("a file appeared outside the store: %v", err)
	}
}

// Keys are paths: "a" and "a/b" cannot both be objects (as in versitygw's
// posix backend); the second Put is a conflict and changes nothing.
func TestObjectAndFolder(t *testing.T) {
	s := open(t, t.TempDir())
	ctx := t.Context()
	if err := s.Put(ctx, "a", strings.NewReader("a"), 1); err != nil {
		t.Fatal(err)
	}
	if err := s.Put(ctx, "a/b", strings.NewReader("b"), 1); !errdefs.IsConflict(err) {
		t.Fatalf("Put a/b under object a: %v, want a conflict", err)
	}
	if err := s.Put(ctx, "c/d", strings.NewReader("d"), 1); err != nil {
		t.Fatal(err)
	}
	if err := s.Put(ctx, "c", strings.NewReader("c"), 1); !errdefs.IsConflict(err) {
		t.Fatalf("Put c over folder c: %v, want a conflict", err)
	}
	if _, err := s.Stat(ctx, "c"); !errdefs.IsNotFound(err) {
		t.Fatalf("Stat of a folder: %v, want not found", err)
	}
	if err := s.Delete(ctx, "c"); err != nil {
		t.Fatalf("Delete of a folder: %v, want nil (no object there)", err)
	}
	rc, err := s.Get(ctx, "c/d")
	if err != nil {
		t.Fatal(err)
	}
	b, _ := io.ReadAll(rc)
	rc.Close()
	if !bytes.Equal(b, []byte("d")) {
		t.Fatalf("c/d = %q", b)
	}
	staged, _ := os.ReadDir(filepath.Join(s.dir, s.staging))
	if len(staged) != 0 {
		t.Fatalf("failed puts left %d temporary files", len(staged))
	}
}

// Delete prunes the folders it empties, so a store that held many keys
// and lost them does not keep an empty tree.
func TestDeletePrunes(t *testing.T) {
	s := open(t, t.TempDir())
	ctx := context.Background()
	if err := s.Put(ctx, "x/y/z", strings.NewReader("z"), 1); err != nil {
		t.Fatal(err)
	}
	if err := s.Delete(ctx, "x/y/z"); err != nil {
		t.Fatal(err)
	}
	entries, _ := os.ReadDir(filepath.Join(s.dir, objectsDir))
	if len(entries) != 0 {
		t.Fatalf("objects/ still holds %v", entries)
	}
}

// A List never fails because a concurrent Delete pruned a directory it is
// walking: between opening a directory and reading it, the last object
// under it may go, and the directory with it. GC lists gc/ while Packs
// and runs delete their markers; a List failed once in CI with
// "readdirent .../objects/gc: no such file or directory".
func TestListWhileDeletesPrune(t *testing.T) {
	ctx := context.Background()
	st, err := Open(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	stop := make(chan struct{})
	done := make(chan struct{})
	go func() {
		defer close(done)
		for i := 0; ; i++ {
			select {
			case <-stop:
				return
			default:
			}
			key := fmt.Sprintf("gc/d%d/run%d.json", i%4, i)
			if err := st.Put(ctx, key, strings.NewReader("{}"), 2); err != nil {
				t.Error(err)
				return
			}
			if err := st.Delete(ctx, key); err != nil {
				t.Error(err)
				return
			}
		}
	}()
	for range 3000 {
		if err := st.List(ctx, "gc/", func(blob.Info) error { return nil }); err != nil {
			close(stop)
			<-done
			t.Fatalf("list while deletes prune: %v", err)
		}
	}
	close(stop)
	<-done
}

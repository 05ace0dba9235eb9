package atomicfs_test

import (
	"context"
	"errors"
	"path/filepath"
	"testing"
	"time"

	"github.com/spore-run/spore/internal/atomicfs"
)

// Lock excludes a second holder (in the same process too) until the first
// releases; a waiter gives up when its ctx ends.
func TestLockExcludesAndHonoursCtx(t *testing.T) {
	path := filepath.Join(t.TempDir(), "x.lock")
	unlock, err := atomicfs.Lock(context.Background(), path)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
	defer cancel()
	if _, err := atomicfs.Lock(ctx, path); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("second lock while held: %v, want the ctx's deadline", err)
	}
	got := make(chan error, 1)
	go func() {
		u, err := atomicfs.Lock(context.Background(), path)
		if err == nil {
			u()
		}
		got <- err
	}()
	unlock()
	select {
	case err := <-got:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("the waiter did not get the lock after the release")
	}
}

package store_test

import (
	"context"
	"path/filepath"
	"testing"

	"github.com/spore-run/spore/internal/errdefs"
	"github.com/spore-run/spore/internal/store"
	"github.com/spore-run/spore/internal/store/sqlite"
	"github.com/spore-run/spore/internal/timing"
)

// TestTimedRecordsStoreCalls: every call through Timed counts as one
// "store" phase of the caller's recorder, errors included, and results
// pass through unchanged; a context without a recorder works as before.
func TestTimedRecordsStoreCalls(t *testing.T) {
	db, err := sqlite.Open(context.Background(), filepath.Join(t.TempDir(), "s.db"))
	if err != nil {
		t.Fatal(err)
	}
	st := store.Timed(db)
	t.Cleanup(func() { st.Close() })
	ctx, rec := timing.With(context.Background())
	if err := st.CreateSandbox(ctx, store.Sandbox{ID: "i1", State: store.StateRunning, NodeID: "n1"}); err != nil {
		t.Fatal(err)
	}
	got, err := st.GetSandbox(ctx, "i1")
	if err != nil || got.ID != "i1" || got.State != store.StateRunning {
		t.Fatalf("get through Timed: %+v %v", got, err)
	}
	if _, err := st.GetSandbox(ctx, "missing"); !errdefs.IsNotFound(err) {
		t.Fatalf("missing sandbox: %v, want not found", err)
	}
	parts := rec.Parts()
	if len(parts) != 1 || parts[0].Name != "store" || parts[0].Count != 3 {
		t.Fatalf("phases %+v, want one store phase of 3 calls", parts)
	}
	if _, err := st.GetSandbox(context.Background(), "i1"); err != nil {
		t.Fatal(err)
	}
}

package sqlite_test

import (
	"context"
	"path/filepath"
	"testing"
	"time"

	"github.com/spore-run/spore/internal/store"
	"github.com/spore-run/spore/internal/store/sqlite"
	"github.com/spore-run/spore/internal/store/storetest"
)

func TestConformance(t *testing.T) {
	storetest.Run(t, func(t *testing.T) store.Store {
		s, err := sqlite.Open(context.Background(), filepath.Join(t.TempDir(), "spore.db"))
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { s.Close() })
		return s
	})
}

// Data survives reopening, and migrations run once.
func TestReopen(t *testing.T) {
	path := filepath.Join(t.TempDir(), "spore.db")
	ctx := context.Background()
	s, err := sqlite.Open(ctx, path)
	if err != nil {
		t.Fatal(err)
	}
	s.CreateSandbox(ctx, store.Sandbox{ID: "i1", State: store.StateRunning, TemplateID: "base", EndAt: time.Now(), Metadata: map[string]string{"k": "v"}})
	s.Close()
	s, err = sqlite.Open(ctx, path)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	l, _, err := s.ListSandboxes(ctx, store.SandboxFilter{Metadata: map[string]string{"k": "v"}})
	if err != nil || len(l) != 1 {
		t.Fatalf("after reopen: %v %v", l, err)
	}
}

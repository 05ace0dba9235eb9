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
	storetest.Run(t, storetest.Backend{
		New: func(t *testing.T) string { return filepath.Join(t.TempDir(), "spore.db") },
		Open: func(t *testing.T, path string) store.Store {
			s, err := sqlite.Open(context.Background(), path)
			if err != nil {
				t.Fatal(err)
			}
			return s
		},
	})
}

// A lease is held until exactly its deadline by the process clock.
func TestLeaseClock(t *testing.T) {
	ctx := context.Background()
	now := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	s, err := sqlite.Open(ctx, filepath.Join(t.TempDir(), "spore.db"), sqlite.WithClock(func() time.Time { return now }))
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	if ok, err := s.AcquireLease(ctx, "reaper", "A", time.Minute); !ok || err != nil {
		t.Fatalf("acquire = %v %v", ok, err)
	}
	now = now.Add(time.Minute - time.Microsecond)
	if ok, _ := s.AcquireLease(ctx, "reaper", "B", time.Minute); ok {
		t.Fatal("taken a microsecond before its deadline")
	}
	now = now.Add(time.Microsecond)
	if ok, _ := s.AcquireLease(ctx, "reaper", "B", time.Minute); !ok {
		t.Fatal("not free at its deadline")
	}
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

// BenchmarkQuotas: storetest.BenchQuotas on SQLite.
//
//	go test -run '^$' -bench Quotas ./internal/store/sqlite/
func BenchmarkQuotas(b *testing.B) {
	s, err := sqlite.Open(context.Background(), filepath.Join(b.TempDir(), "spore.db"))
	if err != nil {
		b.Fatal(err)
	}
	defer s.Close()
	storetest.BenchQuotas(b, s)
}

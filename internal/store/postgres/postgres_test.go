package postgres_test

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/spore-run/spore/internal/errdefs"
	"github.com/spore-run/spore/internal/store"
	"github.com/spore-run/spore/internal/store/postgres"
	"github.com/spore-run/spore/internal/store/storetest"
	"github.com/spore-run/spore/internal/testenv"
)

// TestMain stops the throwaway PostgreSQL cluster after the tests.
func TestMain(m *testing.M) { testenv.Main(m) }

func open(t *testing.T, dsn string) *postgres.DB {
	t.Helper()
	s, err := postgres.Open(context.Background(), dsn)
	if err != nil {
		t.Fatal(err)
	}
	return s
}

func TestConformance(t *testing.T) {
	storetest.Run(t, storetest.Backend{
		New:  func(t *testing.T) string { return testenv.Postgres(t) },
		Open: func(t *testing.T, dsn string) store.Store { return open(t, dsn) },
	})
}

// Replicas starting together on a fresh database migrate it once.
func TestConcurrentMigrate(t *testing.T) {
	dsn := testenv.Postgres(t)
	const n = 4
	errs := make([]error, n)
	var wg sync.WaitGroup
	for i := range n {
		wg.Go(func() {
			s, err := postgres.Open(context.Background(), dsn)
			if err == nil {
				s.Close()
			}
			errs[i] = err
		})
	}
	wg.Wait()
	for i, err := range errs {
		if err != nil {
			t.Errorf("open %d: %v", i, err)
		}
	}
	s := open(t, dsn)
	defer s.Close()
	if err := s.CreateSandbox(context.Background(), store.Sandbox{ID: "x", State: store.StateRunning}); err != nil {
		t.Fatal(err)
	}
}

// An update whose fn fails, or whose context ends, leaves the row as it
// was and no transaction (or row lock) behind: the pool's connections go
// on serving updates of the same row (a leaked lock would block them).
func TestUpdateFailuresLeaveNoTransaction(t *testing.T) {
	s := open(t, testenv.Postgres(t))
	defer s.Close()
	ctx := context.Background()
	if err := s.CreateSandbox(ctx, store.Sandbox{ID: "u1", State: store.StateRunning, NodeID: "n1"}); err != nil {
		t.Fatal(err)
	}
	boom := errors.New("boom")
	for i := range 20 {
		_, err := s.UpdateSandbox(ctx, "u1", func(x *store.Sandbox) error {
			x.State = store.StatePaused
			return boom
		})
		if !errors.Is(err, boom) {
			t.Fatalf("update %d: %v, want fn's error", i, err)
		}
		cctx, cancel := context.WithCancel(ctx)
		_, err = s.UpdateSandbox(cctx, "u1", func(x *store.Sandbox) error {
			cancel() // the context ends between the read and the write
			x.State = store.StatePaused
			return nil
		})
		if err == nil {
			t.Fatalf("update %d with its context cancelled: no error", i)
		}
	}
	got, err := s.GetSandbox(ctx, "u1")
	if err != nil || got.State != store.StateRunning || got.Version != 1 {
		t.Fatalf("after failed updates: %+v %v, want running at version 1", got, err)
	}
	tctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	var wg sync.WaitGroup
	for range 8 {
		wg.Go(func() {
			if _, err := s.UpdateSandbox(tctx, "u1", func(x *store.Sandbox) error { x.EndAt = x.EndAt.Add(time.Second); return nil }); err != nil {
				t.Errorf("update after the failures: %v", err)
			}
		})
	}
	wg.Wait()
	if got, _ := s.GetSandbox(ctx, "u1"); got.Version != 9 || got.EndAt.Sub(time.Time{}) != 8*time.Second {
		t.Fatalf("after 8 concurrent updates: version %d, end %v", got.Version, got.EndAt)
	}
	if _, err := s.UpdateSandbox(ctx, "missing", func(*store.Sandbox) error { return nil }); !errdefs.IsNotFound(err) {
		t.Fatalf("update of a missing row: %v, want not found", err)
	}
}

// BenchmarkUpdateSandbox: one read-modify-write of a sandbox row (two
// round trips: BEGIN + SELECT ... FOR UPDATE, then UPDATE + COMMIT).
//
//	go test -run '^$' -bench BenchmarkUpdateSandbox -benchtime 2000x ./internal/store/postgres/
func BenchmarkUpdateSandbox(b *testing.B) {
	dsn := testenv.Postgres(b)
	s, err := postgres.Open(context.Background(), dsn)
	if err != nil {
		b.Fatal(err)
	}
	defer s.Close()
	ctx := context.Background()
	if err := s.CreateSandbox(ctx, store.Sandbox{ID: "b1", State: store.StateRunning, NodeID: "n1"}); err != nil {
		b.Fatal(err)
	}
	b.ResetTimer()
	for range b.N {
		if _, err := s.UpdateSandbox(ctx, "b1", func(x *store.Sandbox) error { x.Addr = "10.0.0.1"; return nil }); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkCreatePath: the store calls of a create from a template, one
// by one (each one round trip): the name's resolution, the row's insert,
// the swap to running after the node's answer, and a read by ID.
func BenchmarkCreatePath(b *testing.B) {
	s, err := postgres.Open(context.Background(), testenv.Postgres(b))
	if err != nil {
		b.Fatal(err)
	}
	defer s.Close()
	ctx := context.Background()
	if _, err := s.PutTemplate(ctx, store.Template{Name: "py", SnapshotID: "s1", NodeIDs: []string{"n1"}}); err != nil {
		b.Fatal(err)
	}
	row := func(i int) store.Sandbox {
		return store.Sandbox{ID: fmt.Sprintf("c%d", i), State: store.StateCreating, TemplateID: "base", NodeID: "n1",
			EnvdAccessToken: "0123456789abcdef0123456789abcdef0123456789abcdef", Metadata: map[string]string{"user": "u1"},
			EndAt: time.Now().Add(time.Hour), StartedAt: time.Now()}
	}
	b.Run("ResolveRef", func(b *testing.B) {
		for range b.N {
			if _, err := s.ResolveRef(ctx, store.DefaultTeam, "py"); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("ResolveRef/miss", func(b *testing.B) {
		for range b.N {
			if _, err := s.ResolveRef(ctx, store.DefaultTeam, "base"); !errdefs.IsNotFound(err) {
				b.Fatal(err)
			}
		}
	})
	made := 0 // rows created over every run of the sub-benchmark
	b.Run("CreateSandbox", func(b *testing.B) {
		for range b.N {
			if err := s.CreateSandbox(ctx, row(made)); err != nil {
				b.Fatal(err)
			}
			made++
		}
	})
	swapped := 0 // rows swapped to running, each once
	b.Run("CompareAndSwapSandbox", func(b *testing.B) {
		for range b.N {
			if swapped == made {
				b.StopTimer()
				if err := s.CreateSandbox(ctx, row(made)); err != nil {
					b.Fatal(err)
				}
				made++
				b.StartTimer()
			}
			r := row(swapped)
			swapped++
			r.State, r.Addr, r.Version = store.StateRunning, "10.0.0.2", 1
			if _, err := s.CompareAndSwapSandbox(ctx, r); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("GetSandbox", func(b *testing.B) {
		for range b.N {
			if _, err := s.GetSandbox(ctx, "c0"); err != nil {
				b.Fatal(err)
			}
		}
	})
}

// BenchmarkQuotas: storetest.BenchQuotas on PostgreSQL.
//
//	go test -run '^$' -bench Quotas ./internal/store/postgres/
func BenchmarkQuotas(b *testing.B) {
	s, err := postgres.Open(context.Background(), testenv.Postgres(b))
	if err != nil {
		b.Fatal(err)
	}
	defer s.Close()
	storetest.BenchQuotas(b, s)
}

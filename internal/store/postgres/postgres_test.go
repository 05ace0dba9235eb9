package postgres_test

import (
	"context"
	"sync"
	"testing"

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

package gvisor_test

import (
	"context"
	"log/slog"
	"os"
	"testing"

	"github.com/spore-run/spore/internal/runtime/gvisor"
	"github.com/spore-run/spore/internal/runtime/runtimetest"
	"github.com/spore-run/spore/internal/testenv"
)

func TestConformance(t *testing.T) {
	testenv.RequireRoot(t)
	d, err := gvisor.New(context.Background(), gvisor.Config{
		Runsc:    testenv.Runsc(t),
		StateDir: t.TempDir(),
		Logger:   slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn})),
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := d.Purge(context.Background()); err != nil {
			t.Errorf("purge: %v", err)
		}
	})
	runtimetest.Run(t, d, testenv.BaseRootFS(t))
}

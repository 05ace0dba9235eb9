package main

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"

	"github.com/spf13/cobra"

	"github.com/spore-run/spore/internal/engine"
	"github.com/spore-run/spore/internal/runtime"
	"github.com/spore-run/spore/internal/runtime/gvisor"
	"github.com/spore-run/spore/internal/setup"
	"github.com/spore-run/spore/internal/snapshot"
)

// openEngine wires the local engine over the data directory:
// <data>/runtime (runsc state), <data>/snapshots, <data>/engine.
func openEngine(ctx context.Context, dataDir string, log *slog.Logger) (*engine.Engine, error) {
	dataDir, err := filepath.Abs(dataDir)
	if err != nil {
		return nil, err
	}
	drv, err := gvisor.New(ctx, gvisor.Config{
		Runsc: setup.RunscPath(dataDir), StateDir: filepath.Join(dataDir, "runtime"), Logger: log,
	})
	if err != nil {
		return nil, err
	}
	repo, err := snapshot.Open(filepath.Join(dataDir, "snapshots"))
	if err != nil {
		return nil, err
	}
	return engine.Open(ctx, engine.Config{
		Dir: filepath.Join(dataDir, "engine"), RootFSDir: setup.RootFSDir(dataDir),
		Runtime: drv, Snapshots: repo, Logger: log,
	})
}

// defaultTemplates are built on first start when missing.
func defaultTemplates() []engine.TemplateSpec {
	return []engine.TemplateSpec{{
		Name: "base",
		Run: snapshot.RunConfig{
			Args:   []string{"/usr/bin/sleep", "infinity"},
			Env:    []string{"HOME=/home/user"},
			Cwd:    "/home/user",
			User:   runtime.User{UID: 1000, GID: 1000},
			Limits: runtime.Limits{VCPUs: 2, MemoryMB: 1024, MaxProcs: 1024, DiskMB: 2048},
		},
	}}
}

func ensureTemplates(ctx context.Context, eng *engine.Engine, log *slog.Logger) error {
	for _, spec := range defaultTemplates() {
		m, built, err := eng.EnsureTemplate(ctx, spec)
		if err != nil {
			return fmt.Errorf("template %s: %w", spec.Name, err)
		}
		log.Info("template ready", "template_id", spec.Name, "snapshot_id", m.ID, "built", built)
	}
	return nil
}

func newUpCmd(g *globalFlags) *cobra.Command {
	return &cobra.Command{
		Use:   "up",
		Short: "Start the all-in-one server on this host",
		Long: `Start Spore on this host: open the engine (re-attaching to sandboxes that
kept running and recovering interrupted operations), build the default
templates when missing, and serve until interrupted.

The REST API and proxy join this command with the control plane; today it
runs the engine and its recovery.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			ctx := cmd.Context()
			log := slog.New(slog.NewTextHandler(os.Stderr, nil))
			eng, err := openEngine(ctx, g.dataDir, log)
			if err != nil {
				return err
			}
			defer eng.Close()
			if err := ensureTemplates(ctx, eng, log); err != nil {
				return err
			}
			log.Info("spore up", "data_dir", g.dataDir, "sandboxes", len(eng.List(ctx)), "snapshots", len(eng.Snapshots().List()))
			<-ctx.Done()
			log.Info("stopping; sandboxes keep running and are re-attached at the next start")
			return nil
		},
	}
}

package gvisor_test

import (
	"context"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/spore-run/spore/internal/errdefs"
	"github.com/spore-run/spore/internal/ids"
	"github.com/spore-run/spore/internal/runtime"
	"github.com/spore-run/spore/internal/runtime/gvisor"
	"github.com/spore-run/spore/internal/testenv"
)

// TestTornStateIsRemovable: an engine killed while runsc writes an
// instance's state file leaves that file empty or cut short, and runsc can
// then neither load nor delete the instance. Kill (what the engine's
// cleanup journal retries), Recover (what a restarted engine calls) and
// Sweep (run while it recovers) must still remove it: its processes
// killed, its state, directory and cgroups gone. Before the fix every Kill failed with runsc's "FetchSpec
// failed ... unexpected end of JSON input", forever.
func TestTornStateIsRemovable(t *testing.T) {
	testenv.RequireRoot(t)
	for _, tc := range []struct{ name, cgroups, via string }{
		{"runsc-cgroups/kill", "runsc", "kill"},
		{"driver-cgroups/kill", "driver", "kill"},
		{"runsc-cgroups/recover", "runsc", "recover"},
		{"cut-short/kill", "runsc", "kill-cut"},
		{"runsc-cgroups/sweep", "runsc", "sweep"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ctx := context.Background()
			dir := t.TempDir()
			parent := "/spore-torntest-" + ids.New('g')
			// The driver's log in the test's: a failure says what the
			// driver saw (a torn state it could not reap, and why).
			ended := new(atomic.Bool)
			t.Cleanup(func() { ended.Store(true) }) // runs last: after the purge below
			log := slog.New(slog.NewTextHandler(tlog{t, ended}, nil))
			d, err := gvisor.New(ctx, gvisor.Config{Runsc: testenv.Runsc(t), StateDir: dir, CgroupParent: parent, Cgroups: tc.cgroups, Logger: log})
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() {
				if err := d.Purge(context.Background()); err != nil {
					t.Errorf("purge: %v", err)
				}
			})
			id := ids.New('t')
			if err := d.Start(ctx, runtime.Spec{ID: id, RootFS: testenv.BaseRootFS(t), Args: []string{"/bin/sh", "-c", "sleep 1000"},
				Limits: runtime.Limits{VCPUs: 1, MemoryMB: 256, MaxProcs: 64, DiskMB: 256}}); err != nil {
				t.Fatal(err)
			}
			info, err := d.State(ctx, id)
			if err != nil {
				t.Fatal(err)
			}
			m, _ := filepath.Glob(filepath.Join(dir, "root", id+"_sandbox:*.state"))
			if len(m) != 1 {
				t.Fatalf("state files of %s: %v", id, m)
			}
			// Tear it as a SIGKILL mid-write does.
			if tc.via == "kill-cut" {
				b, _ := os.ReadFile(m[0])
				err = os.WriteFile(m[0], b[:len(b)/2], 0o644)
			} else {
				err = os.Truncate(m[0], 0)
			}
			if err != nil {
				t.Fatal(err)
			}
			switch tc.via {
			case "sweep":
				if err := d.Sweep(ctx); err != nil {
					t.Fatalf("sweep: %v", err)
				}
			case "recover":
				if _, err := d.Recover(ctx, id); !errdefs.IsNotFound(err) {
					t.Fatalf("recover of a torn instance = %v, want not found", err)
				}
			default:
				if err := d.Kill(ctx, id); err != nil {
					t.Fatalf("kill of a torn instance: %v", err)
				}
			}
			// Up to 30 s: a killed sandbox exits late on a loaded host.
			deadline := time.Now().Add(30 * time.Second)
			for stillRuns(info.PID) && time.Now().Before(deadline) {
				time.Sleep(10 * time.Millisecond)
			}
			if stillRuns(info.PID) {
				t.Errorf("sandbox process %d still runs 30 s later", info.PID)
			}
			if left, _ := filepath.Glob(filepath.Join(dir, "root", id+"_sandbox:*")); len(left) != 0 {
				t.Errorf("runsc files left: %v", left)
			}
			if _, err := os.Stat(filepath.Join(dir, "inst", id)); !os.IsNotExist(err) {
				t.Errorf("instance directory: %v, want gone", err)
			}
			cgs, _ := filepath.Glob(filepath.Join("/sys/fs/cgroup", "*", parent, id))
			if len(cgs) != 0 {
				t.Errorf("cgroups left: %v", cgs)
			}
			if err := d.Kill(ctx, id); !errdefs.IsNotFound(err) {
				t.Errorf("second kill = %v, want not found", err)
			}
		})
	}
}

// stillRuns reports whether pid runs, from one read of its status (a
// zombie reaped between two reads is not taken for a live process).
func stillRuns(pid int) bool {
	st := procField(pid, "status")
	return st != "" && !strings.Contains(st, "State:\tZ") && !strings.Contains(st, "State:\tX")
}

// tlog writes a driver's log lines into the test's log, until the test
// has ended (a late line from a background goroutine is dropped).
type tlog struct {
	t     *testing.T
	ended *atomic.Bool
}

func (w tlog) Write(p []byte) (int, error) {
	if !w.ended.Load() {
		w.t.Log(strings.TrimRight(string(p), "\n"))
	}
	return len(p), nil
}

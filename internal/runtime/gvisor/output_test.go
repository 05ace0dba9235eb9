package gvisor

import (
	"context"
	"errors"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/spore-run/spore/internal/errdefs"
)

// fakeRunsc writes an executable script standing in for runsc.
func fakeRunsc(t *testing.T, script string) *Driver {
	t.Helper()
	dir := t.TempDir()
	bin := filepath.Join(dir, "runsc")
	if err := os.WriteFile(bin, []byte("#!/bin/sh\n"+script), 0o755); err != nil {
		t.Fatal(err)
	}
	return &Driver{cfg: Config{Runsc: bin, StateDir: dir, Platform: "systrap"}, bin: bin, log: slog.New(slog.DiscardHandler)}
}

// A runsc call that succeeds answers its output even when a process it
// left behind still holds its stdout and stderr (the sandbox of a run, or
// a process that inherited them). With pipes, the call failed after
// WaitDelay with "WaitDelay expired before I/O complete" though runsc had
// exited 0 (a checkpoint under load, once in CI).
func TestRunscOutputHeldByAStraggler(t *testing.T) {
	d := fakeRunsc(t, `echo '{"id":"x"}'; echo note >&2; sleep 30 & exit 0`+"\n")
	start := time.Now()
	out, err := d.runscCmd(context.Background(), d.bin, "", 20*time.Second, nil, "state", "x")
	if err != nil {
		t.Fatalf("a call that exited 0: %v", err)
	}
	if string(out) != "{\"id\":\"x\"}\n" {
		t.Fatalf("output %q", out)
	}
	if took := time.Since(start); took > 10*time.Second {
		t.Fatalf("the call waited for the straggler: %v", took)
	}
	if left, _ := filepath.Glob(filepath.Join(d.cfg.StateDir, "runsc-*")); len(left) != 0 {
		t.Fatalf("output files left in the state directory: %v", left)
	}
}

// A runsc call that fails says what runsc wrote to stderr, and not its
// stdout; a run's (the sandbox's) output goes with runsc's.
func TestRunscFailureCarriesStderr(t *testing.T) {
	d := fakeRunsc(t, `echo stdout-text; echo "boom: no such container" >&2; exit 3`+"\n")
	_, err := d.runscCmd(context.Background(), d.bin, "", 20*time.Second, nil, "delete", "x")
	if !errors.Is(err, errdefs.ErrInternal) || !strings.Contains(err.Error(), "boom: no such container") || strings.Contains(err.Error(), "stdout-text") {
		t.Fatalf("failed delete: %v", err)
	}
	_, err = d.runscCmd(context.Background(), d.bin, "", 20*time.Second, nil, "run", "x")
	if !errors.Is(err, errdefs.ErrInternal) || !strings.Contains(err.Error(), "stdout-text") || !strings.Contains(err.Error(), "boom") {
		t.Fatalf("failed run: %v", err)
	}
}

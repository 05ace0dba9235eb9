package bench

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/spore-run/spore/internal/ids"
	"github.com/spore-run/spore/internal/runtime/gvisor"
)

// Bare runs the runsc commands Spore's operations sit on, directly against
// the server's runsc state (its --root), so each Spore figure has the
// runtime's own figure beside it from the same run on the same sandbox.
type Bare struct {
	Runsc    string // runsc binary
	DataDir  string // the server's data directory
	Platform string // gVisor platform (default systrap)

	once    sync.Once
	version string
}

func (b *Bare) root() string { return filepath.Join(b.DataDir, "runtime", "root") }

// Version is runsc's version as setup recorded it.
func (b *Bare) Version() string {
	b.once.Do(func() {
		b.version, _ = gvisor.Version(context.Background(), b.Runsc)
	})
	return b.version
}

// Check reports whether bare runs can work here.
func (b *Bare) Check() error {
	if _, err := os.Stat(b.Runsc); err != nil {
		return fmt.Errorf("runsc: %w", err)
	}
	if _, err := os.Stat(b.root()); err != nil {
		return fmt.Errorf("server data directory %s: %w", b.DataDir, err)
	}
	return nil
}

// engineRecord is what the bench reads of the engine's record of a
// sandbox in the data directory.
type engineRecord struct {
	Instance string     `json:"instance"`
	Addr     netip.Addr `json:"addr"` // where the host reaches its ports
}

func (b *Bare) record(sandboxID string) (engineRecord, error) {
	var rec engineRecord
	if err := ids.Validate("sandbox ID", sandboxID); err != nil {
		return rec, err
	}
	raw, err := os.ReadFile(filepath.Join(b.DataDir, "engine", "sandboxes", sandboxID+".json"))
	if err != nil {
		return rec, fmt.Errorf("sandbox %s record: %w", sandboxID, err)
	}
	if err := json.Unmarshal(raw, &rec); err != nil {
		return rec, fmt.Errorf("sandbox %s record: %w", sandboxID, err)
	}
	return rec, nil
}

// Instance returns the runtime instance behind a sandbox (from the
// engine's record in the data directory).
func (b *Bare) Instance(sandboxID string) (string, error) {
	rec, err := b.record(sandboxID)
	if err != nil {
		return "", err
	}
	if rec.Instance == "" {
		return "", fmt.Errorf("sandbox %s record names no instance", sandboxID)
	}
	return rec.Instance, nil
}

// Addr returns where this host reaches a sandbox's ports (its envd), from
// the engine's record.
func (b *Bare) Addr(sandboxID string) (netip.Addr, error) {
	rec, err := b.record(sandboxID)
	if err != nil {
		return netip.Addr{}, err
	}
	if !rec.Addr.IsValid() {
		return netip.Addr{}, fmt.Errorf("sandbox %s record has no address (no network, or hibernated)", sandboxID)
	}
	return rec.Addr, nil
}

// ImageDir is where the server keeps a snapshot's checkpoint image.
func (b *Bare) ImageDir(snapshotID string) string {
	return filepath.Join(b.DataDir, "snapshots", snapshotID, "image")
}

// run times one runsc command.
func (b *Bare) run(ctx context.Context, args ...string) (float64, error) {
	platform := b.Platform
	if platform == "" {
		platform = "systrap"
	}
	ctx, cancel := context.WithTimeout(ctx, 5*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, b.Runsc, append([]string{"--root=" + b.root(), "--platform=" + platform}, args...)...)
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	// A restored sandbox inherits stdout and stderr and keeps them open:
	// give every command a file, never a pipe.
	logf, err := os.CreateTemp("", "spore-bench-runsc-*.log")
	if err != nil {
		return 0, err
	}
	os.Remove(logf.Name())
	defer logf.Close()
	cmd.Stdout, cmd.Stderr = logf, logf
	t0 := time.Now()
	err = cmd.Run()
	took := ms(time.Since(t0))
	if err != nil {
		out, _ := io.ReadAll(io.NewSectionReader(logf, 0, 64<<10))
		return 0, fmt.Errorf("bare runsc %s: %v: %s", strings.Join(args, " "), err, bytes.TrimSpace(out))
	}
	return took, nil
}

// Checkpoint times `runsc checkpoint --leave-running` of a live instance.
func (b *Bare) Checkpoint(ctx context.Context, instance string) (float64, error) {
	dir, err := os.MkdirTemp(b.DataDir, "bench-bare-image-")
	if err != nil {
		return 0, err
	}
	defer os.RemoveAll(dir)
	return b.run(ctx, "checkpoint", "--image-path", dir, "--leave-running", instance)
}

// Pause and Resume time `runsc pause` / `runsc resume`.
func (b *Bare) Pause(ctx context.Context, instance string) (float64, error) {
	return b.run(ctx, "pause", instance)
}

// Resume times `runsc resume`.
func (b *Bare) Resume(ctx context.Context, instance string) (float64, error) {
	return b.run(ctx, "resume", instance)
}

// Exec times `runsc exec` of args in a live instance.
func (b *Bare) Exec(ctx context.Context, instance string, args ...string) (float64, error) {
	return b.run(ctx, append([]string{"exec", "--user", "1000:1000", instance}, args...)...)
}

// Restore times `runsc restore -detach` of image into a new instance with
// the bundle of like (same root filesystem, mounts, limits and cgroup
// parent; no network), then deletes it.
func (b *Bare) Restore(ctx context.Context, like, image string) (float64, error) {
	raw, err := os.ReadFile(filepath.Join(b.DataDir, "runtime", "inst", like, "bundle", "config.json"))
	if err != nil {
		return 0, fmt.Errorf("bundle of %s: %w", like, err)
	}
	var spec map[string]any
	if err := json.Unmarshal(raw, &spec); err != nil {
		return 0, fmt.Errorf("bundle of %s: %w", like, err)
	}
	id := "benchbare" + ids.New('x')[1:]
	linux, _ := spec["linux"].(map[string]any)
	if linux == nil {
		return 0, errors.New("bundle has no linux section")
	}
	if cg, ok := linux["cgroupsPath"].(string); ok {
		linux["cgroupsPath"] = filepath.Join(filepath.Dir(cg), id)
	}
	if nss, ok := linux["namespaces"].([]any); ok {
		for _, ns := range nss {
			if m, ok := ns.(map[string]any); ok && m["type"] == "network" {
				delete(m, "path")
			}
		}
	}
	dir, err := os.MkdirTemp(b.DataDir, "bench-bare-inst-")
	if err != nil {
		return 0, err
	}
	defer os.RemoveAll(dir)
	bundle, overlay := filepath.Join(dir, "bundle"), filepath.Join(dir, "overlay")
	for _, d := range []string{bundle, overlay} {
		if err := os.MkdirAll(d, 0o700); err != nil {
			return 0, err
		}
	}
	out, _ := json.Marshal(spec)
	if err := os.WriteFile(filepath.Join(bundle, "config.json"), out, 0o600); err != nil {
		return 0, err
	}
	took, err := b.run(ctx, "--network=none", "--overlay2=root:dir="+overlay+",size=1024m",
		"restore", "-detach", "--image-path", image, "--bundle", bundle, id)
	_, derr := b.run(context.WithoutCancel(ctx), "delete", "-force", id)
	if err != nil {
		return 0, err
	}
	return took, derr
}

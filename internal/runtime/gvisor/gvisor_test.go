package gvisor_test

import (
	"context"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/spore-run/spore/internal/errdefs"
	"github.com/spore-run/spore/internal/ids"
	"github.com/spore-run/spore/internal/runtime"
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

// TestCgroupsApplied checks, in both cgroup modes, that an instance's
// sandbox process runs in its own cgroups with the limits written there,
// and that a kill removes them.
func TestCgroupsApplied(t *testing.T) {
	testenv.RequireRoot(t)
	if _, err := os.Stat("/sys/fs/cgroup/memory/cgroup.procs"); err != nil {
		// Driver-managed cgroups exist only on v1; the hosts Spore is
		// tested on mount it. Fail loudly rather than pass untested.
		t.Fatal("cgroup v1 hierarchies not mounted: this test needs a cgroup v1 host")
	}
	for _, mode := range []string{"runsc", "driver"} {
		t.Run("mode="+mode, func(t *testing.T) {
			ctx := context.Background()
			parent := "/spore-cgtest-" + ids.New('g')
			d, err := gvisor.New(ctx, gvisor.Config{Runsc: testenv.Runsc(t), StateDir: t.TempDir(), CgroupParent: parent, Cgroups: mode})
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { d.Purge(context.Background()) })
			id := ids.New('t')
			lim := runtime.Limits{VCPUs: 1.5, MemoryMB: 384, MaxProcs: 40}
			if err := d.Start(ctx, runtime.Spec{ID: id, RootFS: testenv.BaseRootFS(t), Args: runtimetest.CounterArgs, Limits: lim}); err != nil {
				t.Fatal(err)
			}
			info, err := d.State(ctx, id)
			if err != nil {
				t.Fatal(err)
			}
			want := map[string]string{
				"memory/memory.limit_in_bytes": strconv.Itoa(384 << 20),
				"cpu/cpu.cfs_quota_us":         "150000",
				"pids/pids.max":                "416",
			}
			for file, val := range want {
				ctrl := strings.Split(file, "/")[0]
				dir := filepath.Join("/sys/fs/cgroup", ctrl, parent, id)
				got, err := os.ReadFile(filepath.Join("/sys/fs/cgroup", ctrl, parent, id, filepath.Base(file)))
				if err != nil || strings.TrimSpace(string(got)) != val {
					t.Errorf("%s = %q (%v), want %s", file, got, err, val)
				}
				procs, _ := os.ReadFile(filepath.Join(dir, "cgroup.procs"))
				if !slices.Contains(strings.Fields(string(procs)), strconv.Itoa(info.PID)) {
					t.Errorf("sandbox process %d is not in %s (procs %q)", info.PID, dir, procs)
				}
			}
			// What the guest sees: runsc derives it from the cgroup it
			// manages; with the driver's cgroups it sees the host's.
			var out strings.Builder
			if code, err := d.Exec(ctx, id, runtime.ExecSpec{Args: []string{"/bin/sh", "-c", "grep MemTotal /proc/meminfo"}, Stdout: &out}); err != nil || code != 0 {
				t.Fatalf("exec: %d %v", code, err)
			}
			memTotal := strings.Fields(out.String())
			if len(memTotal) < 2 {
				t.Fatalf("meminfo: %q", out.String())
			}
			kb, _ := strconv.Atoi(memTotal[1])
			if limited := kb == 384<<10; limited != (mode == "runsc") {
				t.Errorf("mode %s: guest MemTotal %d kB (limit %d kB)", mode, kb, 384<<10)
			}
			if err := d.Kill(ctx, id); err != nil {
				t.Fatal(err)
			}
			for _, ctrl := range []string{"memory", "cpu", "pids"} {
				if _, err := os.Stat(filepath.Join("/sys/fs/cgroup", ctrl, parent, id)); !os.IsNotExist(err) {
					t.Errorf("%s cgroup of a killed instance still there: %v", ctrl, err)
				}
			}
		})
	}
}

func TestBadCgroupConfig(t *testing.T) {
	for _, cfg := range []gvisor.Config{
		{Runsc: "/bin/true", StateDir: t.TempDir(), Cgroups: "systemd"},
		{Runsc: "/bin/true", StateDir: t.TempDir(), Cgroups: "driver", CgroupParent: "/it's"},
		{Runsc: "/bin/true", StateDir: t.TempDir(), CgroupParent: "/it's"},
		{Runsc: "/bin/true", StateDir: t.TempDir(), CgroupParent: "relative"},
	} {
		if _, err := gvisor.New(context.Background(), cfg); !errdefs.IsInvalidArgument(err) {
			t.Errorf("New(%+v) = %v, want invalid argument", cfg, err)
		}
	}
}

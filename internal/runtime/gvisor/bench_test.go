package gvisor_test

import (
	"context"
	"fmt"
	"os/exec"
	"path/filepath"
	"testing"
	"time"

	"github.com/spore-run/spore/internal/ids"
	"github.com/spore-run/spore/internal/runtime"
	"github.com/spore-run/spore/internal/runtime/gvisor"
	"github.com/spore-run/spore/internal/runtime/runtimetest"
	"github.com/spore-run/spore/internal/testenv"
)

// BenchmarkRestore times Restore of a small instance's image (the counter
// guest), plain (runsc creates the sandbox and then loads the image) and
// into an instance pre-created beforehand (only the load; the Precreate
// is not timed):
//
//	go test -run '^$' -bench Restore -benchtime 20x ./internal/runtime/gvisor
func BenchmarkRestore(b *testing.B) {
	ctx := context.Background()
	d, src, spec := benchSource(b)
	img := b.TempDir()
	if err := d.Checkpoint(ctx, src.ID, img, runtime.CheckpointOptions{}); err != nil {
		b.Fatal(err)
	}
	for _, pre := range []bool{false, true} {
		name := "plain"
		if pre {
			name = "precreated"
		}
		b.Run(name, func(b *testing.B) {
			for b.Loop() {
				s := spec(ids.New('t'))
				if pre {
					b.StopTimer()
					if err := d.Precreate(ctx, s); err != nil {
						b.Fatal(err)
					}
					b.StartTimer()
				}
				if err := d.Restore(ctx, s, img); err != nil {
					b.Fatal(err)
				}
				b.StopTimer()
				if err := d.Kill(ctx, s.ID); err != nil {
					b.Fatal(err)
				}
				b.StartTimer()
			}
		})
	}
}

// BenchmarkCheckpoint times a live checkpoint (--leave-running) of a small
// instance (the counter guest), the call a snapshot's pause sits in:
//
//	go test -run '^$' -bench Checkpoint -benchtime 20x ./internal/runtime/gvisor
func BenchmarkCheckpoint(b *testing.B) {
	ctx := context.Background()
	d, src, _ := benchSource(b)
	for b.Loop() {
		b.StopTimer()
		img := b.TempDir()
		b.StartTimer()
		if err := d.Checkpoint(ctx, src.ID, img, runtime.CheckpointOptions{LeaveRunning: true}); err != nil {
			b.Fatal(err)
		}
	}
}

// benchSource starts a counter instance in a driver of its own; spec
// makes more specs of its shape.
func benchSource(b *testing.B) (d *gvisor.Driver, src runtime.Spec, spec func(id string) runtime.Spec) {
	testenv.RequireRoot(b)
	ctx := context.Background()
	d, err := gvisor.New(ctx, gvisor.Config{Runsc: testenv.Runsc(b), StateDir: b.TempDir()})
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { d.Purge(context.Background()) })
	spec = func(id string) runtime.Spec {
		return runtime.Spec{ID: id, RootFS: testenv.BaseRootFS(b), Args: runtimetest.CounterArgs, Limits: runtime.Limits{MemoryMB: 512, DiskMB: 256}}
	}
	src = spec(ids.New('t'))
	if err := d.Start(ctx, src); err != nil {
		b.Fatal(err)
	}
	return d, src, spec
}

// dirtyArgs is a guest holding mb MiB of random (incompressible, non-zero)
// memory; it writes /tmp/dirty once the memory is in.
func dirtyArgs(mb int) []string {
	return []string{"/usr/bin/python3", "-c", fmt.Sprintf(`import os, time
b = os.urandom(1 << 20)
hold = [bytearray(b) for _ in range(%d)]
open("/tmp/dirty", "w").write("ok")
while True:
    time.sleep(3600)
`, mb)}
}

// BenchmarkRestoreDirty restores the image of a guest holding 0.1 to 1 GiB,
// loading its memory before the restore returns and in the background
// (Config.BackgroundLoadBytes), and reports when the sandbox first runs a
// command (ready-ms) and when all its memory is in (`runsc wait --restore`,
// loaded-ms):
//
//	go test -run '^$' -bench RestoreDirty -benchtime 3x ./internal/runtime/gvisor
func BenchmarkRestoreDirty(b *testing.B) {
	testenv.RequireRoot(b)
	for _, mb := range []int{0, 64, 256, 1024} {
		for _, bg := range []bool{false, true} {
			restoreDirty(b, mb, bg)
		}
	}
}

func restoreDirty(b *testing.B, mb int, bg bool) {
	ctx := context.Background()
	name, load := "loaded", int64(-1)
	if bg {
		name, load = "background", 1
	}
	b.Run(fmt.Sprintf("%dMB/%s", mb, name), func(b *testing.B) {
		state := b.TempDir()
		d, err := gvisor.New(ctx, gvisor.Config{Runsc: testenv.Runsc(b), StateDir: state, BackgroundLoadBytes: load})
		if err != nil {
			b.Fatal(err)
		}
		b.Cleanup(func() { d.Purge(context.Background()) })
		spec := func(id string) runtime.Spec {
			return runtime.Spec{ID: id, RootFS: testenv.BaseRootFS(b), Args: dirtyArgs(mb), Limits: runtime.Limits{MemoryMB: int64(2*mb + 512), DiskMB: 256}}
		}
		src := spec(ids.New('t'))
		if err := d.Start(ctx, src); err != nil {
			b.Fatal(err)
		}
		for i := 0; ; i++ {
			if code, err := d.Exec(ctx, src.ID, runtime.ExecSpec{Args: []string{"/bin/test", "-s", "/tmp/dirty"}}); err == nil && code == 0 {
				break
			}
			if i > 600 {
				b.Fatal("the guest did not dirty its memory")
			}
			time.Sleep(100 * time.Millisecond)
		}
		img := b.TempDir()
		if err := d.Checkpoint(ctx, src.ID, img, runtime.CheckpointOptions{}); err != nil {
			b.Fatal(err)
		}
		var ready, loaded time.Duration
		for b.Loop() {
			s := spec(ids.New('t'))
			t0 := time.Now()
			if err := d.Restore(ctx, s, img); err != nil {
				b.Fatal(err)
			}
			b.StopTimer()
			if code, err := d.Exec(ctx, s.ID, runtime.ExecSpec{Args: []string{"/bin/true"}}); err != nil || code != 0 {
				b.Fatalf("exec after restore: %d, %v", code, err)
			}
			ready += time.Since(t0)
			if out, err := exec.Command(testenv.Runsc(b), "--root="+filepath.Join(state, "root"), "wait", "--restore", s.ID).CombinedOutput(); err != nil {
				b.Fatalf("runsc wait --restore: %v: %s", err, out)
			}
			loaded += time.Since(t0)
			if err := d.Kill(ctx, s.ID); err != nil {
				b.Fatal(err)
			}
			b.StartTimer()
		}
		b.ReportMetric(float64(ready.Milliseconds())/float64(b.N), "ready-ms")
		b.ReportMetric(float64(loaded.Milliseconds())/float64(b.N), "loaded-ms")
	})
}

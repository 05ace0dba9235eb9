package gvisor_test

import (
	"context"
	"testing"

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

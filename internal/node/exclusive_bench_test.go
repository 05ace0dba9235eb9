package node_test

import (
	"context"
	"testing"
	"time"

	"github.com/spore-run/spore/internal/engine"
	"github.com/spore-run/spore/internal/node"
	"github.com/spore-run/spore/internal/nodeapi"
)

// Snapshot, rollback and a fork of 10 of a sandbox holding a 1 GiB
// exclusive volume, half of it rewritten (untimed) before each, beside
// the same sandbox without a volume (docs/volumes.md, issue 31's goal:
// within 1.2x):
//
//	go test -run '^$' -bench ExclusiveVolume -benchtime 5x ./internal/node/
//
// "1GiB" rewrites 512 MiB just before each operation (the capture writes
// it back first); "1GiB-written-back" syncs it first (a volume written a
// while ago). Snapshots report how long the sandbox was paused too.
func BenchmarkExclusiveVolume(b *testing.B) {
	e := newEnv(b)
	ctx := context.Background()
	plain, err := e.n.Engine.Create(ctx, engine.CreateOptions{Template: node.TemplateBase})
	if err != nil {
		b.Fatal(err)
	}
	vols, err := e.n.PrepareVolumes(ctx, []nodeapi.VolumeMount{{VolumeID: "vbenchexclusive0001", SizeBytes: 1 << 30, Path: "/work", Exclusive: true}})
	if err != nil {
		b.Fatal(err)
	}
	withVol, err := e.n.Engine.Create(ctx, engine.CreateOptions{Template: node.TemplateBase, Volumes: vols})
	if err != nil {
		b.Fatal(err)
	}
	e.sh(ctx, withVol.ID, "dd if=/dev/urandom of=/work/a bs=1M count=512 2>/dev/null && dd if=/dev/urandom of=/work/b bs=1M count=256 2>/dev/null && sync")
	synced := false
	dirty := func(b *testing.B, id string) {
		if id == withVol.ID {
			b.StopTimer()
			cmd := "dd if=/dev/urandom of=/work/a bs=1M count=512 conv=notrunc 2>/dev/null"
			if synced {
				cmd += " && sync" // written back: what a volume written a while ago is
			}
			e.sh(ctx, id, cmd)
			b.StartTimer()
		}
	}
	for _, c := range []struct {
		name   string
		id     string
		synced bool
	}{{"none", plain.ID, false}, {"1GiB", withVol.ID, false}, {"1GiB-written-back", withVol.ID, true}} {
		synced = c.synced
		snapID := ""
		b.Run("snapshot/"+c.name, func(b *testing.B) {
			ds, ps := make([]time.Duration, 0, b.N), make([]time.Duration, 0, b.N)
			for range b.N {
				dirty(b, c.id)
				t0 := time.Now()
				s, err := e.n.Engine.Snapshot(ctx, c.id, engine.SnapshotOptions{})
				ds, ps = append(ds, time.Since(t0)), append(ps, s.Paused)
				if err != nil {
					b.Fatal(err)
				}
				if snapID != "" {
					e.n.Engine.DeleteSnapshot(ctx, snapID)
				}
				snapID = s.Manifest.ID
			}
			quantiles(b, ps, "paused-ms")
			quantiles(b, ds, "ms")
		})
		b.Run("rollback/"+c.name, func(b *testing.B) {
			ds := make([]time.Duration, 0, b.N)
			for range b.N {
				dirty(b, c.id)
				t0 := time.Now()
				_, err := e.n.Engine.Rollback(ctx, c.id, snapID)
				ds = append(ds, time.Since(t0))
				if err != nil {
					b.Fatal(err)
				}
			}
			quantiles(b, ds, "ms")
		})
		b.Run("fork-10/"+c.name, func(b *testing.B) {
			ds := make([]time.Duration, 0, b.N)
			for range b.N {
				dirty(b, c.id)
				t0 := time.Now()
				fr, err := e.n.Engine.Fork(ctx, c.id, engine.ForkOptions{Count: 10})
				ds = append(ds, time.Since(t0))
				if err != nil {
					b.Fatal(err)
				}
				b.StopTimer()
				for _, ch := range fr.Children {
					if ch.Err != nil {
						b.Fatal(ch.Err)
					}
					e.n.Engine.Kill(ctx, ch.Sandbox.ID)
					if len(ch.Sandbox.Run.Volumes) > 0 {
						e.n.DeleteVolume(ctx, ch.Sandbox.Run.Volumes[0].Volume)
					}
				}
				b.StartTimer()
			}
			quantiles(b, ds, "ms")
		})
		b.Run("hibernate+resume/"+c.name, func(b *testing.B) {
			hs, rs := make([]time.Duration, 0, b.N), make([]time.Duration, 0, b.N)
			for range b.N {
				dirty(b, c.id)
				t0 := time.Now()
				if err := e.n.Engine.Hibernate(ctx, c.id); err != nil {
					b.Fatal(err)
				}
				t1 := time.Now()
				if err := e.n.Engine.Resume(ctx, c.id); err != nil {
					b.Fatal(err)
				}
				hs, rs = append(hs, t1.Sub(t0)), append(rs, time.Since(t1))
			}
			quantiles(b, hs, "hibernate-ms")
			quantiles(b, rs, "resume-ms")
		})
	}
}

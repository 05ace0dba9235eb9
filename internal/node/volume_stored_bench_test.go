package node_test

import (
	"context"
	"io/fs"
	"path/filepath"
	"testing"

	"github.com/spore-run/spore/internal/blob/local"
	"github.com/spore-run/spore/internal/engine"
	"github.com/spore-run/spore/internal/node"
	"github.com/spore-run/spore/internal/nodeapi"
)

// BenchmarkVolumeSnapshotsStored: what ten successive durable snapshots of
// a sandbox editing files in a 1 GiB exclusive volume add to the blob
// store (docs/volumes.md, "Through the blob store"). The volume holds 200
// files of 64 KiB; between snapshots the sandbox rewrites 5 of them and
// appends 100 KiB to a log. Each snapshot is uploaded with its copy of the
// volume (a dependency, content-addressed like the memory image); the
// store's growth per snapshot is reported, the first apart, beside the
// same sandbox without a volume:
//
//	go test -run '^$' -bench VolumeSnapshotsStored -benchtime 1x ./internal/node/
func BenchmarkVolumeSnapshotsStored(b *testing.B) {
	for _, withVolume := range []bool{false, true} {
		name := "no-volume"
		if withVolume {
			name = "1GiB-volume"
		}
		b.Run(name, func(b *testing.B) {
			dir := b.TempDir()
			blobs, err := local.Open(dir)
			if err != nil {
				b.Fatal(err)
			}
			e := newEnvTuned(b, func(c *node.Config) { c.Blobs = blobs })
			ctx := context.Background()
			opts := engine.CreateOptions{Template: node.TemplateBase}
			work := "/tmp/work"
			if withVolume {
				vols, err := e.n.PrepareVolumes(ctx, []nodeapi.VolumeMount{{VolumeID: "vbenchstored00001", SizeBytes: 1 << 30, Path: "/work", Exclusive: true}})
				if err != nil {
					b.Fatal(err)
				}
				opts.Volumes, work = vols, "/work"
			}
			sb, err := e.n.Engine.Create(ctx, opts)
			if err != nil {
				b.Fatal(err)
			}
			e.sh(ctx, sb.ID, "mkdir -p "+work+" && cd "+work+" && for i in $(seq 200); do head -c 65536 /dev/urandom > f$i; done")
			for range b.N {
				var first, rest int64
				for i := range 10 {
					if i > 0 {
						e.sh(ctx, sb.ID, "cd "+work+" && for j in 1 2 3 4 5; do head -c 65536 /dev/urandom > f$(( (RANDOM % 200) + 1 )); done; head -c 102400 /dev/urandom >> log")
					}
					before := storeBytes(b, dir)
					s, err := e.n.Engine.Snapshot(ctx, sb.ID, engine.SnapshotOptions{})
					if err != nil {
						b.Fatal(err)
					}
					if _, err := e.n.Sync.Upload(ctx, s.Manifest.ID); err != nil {
						b.Fatal(err)
					}
					grew := storeBytes(b, dir) - before
					if i == 0 {
						first = grew
					} else {
						rest += grew
					}
				}
				b.ReportMetric(float64(first)/(1<<20), "first-stored-MiB")
				b.ReportMetric(float64(rest)/9/(1<<20), "next-stored-MiB/snapshot")
			}
			e.n.Engine.Kill(ctx, sb.ID)
		})
	}
}

// storeBytes is what a local blob store holds on disk.
func storeBytes(b *testing.B, dir string) int64 {
	var n int64
	filepath.WalkDir(dir, func(_ string, d fs.DirEntry, err error) error {
		if err == nil && d.Type().IsRegular() {
			if fi, err := d.Info(); err == nil {
				n += fi.Size()
			}
		}
		return nil
	})
	return n
}

package bench

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/spore-run/spore/internal/api"
	"github.com/spore-run/spore/internal/errdefs"
)

// runFork: fork time against n, children checked and killed after each.
func (r *runner) runFork(ctx context.Context) error {
	levels := forkLevels(r.cfg)
	src, err := r.create(ctx, api.CreateRequest{TemplateID: templateBase})
	if err != nil {
		return err
	}
	total := Series{Name: "fork (all children running)"}
	per := Series{Name: "per child"}
	for _, l := range levels {
		o := r.op(fmt.Sprintf("fork n=%d", l.n), "fork", "ms")
		for range l.reps {
			if r.cfg.ForkGap > 0 {
				time.Sleep(r.cfg.ForkGap)
			}
			var children []api.ForkChild
			v, err := r.sample(ctx, o, func(ctx context.Context) error {
				var err error
				children, err = r.c.Fork(ctx, src, l.n, time.Hour)
				return err
			})
			if err != nil {
				return err
			}
			var ids []string
			var failed []string
			for _, c := range children {
				if c.Sandbox != nil {
					r.own(c.Sandbox.SandboxID)
					ids = append(ids, c.Sandbox.SandboxID)
				}
				if c.Error != nil {
					failed = append(failed, c.Error.Message)
				}
			}
			if err := r.killAll(ctx, ids); err != nil {
				return err
			}
			if len(failed) > 0 || len(ids) != l.n {
				return fmt.Errorf("fork n=%d: %d children of %d, errors: %s", l.n, len(ids), l.n, strings.Join(failed, "; "))
			}
			r.detail("fork n=%d: %.0f ms", l.n, v)
		}
		s := Summarize(o.Samples)
		total.Points = append(total.Points, Point{X: float64(l.n), Stats: s})
		per.Points = append(per.Points, Point{X: float64(l.n), Stats: Summarize(scale(o.Samples, 1/float64(l.n)))})
	}
	r.rep.Curves = append(r.rep.Curves, Curve{
		Name: "fork-vs-n", Title: "Fork: time until all n children run", XLabel: "children (n)", YLabel: "ms",
		Series: []Series{total, per},
	})
	return r.kill(ctx, src)
}

// forkLevel is one n of the fork section and how many forks of it are
// timed.
type forkLevel struct{ n, reps int }

// forkLevels: cfg.ForkLevels (default 1, 10, 50, 100; 1, 2 when quick),
// each with its repetitions: half the op count for n = 1 (at least 2),
// cfg.ForkReps above (default 3 up to 10, then 1), one when quick.
func forkLevels(cfg Config) []forkLevel {
	ns := cfg.ForkLevels
	if len(ns) == 0 {
		ns = []int{1, 10, 50, 100}
		if cfg.Quick {
			ns = []int{1, 2}
		}
	}
	var levels []forkLevel
	for _, n := range ns {
		reps := 1
		switch {
		case cfg.Quick:
		case n == 1:
			reps = max(2, cfg.Count/2)
		case cfg.ForkReps > 0:
			reps = cfg.ForkReps
		case n <= 10:
			reps = 3
		}
		levels = append(levels, forkLevel{n, reps})
	}
	return levels
}

func scale(v []float64, k float64) []float64 {
	out := make([]float64, len(v))
	for i, x := range v {
		out[i] = round(x*k, 3)
	}
	return out
}

// dirtyScript holds N MiB of non-zero memory until killed, then says so.
const dirtyScript = `import os, sys, time
n = int(sys.argv[1])
block = os.urandom(1 << 20)
hold = [bytearray(block) for _ in range(n)]
open("/tmp/spore-bench-dirty", "w").write(str(n))
while True:
    time.sleep(3600)
`

// runMemory: snapshot and restore time against memory dirtied in the
// sandbox, Spore beside bare runsc. Each snapshot and the restores start
// once the sandbox's snapshots are durable: their upload to the blob
// store reads and hashes whole images, which on this 2-core host would
// otherwise run beside what is measured (and beside nothing on the bare
// side).
func (r *runner) runMemory(ctx context.Context) error {
	sizes, reps := []int{0, 64, 256, 1024}, 3
	if r.cfg.Quick {
		sizes, reps = []int{0, 16}, 1
	}
	snapS, restS := Series{Name: "spore snapshot"}, Series{Name: "spore restore (create from snapshot)"}
	bareSnapS, bareRestS := Series{Name: "bare runsc checkpoint"}, Series{Name: "bare runsc restore"}
	sizeS := Series{Name: "image size (MB)"}
	for _, mb := range sizes {
		id, err := r.create(ctx, api.CreateRequest{TemplateID: templateBase, MemoryMB: mb + 1024})
		if err != nil {
			return err
		}
		sb, err := r.c.Open(ctx, id)
		if err != nil {
			return err
		}
		if err := sb.Upload(ctx, "/tmp/dirty.py", strings.NewReader(dirtyScript), ""); err != nil {
			return err
		}
		script := fmt.Sprintf("nohup python3 /tmp/dirty.py %d >/dev/null 2>&1 & for i in $(seq 600); do test -s /tmp/spore-bench-dirty && exit 0; sleep 0.1; done; exit 1", mb)
		if _, err := run(ctx, sb, script); err != nil {
			return fmt.Errorf("dirty %d MB: %w", mb, err)
		}
		var snaps, rests, bsnaps, brests, sizesMB []float64
		var keep api.SnapshotInfo
		for i := range reps {
			if err := r.settleSnapshots(ctx, id); err != nil {
				return err
			}
			t0 := time.Now()
			si, err := r.snapshot(ctx, id)
			if err != nil {
				return fmt.Errorf("snapshot with %d MB dirty: %w", mb, err)
			}
			snaps = append(snaps, ms(time.Since(t0)))
			sizesMB = append(sizesMB, float64(si.SizeBytes)/(1<<20))
			if i == 0 {
				keep = si
				continue
			}
			if err := r.deleteSnapshot(ctx, si.SnapshotID); err != nil {
				return err
			}
		}
		if err := r.settleSnapshots(ctx, id); err != nil {
			return err
		}
		for range reps {
			t0 := time.Now()
			child, err := r.create(ctx, api.CreateRequest{TemplateID: keep.SnapshotID})
			if err != nil {
				return fmt.Errorf("restore with %d MB dirty: %w", mb, err)
			}
			rests = append(rests, ms(time.Since(t0)))
			if err := r.kill(ctx, child); err != nil {
				return err
			}
		}
		if b := r.cfg.Bare; b != nil {
			inst, err := b.Instance(id)
			if err != nil {
				return err
			}
			for range reps {
				v, err := b.Checkpoint(ctx, inst)
				if err != nil {
					return err
				}
				w, err := b.Restore(ctx, inst, b.ImageDir(keep.SnapshotID))
				if err != nil {
					return err
				}
				bsnaps, brests = append(bsnaps, v), append(brests, w)
			}
			bareSnapS.Points = append(bareSnapS.Points, Point{X: float64(mb), Stats: Summarize(bsnaps)})
			bareRestS.Points = append(bareRestS.Points, Point{X: float64(mb), Stats: Summarize(brests)})
		}
		snapS.Points = append(snapS.Points, Point{X: float64(mb), Stats: Summarize(snaps)})
		restS.Points = append(restS.Points, Point{X: float64(mb), Stats: Summarize(rests)})
		sizeS.Points = append(sizeS.Points, Point{X: float64(mb), Stats: Summarize(sizesMB)})
		r.detail("%d MB dirty: snapshot %.0f ms, restore %.0f ms", mb, Summarize(snaps).P50, Summarize(rests).P50)
		if err := r.kill(ctx, id); err != nil {
			return err
		}
		if err := r.deleteSnapshot(ctx, keep.SnapshotID); err != nil {
			return err
		}
	}
	snapC := Curve{Name: "snapshot-vs-memory", Title: "Live snapshot against memory dirtied", XLabel: "memory dirtied (MB)", YLabel: "ms", Series: []Series{snapS}}
	restC := Curve{Name: "restore-vs-memory", Title: "Restore against memory dirtied", XLabel: "memory dirtied (MB)", YLabel: "ms", Series: []Series{restS}}
	if r.cfg.Bare != nil {
		snapC.Series = append(snapC.Series, bareSnapS)
		restC.Series = append(restC.Series, bareRestS)
	}
	r.rep.Curves = append(r.rep.Curves, snapC, restC, Curve{
		Name: "image-size-vs-memory", Title: "Snapshot image size against memory dirtied", XLabel: "memory dirtied (MB)", YLabel: "MB", Series: []Series{sizeS},
	})
	return nil
}

// runThroughput: creates per second with 1, 4 and 16 concurrent clients,
// each creating and keeping its sandboxes (killed after each level).
func (r *runner) runThroughput(ctx context.Context) error {
	levels, perLevel := []int{1, 4, 16}, 32
	if r.cfg.Quick {
		levels, perLevel = []int{1, 2}, 2
	}
	tput, lat := Series{Name: "creates per second"}, Series{Name: "create latency p50 (ms)"}
	latP := Series{Name: "create latency"}
	for _, clients := range levels {
		total := max(perLevel, clients*2)
		var mu sync.Mutex
		var ids []string
		var samples []float64
		time.Sleep(2 * time.Second) // let the warm pool refill, as between bursts
		t0 := time.Now()
		err := parallel(ctx, total, clients, func(ctx context.Context, _ int) error {
			t := time.Now()
			id, err := r.create(ctx, api.CreateRequest{TemplateID: templateBase})
			if err != nil {
				return err
			}
			mu.Lock()
			ids = append(ids, id)
			samples = append(samples, ms(time.Since(t)))
			mu.Unlock()
			return nil
		})
		wall := time.Since(t0)
		if kerr := r.killAll(ctx, ids); err == nil {
			err = kerr
		}
		if err != nil {
			return fmt.Errorf("throughput with %d clients: %w", clients, err)
		}
		rate := float64(total) / wall.Seconds()
		s := Summarize(samples)
		tput.Points = append(tput.Points, Point{X: float64(clients), Stats: Summarize([]float64{round(rate, 2)})})
		lat.Points = append(lat.Points, Point{X: float64(clients), Stats: Summarize([]float64{s.P50})})
		latP.Points = append(latP.Points, Point{X: float64(clients), Stats: s})
		r.detail("%d clients: %.1f creates/s, p50 %.0f ms", clients, rate, s.P50)
	}
	r.rep.Curves = append(r.rep.Curves,
		Curve{Name: "create-throughput", Title: "Create throughput against concurrent clients", XLabel: "concurrent clients", YLabel: "creates per second", Series: []Series{tput}},
		Curve{Name: "create-latency-vs-clients", Title: "Create latency against concurrent clients", XLabel: "concurrent clients", YLabel: "ms", Series: []Series{latP}},
	)
	return nil
}

// runDensity fills the host with idle sandboxes until a create is refused
// (or DensityMax), measuring what each costs the host.
func (r *runner) runDensity(ctx context.Context) error {
	limit := r.cfg.DensityMax
	if limit <= 0 {
		limit = 4000
	}
	if r.cfg.Quick && r.cfg.DensityMax <= 0 {
		limit = 3
	}
	cg := cgroupUsage(r.cfg.CgroupParent)
	d := &Density{Max: limit, MemAvailableStart: memAvailable(), MinMemAvailable: memAvailable()}
	cgStart := cg()
	t0 := time.Now()
	var (
		mu      sync.Mutex
		ids     []string
		refused error
	)
	const workers = 4
	stop := make(chan struct{})
	var once sync.Once
	err := parallel(ctx, limit, workers, func(ctx context.Context, _ int) error {
		select {
		case <-stop:
			return nil
		default:
		}
		id, err := r.create(ctx, api.CreateRequest{TemplateID: templateBase})
		if err != nil {
			// The first create turned away ends the fill: that is the
			// measurement. A refusal (429/503) is the clean way; anything
			// else is noted as the way this host broke.
			once.Do(func() { refused = err; close(stop) })
			return nil
		}
		mu.Lock()
		defer mu.Unlock()
		ids = append(ids, id)
		if len(ids)%10 == 0 {
			r.detail("%d idle sandboxes, %d MiB available", len(ids), memAvailable()>>20)
		}
		return nil
	})
	if err != nil {
		r.killAll(ctx, ids)
		return err
	}
	// Let the last ones settle into idleness before measuring.
	time.Sleep(3 * time.Second)
	d.Held = len(ids)
	d.MinMemAvailable = memAvailable()
	if refused != nil {
		d.Refused = refused.Error()
		if !errors.Is(refused, errdefs.ErrResourceLimit) && !errors.Is(refused, errdefs.ErrUnavailable) {
			r.note("the density fill ended on an error, not a clean refusal: %v", refused)
		}
	}
	if d.Held > 0 {
		d.IdleRSSBytes = max(0, (d.MemAvailableStart-d.MinMemAvailable)/int64(d.Held))
		if used := cg(); used > 0 && cgStart >= 0 {
			d.CgroupBytes = max(0, (used-cgStart)/int64(d.Held))
		}
		if refused == nil && d.IdleRSSBytes > 0 {
			d.Projected = d.Held + int((d.MinMemAvailable-1<<30)/d.IdleRSSBytes)
		}
	}
	d.TookSec = round(time.Since(t0).Seconds(), 1)
	r.rep.Density = d
	r.detail("%d idle sandboxes held; killing them", d.Held)
	return r.killAll(ctx, ids)
}

// cgroupUsage returns a reader of the memory charged to the sandboxes'
// cgroup parent (-1 when unknown).
func cgroupUsage(parent string) func() int64 {
	return func() int64 {
		if parent == "" {
			return -1
		}
		b, err := os.ReadFile(filepath.Join("/sys/fs/cgroup/memory", parent, "memory.usage_in_bytes"))
		if err != nil {
			return -1
		}
		v, err := strconv.ParseInt(strings.TrimSpace(string(b)), 10, 64)
		if err != nil {
			return -1
		}
		return v
	}
}

// settleSnapshots waits until no snapshot of sandbox id is still being
// uploaded to the blob store.
func (r *runner) settleSnapshots(ctx context.Context, id string) error {
	ctx, cancel := context.WithTimeout(ctx, 5*time.Minute)
	defer cancel()
	for {
		list, err := r.c.Snapshots(ctx, id)
		if err != nil {
			return fmt.Errorf("snapshots of %s: %w", id, err)
		}
		busy := false
		for _, sn := range list {
			busy = busy || sn.Storage == "uploading" // store.StorageUploading
		}
		if !busy {
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("snapshots of %s still uploading: %w", id, ctx.Err())
		case <-time.After(100 * time.Millisecond):
		}
	}
}

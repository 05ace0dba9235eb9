package engine_test

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/spore-run/spore/internal/engine"
	"github.com/spore-run/spore/internal/ids"
	"github.com/spore-run/spore/internal/tenant"
	"github.com/spore-run/spore/internal/testenv"
)

// Benchmarks of the engine's operations side by side with the bare runsc
// commands they sit on, on the same small sandbox in the same run:
//
//	go test -run '^$' -bench . -benchtime 20x ./internal/engine/
//
// Each pair reports ms/op; the ratio spore/bare is what the engine adds.

// bare runs runsc directly against the engine's runsc root, as a user
// would by hand.
type bare struct {
	b      *testing.B
	e      *env
	runsc  string
	root   string
	bundle string // a bundle dir for bare restores (copied from an instance)
}

func newBare(b *testing.B, e *env, instance string) *bare {
	x := &bare{b: b, e: e, runsc: testenv.Runsc(b), root: filepath.Join(e.dir, "runtime", "root")}
	cfg, err := os.ReadFile(filepath.Join(e.dir, "runtime", "inst", instance, "bundle", "config.json"))
	if err != nil {
		b.Fatal(err)
	}
	var spec map[string]any
	if err := json.Unmarshal(cfg, &spec); err != nil {
		b.Fatal(err)
	}
	spec["linux"].(map[string]any)["cgroupsPath"] = e.cgroup + "/bare"
	x.bundle = b.TempDir()
	out, _ := json.Marshal(spec)
	if err := os.WriteFile(filepath.Join(x.bundle, "config.json"), out, 0o600); err != nil {
		b.Fatal(err)
	}
	return x
}

func (x *bare) run(args ...string) {
	x.b.Helper()
	full := append([]string{"--root=" + x.root, "--platform=systrap"}, args...)
	cmd := exec.Command(x.runsc, full...)
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	if args[0] == "restore" || (len(args) > 2 && args[2] == "restore") {
		cmd.Stdout, cmd.Stderr = nil, nil // the sandbox keeps them open
	}
	if err := cmd.Run(); err != nil {
		x.b.Fatalf("runsc %v: %v: %s", args, err, out.String())
	}
}

func msPerOp(b *testing.B, start time.Time) {
	b.ReportMetric(float64(time.Since(start).Microseconds())/1000/float64(b.N), "ms/op")
}

func benchEnv(b *testing.B) (*env, engine.Sandbox, context.Context) {
	e := newEnv(b)
	ctx := ctxFor(b)
	sb := e.create(ctx, e.counter)
	e.bump(ctx, sb.ID)
	return e, sb, ctx
}

func BenchmarkSnapshot(b *testing.B) {
	e, sb, ctx := benchEnv(b)
	b.Run("bare", func(b *testing.B) {
		x := newBare(b, e, sb.Instance)
		var total time.Duration
		for i := 0; i < b.N; i++ {
			dir := b.TempDir()
			t0 := time.Now()
			x.run("checkpoint", "--image-path", dir, "--leave-running", sb.Instance)
			total += time.Since(t0)
		}
		b.ReportMetric(float64(total.Microseconds())/1000/float64(b.N), "ms/op")
	})
	b.Run("spore", func(b *testing.B) {
		var total, paused time.Duration
		for i := 0; i < b.N; i++ {
			t0 := time.Now()
			r, err := e.eng.Snapshot(ctx, sb.ID, engine.SnapshotOptions{})
			total += time.Since(t0)
			if err != nil {
				b.Fatal(err)
			}
			paused += r.Paused
			b.StopTimer()
			e.eng.DeleteSnapshot(ctx, r.Manifest.ID)
			b.StartTimer()
		}
		b.ReportMetric(float64(total.Microseconds())/1000/float64(b.N), "ms/op")
		b.ReportMetric(float64(paused.Microseconds())/1000/float64(b.N), "paused-ms/op")
	})
}

func BenchmarkRestore(b *testing.B) {
	e, sb, ctx := benchEnv(b)
	snap, err := e.eng.Snapshot(ctx, sb.ID, engine.SnapshotOptions{Names: []string{"bench"}})
	if err != nil {
		b.Fatal(err)
	}
	img := e.eng.Snapshots().ImageDir(snap.Manifest.ID)
	b.Run("bare", func(b *testing.B) {
		x := newBare(b, e, sb.Instance)
		var total time.Duration
		for i := 0; i < b.N; i++ {
			id := ids.New('x')
			ov := b.TempDir()
			t0 := time.Now()
			x.run("--network=none", "--overlay2=root:dir="+ov+",size=512m", "restore", "-detach", "--image-path", img, "--bundle", x.bundle, id)
			total += time.Since(t0)
			x.run("delete", "-force", id)
		}
		b.ReportMetric(float64(total.Microseconds())/1000/float64(b.N), "ms/op")
	})
	b.Run("spore", func(b *testing.B) {
		var total time.Duration
		for i := 0; i < b.N; i++ {
			t0 := time.Now()
			c, err := e.eng.Create(ctx, engine.CreateOptions{Template: "bench"})
			total += time.Since(t0)
			if err != nil {
				b.Fatal(err)
			}
			if err := e.eng.Kill(ctx, c.ID); err != nil {
				b.Fatal(err)
			}
		}
		b.ReportMetric(float64(total.Microseconds())/1000/float64(b.N), "ms/op")
	})
}

func BenchmarkPauseResume(b *testing.B) {
	e, sb, ctx := benchEnv(b)
	b.Run("bare", func(b *testing.B) {
		x := newBare(b, e, sb.Instance)
		var p, r time.Duration
		for i := 0; i < b.N; i++ {
			t0 := time.Now()
			x.run("pause", sb.Instance)
			t1 := time.Now()
			x.run("resume", sb.Instance)
			p, r = p+t1.Sub(t0), r+time.Since(t1)
		}
		b.ReportMetric(float64(p.Microseconds())/1000/float64(b.N), "pause-ms/op")
		b.ReportMetric(float64(r.Microseconds())/1000/float64(b.N), "resume-ms/op")
	})
	b.Run("spore", func(b *testing.B) {
		var p, r time.Duration
		for i := 0; i < b.N; i++ {
			t0 := time.Now()
			if err := e.eng.Pause(ctx, sb.ID); err != nil {
				b.Fatal(err)
			}
			t1 := time.Now()
			if err := e.eng.Resume(ctx, sb.ID); err != nil {
				b.Fatal(err)
			}
			p, r = p+t1.Sub(t0), r+time.Since(t1)
		}
		b.ReportMetric(float64(p.Microseconds())/1000/float64(b.N), "pause-ms/op")
		b.ReportMetric(float64(r.Microseconds())/1000/float64(b.N), "resume-ms/op")
	})
}

func BenchmarkRollback(b *testing.B) {
	e, sb, ctx := benchEnv(b)
	snap, err := e.eng.Snapshot(ctx, sb.ID, engine.SnapshotOptions{})
	if err != nil {
		b.Fatal(err)
	}
	b.ResetTimer()
	start := time.Now()
	for i := 0; i < b.N; i++ {
		if _, err := e.eng.Rollback(ctx, sb.ID, snap.Manifest.ID); err != nil {
			b.Fatal(err)
		}
	}
	msPerOp(b, start)
}

func BenchmarkHibernateResume(b *testing.B) {
	e, sb, ctx := benchEnv(b)
	var h, r time.Duration
	for i := 0; i < b.N; i++ {
		t0 := time.Now()
		if err := e.eng.Hibernate(ctx, sb.ID); err != nil {
			b.Fatal(err)
		}
		t1 := time.Now()
		if err := e.eng.Resume(ctx, sb.ID); err != nil {
			b.Fatal(err)
		}
		h, r = h+t1.Sub(t0), r+time.Since(t1)
	}
	b.ReportMetric(float64(h.Microseconds())/1000/float64(b.N), "hibernate-ms/op")
	b.ReportMetric(float64(r.Microseconds())/1000/float64(b.N), "resume-ms/op")
}

func BenchmarkFork(b *testing.B) {
	for _, n := range []int{1, 10} {
		b.Run(fmt.Sprintf("n=%d", n), func(b *testing.B) {
			e, sb, ctx := benchEnv(b)
			var total time.Duration
			for i := 0; i < b.N; i++ {
				t0 := time.Now()
				fr, err := e.eng.Fork(ctx, sb.ID, engine.ForkOptions{Count: n, Concurrency: benchConcurrency()})
				total += time.Since(t0)
				if err != nil {
					b.Fatal(err)
				}
				for _, c := range fr.Children {
					if c.Err != nil {
						b.Fatal(c.Err)
					}
					e.eng.Kill(ctx, c.Sandbox.ID)
				}
			}
			b.ReportMetric(float64(total.Microseconds())/1000/float64(b.N), "ms/op")
		})
	}
}

// benchConcurrency is the fork concurrency benchmarked (SPORE_BENCH_FORK_CONCURRENCY, default the engine's).
func benchConcurrency() int {
	var n int
	fmt.Sscan(os.Getenv("SPORE_BENCH_FORK_CONCURRENCY"), &n)
	return n
}

// BenchmarkFairLaunch measures what one team's burst does to another
// team's creates on the same host (issue 32's fairness figure): team b
// creates sandboxes one after another, first on an idle host, then while
// team a forks a sandbox 100 times twice at once (8 restores at a time,
// the forks' default concurrency). It reports b's create p50 and p90 idle
// and during the burst, and how long the burst took, with the engine's
// launch slots (slots=default) and without any bound (slots=none):
//
//	go test -run '^$' -bench FairLaunch -benchtime 1x -timeout 30m ./internal/engine/
func BenchmarkFairLaunch(b *testing.B) {
	for _, c := range []struct {
		name     string
		launches int
	}{{"slots=default", 0}, {"slots=2", 2}, {"slots=none", -1}} {
		b.Run(c.name, func(b *testing.B) {
			e := newEnvWith(b, func(cfg *engine.Config) { cfg.Launches = c.launches })
			ctx := ctxFor(b)
			ctxA, ctxB := tenant.With(ctx, "a"), tenant.With(ctx, "b")
			src, err := e.eng.Create(ctxA, engine.CreateOptions{Template: e.counter})
			if err != nil {
				b.Fatal(err)
			}
			createB := func() time.Duration {
				t0 := time.Now()
				sb, err := e.eng.Create(ctxB, engine.CreateOptions{Template: e.counter})
				d := time.Since(t0)
				if err != nil {
					b.Fatal(err)
				}
				if err := e.eng.Kill(ctx, sb.ID); err != nil {
					b.Fatal(err)
				}
				return d
			}
			for range b.N {
				var idle []time.Duration
				for range 10 {
					idle = append(idle, createB())
				}
				var wg sync.WaitGroup
				var children []string
				var mu sync.Mutex
				done := make(chan struct{})
				t0 := time.Now()
				for range 2 {
					wg.Add(1)
					go func() {
						defer wg.Done()
						fr, err := e.eng.Fork(ctxA, src.ID, engine.ForkOptions{Count: 100})
						if err != nil {
							b.Error(err)
							return
						}
						mu.Lock()
						defer mu.Unlock()
						for _, ch := range fr.Children {
							if ch.Err != nil {
								b.Error(ch.Err)
								continue
							}
							children = append(children, ch.Sandbox.ID)
						}
					}()
				}
				go func() { wg.Wait(); close(done) }()
				var busy []time.Duration
				time.Sleep(500 * time.Millisecond) // the forks are past their capture, launching
			loop:
				for {
					select {
					case <-done:
						break loop
					default:
						busy = append(busy, createB())
					}
				}
				burst := time.Since(t0)
				for _, id := range children {
					e.eng.Kill(ctx, id)
				}
				ms := func(ds []time.Duration, q float64) float64 {
					if len(ds) == 0 {
						return 0
					}
					slices.Sort(ds)
					return float64(ds[int(q*float64(len(ds)-1))].Microseconds()) / 1000
				}
				b.ReportMetric(ms(idle, 0.5), "idle-p50-ms")
				b.ReportMetric(ms(busy, 0.5), "burst-p50-ms")
				b.ReportMetric(ms(busy, 0.9), "burst-p90-ms")
				b.ReportMetric(float64(len(busy)), "burst-creates")
				b.ReportMetric(burst.Seconds(), "burst-s")
				b.ReportMetric(float64(len(children)), "children")
			}
		})
	}
}

package api_test

import (
	"context"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/spore-run/spore/internal/control"
	"github.com/spore-run/spore/internal/engine"
	"github.com/spore-run/spore/internal/node"
)

// API benchmarks on a real node:
//
//	go test -run '^$' -bench . -benchtime 20x ./internal/api/
//
// create: through the API, served by the warm pool (creates spaced so the
// pool refills) and without it; overhead: the same operation called on the
// engine directly and through the API, p50 of each.

func p50(ds []time.Duration) time.Duration {
	sort.Slice(ds, func(i, j int) bool { return ds[i] < ds[j] })
	return ds[len(ds)/2]
}

func ms(d time.Duration) float64 { return float64(d.Microseconds()) / 1000 }

func BenchmarkCreate(b *testing.B) {
	h := newHarness(b)
	for _, pooled := range []bool{true, false} {
		name := "cold"
		if pooled {
			name = "warm-pool"
		}
		b.Run(name, func(b *testing.B) {
			ctx, cancel := context.WithCancel(context.Background())
			done := make(chan struct{})
			if pooled {
				go func() {
					defer close(done)
					h.ctl.RunPool(ctx, control.PoolConfig{Templates: []string{node.TemplateBase}, Size: 2})
				}()
			} else {
				close(done)
			}
			defer func() { cancel(); <-done }()
			var ds []time.Duration
			for i := 0; i < b.N; i++ {
				if pooled {
					for len(h.n.Engine.List(context.Background()))-h.count() < 2 {
						time.Sleep(20 * time.Millisecond)
					}
				}
				t0 := time.Now()
				sb := h.create(`{"templateID":"base"}`)
				ds = append(ds, time.Since(t0))
				h.do("DELETE", "/sandboxes/"+sb.SandboxID, "")
			}
			b.ReportMetric(ms(p50(ds)), "p50-ms")
		})
	}
}

func BenchmarkAPIOverhead(b *testing.B) {
	h := newHarness(b)
	ctx := context.Background()
	sb := h.create(`{"templateID":"base","timeout":3600}`)
	snap, err := h.n.Engine.Snapshot(ctx, sb.SandboxID, engine.SnapshotOptions{})
	if err != nil {
		b.Fatal(err)
	}
	// The children a fork made, killed after its sample is taken: the kill
	// is not part of the fork.
	var children []func()
	killChildren := func() {
		for _, kill := range children {
			kill()
		}
		children = children[:0]
	}
	ops := []struct {
		name   string
		engine func() error
		api    func() int
	}{
		{"snapshot",
			func() error { _, err := h.n.Engine.Snapshot(ctx, sb.SandboxID, engine.SnapshotOptions{}); return err },
			func() int { c, _, _ := h.do("POST", "/sandboxes/"+sb.SandboxID+"/snapshots", `{}`); return c }},
		{"fork-1",
			func() error {
				fr, err := h.n.Engine.Fork(ctx, sb.SandboxID, engine.ForkOptions{Count: 1})
				if err == nil {
					id := fr.Children[0].Sandbox.ID
					children = append(children, func() { h.n.Engine.Kill(ctx, id) })
				}
				return err
			},
			func() int {
				c, body, _ := h.do("POST", "/sandboxes/"+sb.SandboxID+"/fork", `{"count":1}`)
				if i := strings.Index(string(body), `"sandboxID":"`); i >= 0 {
					id := string(body[i+13 : i+33])
					children = append(children, func() { h.do("DELETE", "/sandboxes/"+id, "") })
				}
				return c
			}},
		{"rollback",
			func() error { _, err := h.n.Engine.Rollback(ctx, sb.SandboxID, snap.Manifest.ID); return err },
			func() int {
				c, _, _ := h.do("POST", "/sandboxes/"+sb.SandboxID+"/rollback", `{"snapshotID":"`+snap.Manifest.ID+`"}`)
				return c
			}},
	}
	for _, op := range ops {
		b.Run(op.name, func(b *testing.B) {
			var eng, viaAPI []time.Duration
			runEngine := func() {
				t0 := time.Now()
				if err := op.engine(); err != nil {
					b.Fatal(err)
				}
				eng = append(eng, time.Since(t0))
				killChildren()
			}
			runAPI := func() {
				t0 := time.Now()
				if c := op.api(); c >= 300 {
					b.Fatalf("%s via API: %d", op.name, c)
				}
				viaAPI = append(viaAPI, time.Since(t0))
				killChildren()
			}
			for i := 0; i < b.N; i++ {
				// Alternate which goes first, so neither always runs in
				// the wake of the other's cleanup.
				if i%2 == 0 {
					runEngine()
					runAPI()
				} else {
					runAPI()
					runEngine()
				}
			}
			b.ReportMetric(ms(p50(eng)), "engine-p50-ms")
			b.ReportMetric(ms(p50(viaAPI)), "api-p50-ms")
			b.ReportMetric(ms(p50(viaAPI)-p50(eng)), "overhead-ms")
		})
	}
}

package node_test

import (
	"context"
	"os"
	"testing"
	"time"

	"github.com/spore-run/spore/internal/engine"
	"github.com/spore-run/spore/internal/node"
	"github.com/spore-run/spore/internal/runtime"
)

// BenchmarkIdleSandboxCPU measures what an idle default sandbox costs the
// host in CPU, with envd's OOM watchdog (the default) and without it
// (-oom-watch=false): the CPU time its cgroup (cpuacct.usage, sandbox
// kernel and all) accrues over an idle window, as % of one core:
//
//	go test -run '^$' -bench IdleSandboxCPU -benchtime 1x ./internal/node/
//
// SPORE_IDLE_WINDOW changes the window (default 20s); the metrics are the
// means over the rounds (-benchtime Nx), each round logged.
func BenchmarkIdleSandboxCPU(b *testing.B) {
	window := 20 * time.Second
	if v := os.Getenv("SPORE_IDLE_WINDOW"); v != "" {
		d, err := time.ParseDuration(v)
		if err != nil {
			b.Fatal(err)
		}
		window = d
	}
	e := newEnv(b)
	ctx := context.Background()
	spec := e.n.TemplateSpecs()[0]
	spec.Name = "base-no-oom-watch"
	spec.Run.Args = append(append([]string(nil), spec.Run.Args...), "-oom-watch=false")
	if _, err := e.n.Engine.BuildTemplate(ctx, spec); err != nil {
		b.Fatal(err)
	}
	var stats runtime.StatsReader = e.n.Runtime
	var sum [2]float64
	rounds := 0
	for b.Loop() {
		rounds++
		with := e.create(ctx, engine.CreateOptions{Template: node.TemplateBase})
		without := e.create(ctx, engine.CreateOptions{Template: spec.Name})
		time.Sleep(3 * time.Second) // /init and the first polls settle
		var at [2]runtime.Stats
		for i, sb := range []engine.Sandbox{with, without} {
			s, err := stats.Stats(ctx, sb.Instance)
			if err != nil {
				b.Fatal(err)
			}
			at[i] = s
		}
		time.Sleep(window)
		for i, sb := range []engine.Sandbox{with, without} {
			s, err := stats.Stats(ctx, sb.Instance)
			if err != nil {
				b.Fatal(err)
			}
			pct := 100 * float64(s.CPUUsage-at[i].CPUUsage) / float64(s.At.Sub(at[i].At))
			name := [2]string{"%core-oom-watch", "%core-no-oom-watch"}[i]
			sum[i] += pct
			b.Logf("%s: %v CPU over %v idle = %.3f %% of a core", name, s.CPUUsage-at[i].CPUUsage, s.At.Sub(at[i].At), pct)
		}
		for _, sb := range []engine.Sandbox{with, without} {
			if err := e.n.Engine.Kill(ctx, sb.ID); err != nil {
				b.Fatal(err)
			}
		}
	}
	b.ReportMetric(sum[0]/float64(rounds), "%core-oom-watch")
	b.ReportMetric(sum[1]/float64(rounds), "%core-no-oom-watch")
}

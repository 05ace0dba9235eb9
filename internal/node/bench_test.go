package node_test

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"net/http"
	"os"
	"sort"
	"strings"
	"testing"
	"time"

	"connectrpc.com/connect"

	"github.com/spore-run/spore/internal/engine"
	"github.com/spore-run/spore/internal/envd"
	"github.com/spore-run/spore/internal/node"
	processpb "github.com/spore-run/spore/proto/gen/process"
)

// Benchmarks of the in-sandbox daemon and of node-level operations (with
// networking and the daemon's /init), on real sandboxes:
//
//	go test -run '^$' -bench . -benchtime 50x ./internal/node/
//
// Latencies are reported as p50/p95 in ms; transfers in MB/s.

func quantiles(b *testing.B, ds []time.Duration, unit string) {
	sort.Slice(ds, func(i, j int) bool { return ds[i] < ds[j] })
	ms := func(d time.Duration) float64 { return float64(d.Microseconds()) / 1000 }
	b.ReportMetric(ms(ds[len(ds)/2]), "p50-"+unit)
	b.ReportMetric(ms(ds[len(ds)*95/100]), "p95-"+unit)
}

func benchEnv(b *testing.B, template string) (*env, engine.Sandbox, *client, context.Context) {
	e := newEnv(b)
	ctx := context.Background()
	sb, err := e.n.Engine.Create(ctx, engine.CreateOptions{Template: template})
	if err != nil {
		b.Fatal(err)
	}
	c := e.client(sb, connect.WithProtoJSON())
	return e, sb, c, ctx
}

// commands.run("true"): the SDK starts `/bin/bash -l -c true` over a
// Connect server stream (JSON codec) and reads until the end event.
// SPORE_BENCH_CMD replaces the command (to see where the time goes);
// SPORE_BENCH_GAP pauses before each one, untimed (an agent's think time:
// the daemon's warm shell is then ready, see docs/envd.md).
func BenchmarkCommandRunTrue(b *testing.B) {
	_, _, c, ctx := benchEnv(b, node.TemplateBase)
	req := &processpb.StartRequest{Process: &processpb.ProcessConfig{Cmd: "/bin/bash", Args: []string{"-l", "-c", "true"}}}
	if cmd := os.Getenv("SPORE_BENCH_CMD"); cmd != "" { // to see where the time goes
		f := strings.Fields(cmd)
		req.Process.Cmd, req.Process.Args = f[0], f[1:]
	}
	run := func() {
		st, err := c.proc.Start(ctx, connect.NewRequest(req))
		if err != nil {
			b.Fatal(err)
		}
		for st.Receive() {
		}
		if err := st.Err(); err != nil {
			b.Fatal(err)
		}
	}
	run() // warm the connection and the page cache
	ds := make([]time.Duration, 0, b.N)
	b.ResetTimer()
	gap, _ := time.ParseDuration(os.Getenv("SPORE_BENCH_GAP"))
	for i := 0; i < b.N; i++ {
		if gap > 0 {
			b.StopTimer()
			time.Sleep(gap)
			b.StartTimer()
		}
		t0 := time.Now()
		run()
		ds = append(ds, time.Since(t0))
	}
	quantiles(b, ds, "ms")
}

func BenchmarkFiles10MB(b *testing.B) {
	_, _, c, ctx := benchEnv(b, node.TemplateBase)
	blob := bytes.Repeat([]byte("0123456789abcdef"), (10<<20)/16)
	for _, dir := range []string{"upload", "download"} {
		b.Run(dir, func(b *testing.B) {
			var total time.Duration
			for i := 0; i < b.N; i++ {
				t0 := time.Now()
				var req *http.Request
				if dir == "upload" {
					req, _ = http.NewRequestWithContext(ctx, "POST", c.url(envd.Port)+"/files?path=/home/user/blob", bytes.NewReader(blob))
					req.Header.Set("Content-Type", "application/octet-stream")
				} else {
					req, _ = http.NewRequestWithContext(ctx, "GET", c.url(envd.Port)+"/files?path=/home/user/blob", nil)
				}
				c.header(req.Header)
				resp, err := c.hc.Do(req)
				if err != nil {
					b.Fatal(err)
				}
				n, _ := io.CopyBuffer(struct{ io.Writer }{io.Discard}, resp.Body, make([]byte, 1<<20))
				resp.Body.Close()
				if resp.StatusCode != 200 || (dir == "download" && n != int64(len(blob))) {
					b.Fatalf("%s: %d, %d bytes", dir, resp.StatusCode, n)
				}
				total += time.Since(t0)
			}
			b.ReportMetric(float64(len(blob))*float64(b.N)/total.Seconds()/1e6, "MB/s")
		})
	}
}

// Create from a template and fork, with networking and /init, as the API
// will run them.
func BenchmarkNodeCreateFork(b *testing.B) {
	e, sb, _, ctx := benchEnv(b, node.TemplateBase)
	b.Run("create", func(b *testing.B) {
		ds := make([]time.Duration, 0, b.N)
		for i := 0; i < b.N; i++ {
			t0 := time.Now()
			c, err := e.n.Engine.Create(ctx, engine.CreateOptions{Template: node.TemplateBase})
			ds = append(ds, time.Since(t0))
			if err != nil {
				b.Fatal(err)
			}
			e.n.Engine.Kill(ctx, c.ID)
		}
		quantiles(b, ds, "ms")
	})
	for _, n := range []int{1, 10} {
		b.Run(fmt.Sprintf("fork-%d", n), func(b *testing.B) {
			ds := make([]time.Duration, 0, b.N)
			for i := 0; i < b.N; i++ {
				t0 := time.Now()
				fr, err := e.n.Engine.Fork(ctx, sb.ID, engine.ForkOptions{Count: n})
				ds = append(ds, time.Since(t0))
				if err != nil {
					b.Fatal(err)
				}
				for _, ch := range fr.Children {
					if ch.Err != nil {
						b.Fatal(ch.Err)
					}
					e.n.Engine.Kill(ctx, ch.Sandbox.ID)
				}
			}
			quantiles(b, ds, "ms")
		})
	}
}

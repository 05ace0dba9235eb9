package api_test

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"strings"
	"syscall"
	"testing"
	"time"

	"connectrpc.com/connect"

	"github.com/spore-run/spore/internal/api"
	"github.com/spore-run/spore/internal/control"
	"github.com/spore-run/spore/internal/runtime"
	processpb "github.com/spore-run/spore/proto/gen/process"
	"github.com/spore-run/spore/proto/gen/process/processpbconnect"
)

// proxyHeaders routes a Connect client through the API's proxy to one
// sandbox's envd, as the E2B SDK does.
type proxyHeaders struct{ id, token string }

func (p proxyHeaders) set(h http.Header) {
	h.Set("E2b-Sandbox-Id", p.id)
	h.Set("X-Access-Token", p.token)
	h.Set("X-API-KEY", key)
}

func (p proxyHeaders) WrapUnary(next connect.UnaryFunc) connect.UnaryFunc {
	return func(ctx context.Context, req connect.AnyRequest) (connect.AnyResponse, error) {
		p.set(req.Header())
		return next(ctx, req)
	}
}

func (p proxyHeaders) WrapStreamingClient(next connect.StreamingClientFunc) connect.StreamingClientFunc {
	return func(ctx context.Context, spec connect.Spec) connect.StreamingClientConn {
		conn := next(ctx, spec)
		p.set(conn.RequestHeader())
		return conn
	}
}

func (p proxyHeaders) WrapStreamingHandler(next connect.StreamingHandlerFunc) connect.StreamingHandlerFunc {
	return next
}

// TestDeathEndsProxiedStream: a command stream open through the API's
// proxy to a sandbox whose kernel (the sentry) is SIGKILLed from the host
// ends with an error instead of hanging, and the API then reports the
// sandbox in state error with reason crashed.
func TestDeathEndsProxiedStream(t *testing.T) {
	h := newHarness(t)
	sb := h.create(`{"templateID":"base"}`)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	proc := processpbconnect.NewProcessClient(http.DefaultClient, h.url,
		connect.WithInterceptors(proxyHeaders{sb.SandboxID, sb.EnvdAccessToken}))
	st, err := proc.Start(ctx, connect.NewRequest(&processpb.StartRequest{Process: &processpb.ProcessConfig{
		Cmd: "/bin/bash", Args: []string{"-c", "echo started; sleep 100000"}}}))
	if err != nil {
		t.Fatal(err)
	}
	for st.Receive() { // until the command has printed: the stream is open end to end
		if strings.Contains(string(st.Msg().GetEvent().GetData().GetStdout()), "started") {
			break
		}
	}
	es, err := h.n.Engine.Get(ctx, sb.SandboxID)
	if err != nil {
		t.Fatal(err)
	}
	info, err := h.n.Runtime.State(ctx, es.Instance)
	if err != nil {
		t.Fatal(err)
	}
	ended := make(chan error, 1)
	go func() {
		for st.Receive() {
			if st.Msg().GetEvent().GetEnd() != nil {
				ended <- fmt.Errorf("the command reported an end: %v", st.Msg())
				return
			}
		}
		ended <- st.Err()
	}()
	killed := time.Now()
	if err := syscall.Kill(info.PID, syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-ended:
		t.Logf("stream ended %v after the SIGKILL: %v", time.Since(killed), err)
		if err == nil {
			t.Error("the stream of a dead sandbox ended without an error")
		}
	case <-time.After(10 * time.Second):
		t.Fatal("the proxied stream to a dead sandbox was still open 10 s after its kernel was killed")
	}
	st.Close()
	deadline := time.Now().Add(10 * time.Second)
	for {
		code, b, _ := h.do("GET", "/sandboxes/"+sb.SandboxID, "")
		var d api.SandboxDetail
		json.Unmarshal(b, &d)
		if code == 200 && d.State == "error" && d.SporeReason == string(runtime.ExitCrashed) {
			t.Logf("reported: %s", b)
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("GET of the dead sandbox: %d %s, want state error, reason crashed", code, b)
		}
		time.Sleep(100 * time.Millisecond)
	}
	if code, b, _ := h.do("DELETE", "/sandboxes/"+sb.SandboxID, ""); code != 204 {
		t.Fatalf("kill of the dead sandbox: %d %s", code, b)
	}
}

// TestMetricsIgnoreGuestBinaries: a guest that replaces the programs a
// metrics sampler could run (df, free, cat, head, tail, grep, sleep, sh,
// ps, du) with ones that hang or print without end cannot hang, flood or
// falsify GET /sandboxes/{id}/metrics: it answers, with figures from the
// host that fit the sandbox's limits.
func TestMetricsIgnoreGuestBinaries(t *testing.T) {
	h := newHarness(t)
	sb := h.create(`{"templateID":"base"}`)
	ctx := context.Background()
	var out strings.Builder
	script := `set -e
for b in df free cat head tail grep sleep ps du top awk; do
  p=$(command -v $b) || continue
  p=$(readlink -f $p)
  case $b in
    df|free|ps) printf '#!/bin/bash\nexec yes 9999999999999999999999999999\n' > $p ;;
    *) printf '#!/bin/bash\nread -t 1000000 x </dev/zero; while :; do :; done\n' > $p ;;
  esac
  chmod 755 $p
done
printf '#!/bin/bash\nexec /bin/bash -c "while :; do :; done"\n' > $(readlink -f /bin/sh)
echo replaced`
	code, err := h.n.Engine.Exec(ctx, sb.SandboxID, runtime.ExecSpec{Args: []string{"/bin/bash", "-c", script}, Stdout: &out, Stderr: &out})
	if err != nil || code != 0 || !strings.Contains(out.String(), "replaced") {
		t.Fatalf("replace the guest's binaries: %d %v %s", code, err, out.String())
	}
	client := &http.Client{Timeout: 30 * time.Second} // a hang fails, it does not block the suite
	for range 3 {
		req, _ := http.NewRequest("GET", h.url+"/sandboxes/"+sb.SandboxID+"/metrics", nil)
		req.Header.Set("X-API-KEY", key)
		start := time.Now()
		resp, err := client.Do(req)
		if err != nil {
			t.Fatalf("metrics with hostile guest binaries: %v", err)
		}
		var ms []control.Metric
		derr := json.NewDecoder(resp.Body).Decode(&ms)
		resp.Body.Close()
		t.Logf("metrics after %v: %d %+v", time.Since(start), resp.StatusCode, ms)
		if resp.StatusCode != 200 || derr != nil || len(ms) != 1 {
			t.Fatalf("metrics: %d %v %+v", resp.StatusCode, derr, ms)
		}
		m := ms[0]
		if m.MemTotal != 1<<30 || m.MemUsed <= 0 || m.MemUsed > m.MemTotal || m.DiskTotal != 4096<<20 ||
			m.DiskUsed < 0 || m.DiskUsed > m.DiskTotal || m.CPUUsedPct < 0 || m.CPUUsedPct > 100 || m.CPUCount != 2 {
			t.Fatalf("metrics not sane: %+v", m)
		}
	}
}

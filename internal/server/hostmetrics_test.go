package server

import (
	"context"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/spore-run/spore/internal/metrics"
)

// A node's metrics listener serves GET /metrics to its token only: no
// token, a wrong one (of the same length, or a prefix) or another path
// get nothing of the metrics, and a refused scrape collects nothing.
func TestMetricsHandlerNeedsTheToken(t *testing.T) {
	reads := 0
	reg := metrics.NewRegistry()
	reg.MustRegister(metrics.NewHost(func(context.Context) metrics.HostFigures {
		reads++
		return metrics.HostFigures{Launch: metrics.LaunchLoad{Slots: 4}, Sandboxes: map[string]int{"running": 2}, RefusedMemory: 3}
	}))
	const token = "0123456789abcdef0123"
	srv := httptest.NewServer(MetricsHandler(reg, token, slog.New(slog.DiscardHandler)))
	t.Cleanup(srv.Close)
	get := func(path, auth string) (int, string) {
		req, _ := http.NewRequest("GET", srv.URL+path, nil)
		if auth != "" {
			req.Header.Set("Authorization", auth)
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(b)
	}
	for _, auth := range []string{"", "Bearer ", "Bearer 0123456789abcdef012", "Bearer 0123456789abcdef0124", "Basic " + token, token} {
		if code, b := get("/metrics", auth); code != 401 || !strings.Contains(b, `"code":401`) {
			t.Errorf("Authorization %q: %d %s, want a JSON 401", auth, code, b)
		}
	}
	if reads != 0 {
		t.Fatalf("refused scrapes collected %d times", reads)
	}
	if code, _ := get("/debug/pprof/", "Bearer "+token); code != 404 {
		t.Fatalf("another path with the token: %d, want 404", code)
	}
	code, b := get("/metrics", "Bearer "+token)
	for _, want := range []string{"spore_engine_launch_slots 4", `spore_host_sandboxes{state="running"} 2`, `spore_host_admission_refusals_total{reason="memory"} 3`} {
		if code != 200 || !strings.Contains(b, want) {
			t.Fatalf("scrape with the token: %d, want %q in\n%s", code, want, b)
		}
	}
	if strings.Contains(b, "spore_host_chunk_cache_bytes") || strings.Contains(b, "spore_host_memory_free_bytes") {
		t.Fatalf("figures the host does not have (no blob store, no floor) are shown:\n%s", b)
	}
}

func TestReadMetricsToken(t *testing.T) {
	dir := t.TempDir()
	short, good := filepath.Join(dir, "short"), filepath.Join(dir, "good")
	os.WriteFile(short, []byte("abc\n"), 0o600)
	os.WriteFile(good, []byte("  0123456789abcdef\n"), 0o600)
	if _, err := ReadMetricsToken(short); err == nil || !strings.Contains(err.Error(), "at least 16") {
		t.Fatalf("a short token: %v", err)
	}
	if _, err := ReadMetricsToken(filepath.Join(dir, "none")); err == nil {
		t.Fatal("a missing file was read")
	}
	if tok, err := ReadMetricsToken(good); err != nil || tok != "0123456789abcdef" {
		t.Fatalf("token %q %v", tok, err)
	}
}

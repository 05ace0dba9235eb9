package server

import (
	"context"
	"crypto/subtle"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"os"
	"strings"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/spore-run/spore/internal/engine"
	"github.com/spore-run/spore/internal/metrics"
	"github.com/spore-run/spore/internal/node"
	"github.com/spore-run/spore/internal/proxy"
)

// hostFigures reads what a host's metrics show (metrics.Host) from its
// node: the engine's sandboxes, memory, restore targets, housekeeping and
// refusals, and, with a blob store, the chunk cache and the fetches.
func hostFigures(ctx context.Context, n *node.Node) metrics.HostFigures {
	e := n.Engine
	f := metrics.HostFigures{Launch: metrics.LaunchLoad(e.LaunchLoad()), Sandboxes: map[string]int{},
		RestoreTargets: len(e.RestoreTargets()), PendingCleanups: len(e.PendingCleanups()), Quarantined: len(e.Quarantined())}
	// The stable states are always shown (0 when none), so that a
	// series exists before the first sandbox in it.
	for _, st := range []engine.State{engine.StateRunning, engine.StatePaused, engine.StateHibernated, engine.StateDead} {
		f.Sandboxes[string(st)] = 0
	}
	for _, sb := range e.List(ctx) {
		f.Sandboxes[string(sb.State)]++
	}
	if free, ok := e.MemoryFree(ctx); ok {
		f.MemoryFree = &free
	}
	f.RefusedMemory, f.RefusedTasks = e.Refusals()
	if n.Sync != nil {
		if c := n.Sync.Cache(); c != nil {
			u := c.Usage()
			f.Cache = &metrics.CacheFigures{Bytes: u.Bytes, MaxBytes: u.MaxBytes, Chunks: u.Chunks}
		}
		t := n.Sync.Totals()
		f.Fetch = &metrics.FetchFigures{Fetched: t.Fetched, Failed: t.Failed, FromCache: t.FromCache, FromPeer: t.FromPeer,
			FromStore: t.FromStore, Zero: t.Zero, PeerBytes: t.PeerBytes, StoreBytes: t.StoreBytes, Corrupt: t.Corrupt}
	}
	if t, ok := n.EgressTotals(); ok {
		f.Egress = &metrics.EgressFigures{Connections: t.Connections, Injected: t.Injected, HostMismatch: t.HostMismatch,
			BytesOut: t.BytesOut, BytesIn: t.BytesIn}
	}
	return f
}

// proxyFigures reads a sandbox traffic proxy's totals for its metrics.
func proxyFigures(p *proxy.Proxy) func() metrics.ProxyFigures {
	return func() metrics.ProxyFigures {
		t := p.Totals()
		return metrics.ProxyFigures{Requests: t.Requests, Forwarded: t.Forwarded, BytesIn: t.BytesIn, BytesOut: t.BytesOut}
	}
}

// ReadMetricsToken reads the bearer token a metrics scrape must present
// (--metrics-token-file): at least 16 characters.
func ReadMetricsToken(path string) (string, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return "", fmt.Errorf("--metrics-token-file: %w", err)
	}
	tok := strings.TrimSpace(string(b))
	if len(tok) < 16 {
		return "", fmt.Errorf("--metrics-token-file %s: the token must be at least 16 characters", path)
	}
	return tok, nil
}

// MetricsHandler serves reg's metrics at GET /metrics to a request that
// presents token as its bearer (constant-time comparison); anything else
// is a 401 (a wrong or no token) or a 404 (another path), and costs no
// metrics collection.
func MetricsHandler(reg *prometheus.Registry, token string, log *slog.Logger) http.Handler {
	h := promhttp.HandlerFor(reg, promhttp.HandlerOpts{ErrorLog: slog.NewLogLogger(log.Handler(), slog.LevelWarn),
		ErrorHandling: promhttp.ContinueOnError, Timeout: metrics.ScrapeTimeout + time.Second})
	mux := http.NewServeMux()
	mux.HandleFunc("GET /metrics", func(w http.ResponseWriter, r *http.Request) {
		got, ok := strings.CutPrefix(r.Header.Get("Authorization"), "Bearer ")
		if !ok || subtle.ConstantTimeCompare([]byte(got), []byte(token)) != 1 {
			w.Header().Set("WWW-Authenticate", `Bearer realm="spore metrics"`)
			w.Header().Set("Content-Type", "application/json")
			w.WriteHeader(http.StatusUnauthorized)
			w.Write([]byte(`{"code":401,"message":"a metrics scrape needs the metrics token as its bearer"}` + "\n"))
			return
		}
		h.ServeHTTP(w, r)
	})
	return mux
}

// listenMetrics binds a node's metrics listener (--metrics-listen) and
// returns the function that serves h there until ctx ends.
func listenMetrics(ctx context.Context, listen string, h http.Handler, log *slog.Logger) (serve func(), err error) {
	ln, err := net.Listen("tcp", listen)
	if err != nil {
		return nil, fmt.Errorf("--metrics-listen: %w", err)
	}
	srv := &http.Server{Handler: h, ReadHeaderTimeout: 10 * time.Second}
	return func() {
		go func() {
			<-ctx.Done()
			sctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			defer cancel()
			srv.Shutdown(sctx)
		}()
		log.Info("metrics", "listen", ln.Addr().String())
		if err := srv.Serve(ln); err != nil && !errors.Is(err, http.ErrServerClosed) {
			log.Error("metrics listener", "err", err)
		}
	}, nil
}

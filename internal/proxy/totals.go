package proxy

import (
	"io"
	"maps"
	"net/http"
	"sync"
	"sync/atomic"
)

// Totals are a proxy's requests since it started, for metrics
// (docs/metrics.md): counted when each one's handler returns.
type Totals struct {
	// Requests by the status the proxy answered or forwarded (0: none
	// written, the client gone first).
	Requests map[int]int64
	// Forwarded counts the requests sent on to a sandbox (or its node's
	// proxy); the others the proxy answered itself (refused, 4xx).
	Forwarded int64
	// BytesIn are request body bytes read from clients, BytesOut response
	// body bytes written to them (not what follows an upgrade: a
	// WebSocket's frames are not counted).
	BytesIn, BytesOut int64
}

type totals struct {
	mu sync.Mutex
	t  Totals
}

// Totals returns the proxy's totals now (a copy).
func (p *Proxy) Totals() Totals {
	p.totals.mu.Lock()
	defer p.totals.mu.Unlock()
	t := p.totals.t
	t.Requests = maps.Clone(t.Requests)
	return t
}

func (t *totals) add(status int, forwarded bool, in, out int64) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.t.Requests == nil {
		t.t.Requests = map[int]int64{}
	}
	t.t.Requests[status]++
	if forwarded {
		t.t.Forwarded++
	}
	t.t.BytesIn += in
	t.t.BytesOut += out
}

// countingWriter records the status and body bytes written. Unwrap lets
// http.ResponseController (the reverse proxy's flushes and upgrades, full
// duplex) reach the server's writer.
type countingWriter struct {
	http.ResponseWriter
	status int
	n      int64
}

func (w *countingWriter) WriteHeader(code int) {
	if w.status == 0 && code >= 200 {
		w.status = code
	}
	w.ResponseWriter.WriteHeader(code)
}

func (w *countingWriter) Write(b []byte) (int, error) {
	if w.status == 0 {
		w.status = http.StatusOK
	}
	n, err := w.ResponseWriter.Write(b)
	w.n += int64(n)
	return n, err
}

func (w *countingWriter) Flush() { http.NewResponseController(w.ResponseWriter).Flush() }

func (w *countingWriter) Unwrap() http.ResponseWriter { return w.ResponseWriter }

// countingBody counts the bytes read from a request body (read by the
// transport's goroutine while the handler runs: atomic).
type countingBody struct {
	io.ReadCloser
	n atomic.Int64
}

func (b *countingBody) Read(p []byte) (int, error) {
	n, err := b.ReadCloser.Read(p)
	b.n.Add(int64(n))
	return n, err
}

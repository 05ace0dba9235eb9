// Package timing records how long the phases of one request take, so the
// API can report them in a Server-Timing header (RFC: W3C Server Timing)
// and benchmarks can show where an operation's time goes.
//
// A Recorder travels in the request's context; code deep in the engine
// calls Track without knowing whether anybody listens.
package timing

import (
	"context"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"time"
)

// Recorder accumulates named phases. Phases with the same name (the
// restores of a fork's children, say) add up and count.
type Recorder struct {
	mu    sync.Mutex
	order []string
	parts map[string]*Part
}

// Part is one named phase: the sum of its durations and how many there were.
type Part struct {
	Name  string
	Total time.Duration
	Count int
}

type key struct{}

// With returns ctx carrying a new Recorder.
func With(ctx context.Context) (context.Context, *Recorder) {
	r := &Recorder{parts: map[string]*Part{}}
	return context.WithValue(ctx, key{}, r), r
}

// FromContext returns ctx's Recorder, or nil (a nil Recorder ignores Add).
func FromContext(ctx context.Context) *Recorder {
	r, _ := ctx.Value(key{}).(*Recorder)
	return r
}

// Track starts timing phase name; the returned func ends it. Without a
// Recorder in ctx it costs a context lookup.
func Track(ctx context.Context, name string) func() {
	r := FromContext(ctx)
	if r == nil {
		return func() {}
	}
	t0 := time.Now()
	return func() { r.Add(name, time.Since(t0)) }
}

// Add records d against name.
func (r *Recorder) Add(name string, d time.Duration) {
	if r == nil {
		return
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	p := r.parts[name]
	if p == nil {
		p = &Part{Name: name}
		r.parts[name] = p
		r.order = append(r.order, name)
	}
	p.Total += d
	p.Count++
}

// Parts returns the phases in the order they first started.
func (r *Recorder) Parts() []Part {
	r.mu.Lock()
	defer r.mu.Unlock()
	out := make([]Part, 0, len(r.order))
	for _, n := range r.order {
		out = append(out, *r.parts[n])
	}
	return out
}

// Header renders the phases as a Server-Timing value:
// `restore;dur=151.2, envd;dur=3.4;desc="x10"`.
func (r *Recorder) Header() string {
	var b strings.Builder
	for i, p := range r.Parts() {
		if i > 0 {
			b.WriteString(", ")
		}
		fmt.Fprintf(&b, "%s;dur=%.1f", p.Name, float64(p.Total.Microseconds())/1000)
		if p.Count > 1 {
			fmt.Fprintf(&b, `;desc="x%d"`, p.Count)
		}
	}
	return b.String()
}

// Parse reads a Server-Timing header value back into phase durations in
// milliseconds (entries without a dur are skipped).
func Parse(v string) map[string]float64 {
	out := map[string]float64{}
	entries(v, func(name string, params map[string]string) {
		if ms, err := strconv.ParseFloat(params["dur"], 64); err == nil {
			out[name] += ms
		}
	})
	return out
}

// ParseCounts reads how many times each phase of a Server-Timing header
// value happened (the `desc="xN"` Header writes; 1 without one).
func ParseCounts(v string) map[string]int {
	out := map[string]int{}
	entries(v, func(name string, params map[string]string) {
		n, err := strconv.Atoi(strings.TrimPrefix(strings.Trim(params["desc"], `"`), "x"))
		if err != nil || n < 1 {
			n = 1
		}
		out[name] += n
	})
	return out
}

// entries calls fn with each named entry of a Server-Timing value and its
// parameters (the last of a repeated one).
func entries(v string, fn func(name string, params map[string]string)) {
	for _, entry := range strings.Split(v, ",") {
		fields := strings.Split(strings.TrimSpace(entry), ";")
		name := strings.TrimSpace(fields[0])
		if name == "" {
			continue
		}
		params := map[string]string{}
		for _, f := range fields[1:] {
			if k, val, ok := strings.Cut(strings.TrimSpace(f), "="); ok {
				params[k] = val
			}
		}
		fn(name, params)
	}
}

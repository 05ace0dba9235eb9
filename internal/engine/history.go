package engine

import (
	"sync"
	"time"
)

// Resource history: the activity samples (SampleActivity, every few
// seconds, pressure.go) also keep, per sandbox, a sample every
// historyEvery for the last historyLen of them (an hour), in memory:
// E2B's getMetrics(start, end) reads them (StatsHistory, through the node
// contract). A sandbox's history goes with it; it starts again on another
// node when the sandbox moves, and with the node process.

const (
	historyEvery = 5 * time.Second
	historyLen   = 720 // an hour at historyEvery
)

// StatsSample is one sample of a sandbox's resource use over the time
// since the previous one.
type StatsSample struct {
	At          time.Time
	CPUPct      float64 // of its vCPUs, 0-100
	VCPUs       float64 // its limit; the host's count when it has none
	MemoryBytes int64
	MemoryLimit int64
	DiskBytes   int64
}

// history is the samples kept per sandbox, each a ring of historyLen.
type history struct {
	mu  sync.Mutex
	per map[string]*ring
}

type ring struct {
	s    []StatsSample // oldest first once full: at next
	next int
	full bool
}

func (r *ring) add(s StatsSample) {
	if !r.full && len(r.s) < historyLen {
		r.s = append(r.s, s)
		r.full = len(r.s) == historyLen
		return
	}
	r.s[r.next] = s
	r.next = (r.next + 1) % historyLen
}

func (r *ring) last() (StatsSample, bool) {
	if len(r.s) == 0 {
		return StatsSample{}, false
	}
	if !r.full {
		return r.s[len(r.s)-1], true
	}
	return r.s[(r.next+historyLen-1)%historyLen], true
}

// ordered lists the samples oldest first.
func (r *ring) ordered() []StatsSample {
	if !r.full {
		return r.s
	}
	return append(append([]StatsSample(nil), r.s[r.next:]...), r.s[:r.next]...)
}

// record keeps s for sandbox id when the last kept one is historyEvery
// old or more (the activity samples come more often).
func (h *history) record(id string, s StatsSample) {
	h.mu.Lock()
	defer h.mu.Unlock()
	r := h.per[id]
	if r == nil {
		r = &ring{}
		h.per[id] = r
	}
	if last, ok := r.last(); ok && s.At.Sub(last.At) < historyEvery-historyEvery/10 {
		return
	}
	r.add(s)
}

// prune drops the history of sandboxes not in keep.
func (h *history) prune(keep func(id string) bool) {
	h.mu.Lock()
	defer h.mu.Unlock()
	for id := range h.per {
		if !keep(id) {
			delete(h.per, id)
		}
	}
}

// StatsHistory lists the samples kept of sandbox id taken in [start, end]
// (a zero bound is open), oldest first. An unknown sandbox is
// ErrNotFound; one with no sample yet (just made, or no stats from its
// runtime) has none.
func (e *Engine) StatsHistory(id string, start, end time.Time) ([]StatsSample, error) {
	if _, err := e.load(id); err != nil {
		return nil, err
	}
	h := &e.mem.hist
	h.mu.Lock()
	defer h.mu.Unlock()
	r := h.per[id]
	if r == nil {
		return []StatsSample{}, nil
	}
	out := []StatsSample{}
	for _, s := range r.ordered() {
		if (start.IsZero() || !s.At.Before(start)) && (end.IsZero() || !s.At.After(end)) {
			out = append(out, s)
		}
	}
	return out, nil
}

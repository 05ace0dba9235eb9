package control

import (
	"context"
	"fmt"
	"time"

	"github.com/spore-run/spore/internal/errdefs"
	"github.com/spore-run/spore/internal/nodeapi"
	"github.com/spore-run/spore/internal/store"
)

// Metric is one sample of a sandbox's resource use.
type Metric struct {
	Timestamp     time.Time `json:"timestamp"`
	TimestampUnix int64     `json:"timestampUnix"`
	CPUCount      int       `json:"cpuCount"`
	CPUUsedPct    float64   `json:"cpuUsedPct"`
	MemUsed       int64     `json:"memUsed"`
	MemTotal      int64     `json:"memTotal"`
	DiskUsed      int64     `json:"diskUsed"`
	DiskTotal     int64     `json:"diskTotal"`
}

// Metric sampling bounds: CPU use is the CPU time used between two reads
// cpuWindow apart; the whole call is bounded by metricsTimeout.
const (
	cpuWindow      = 200 * time.Millisecond
	metricsTimeout = 5 * time.Second
)

// Metrics lists a sandbox's resource use over time (E2B's getMetrics):
// the samples its node keeps (every 5 s, the last hour: nodeapi
// StatsHistory) taken in [start, end] (a zero bound is open). A running
// sandbox with no sample in the window that reaches now (just made or
// resumed) gets one read now. Everything is read from the host (the
// instance's cgroups and the file backing its overlay): nothing runs
// inside the sandbox, so what its guest does to its own binaries or /proc
// cannot hang, flood or falsify the call. A hibernated sandbox has none.
func (s *Service) Metrics(ctx context.Context, id string, start, end time.Time) ([]Metric, error) {
	if !start.IsZero() && !end.IsZero() && end.Before(start) {
		return nil, errdefs.Invalidf("metrics: end %s is before start %s", end.Format(time.RFC3339), start.Format(time.RFC3339))
	}
	rec, err := s.st.GetSandbox(ctx, id)
	if err != nil {
		return nil, err
	}
	if rec.State != store.StateRunning && rec.State != store.StatePaused {
		return []Metric{}, nil
	}
	n, err := s.nodeOf(rec)
	if err != nil {
		return nil, err
	}
	ctx, cancel := context.WithTimeout(ctx, metricsTimeout)
	defer cancel()
	h, err := n.StatsHistory(ctx, id, start, end)
	if errdefs.IsUnavailable(err) && ctx.Err() == nil {
		h = nil // a node that keeps none (an older release): a sample now
	} else if err != nil {
		return nil, fmt.Errorf("metrics of %s: %w", id, err)
	}
	out := make([]Metric, 0, len(h)+1)
	for _, sm := range h {
		m := Metric{Timestamp: sm.At.UTC(), TimestampUnix: sm.At.Unix(), CPUCount: rec.CPUCount, CPUUsedPct: sm.CPUPct,
			MemUsed: sm.MemoryBytes, MemTotal: sm.MemoryLimit, DiskUsed: sm.DiskBytes, DiskTotal: int64(rec.DiskSizeMB) << 20}
		if m.MemTotal == 0 {
			m.MemTotal = int64(rec.MemoryMB) << 20
		}
		out = append(out, m)
	}
	if len(out) > 0 || rec.State != store.StateRunning || !end.IsZero() && end.Before(s.now().Add(-historyGap)) {
		return out, nil
	}
	m, err := s.readMetric(ctx, n, rec)
	if err != nil {
		return nil, err
	}
	return []Metric{m}, nil
}

// historyGap is how old a window's end may be and still be "now": a node
// keeps a sample every 5 s.
const historyGap = 10 * time.Second

// readMetric samples a running sandbox's CPU, memory and disk now: two
// reads cpuWindow apart.
func (s *Service) readMetric(ctx context.Context, sr nodeapi.Node, rec store.Sandbox) (Metric, error) {
	id := rec.ID
	a, err := sr.Stats(ctx, id)
	if err != nil {
		return Metric{}, fmt.Errorf("metrics of %s: %w", id, err)
	}
	select {
	case <-time.After(cpuWindow):
	case <-ctx.Done():
		return Metric{}, fmt.Errorf("metrics of %s: %w: %v", id, errdefs.ErrUnavailable, ctx.Err())
	}
	b, err := sr.Stats(ctx, id)
	if err != nil {
		return Metric{}, fmt.Errorf("metrics of %s: %w", id, err)
	}
	now := s.now()
	m := Metric{Timestamp: now, TimestampUnix: now.Unix(), CPUCount: rec.CPUCount, MemUsed: b.MemoryBytes, MemTotal: b.MemoryLimit,
		DiskUsed: b.DiskBytes, DiskTotal: int64(rec.DiskSizeMB) << 20}
	if m.MemTotal == 0 {
		m.MemTotal = int64(rec.MemoryMB) << 20
	}
	if dt := b.At.Sub(a.At); dt > 0 && rec.CPUCount > 0 {
		m.CPUUsedPct = min(100, 100*float64(b.CPUUsage-a.CPUUsage)/float64(dt)/float64(rec.CPUCount))
	}
	return m, nil
}

package control

import (
	"context"
	"fmt"
	"time"

	"github.com/spore-run/spore/internal/errdefs"
	"github.com/spore-run/spore/internal/store"
)

// Metric is one sample of a sandbox's resource use.
type Metric struct {
	Timestamp  time.Time `json:"timestamp"`
	CPUCount   int       `json:"cpuCount"`
	CPUUsedPct float64   `json:"cpuUsedPct"`
	MemUsed    int64     `json:"memUsed"`
	MemTotal   int64     `json:"memTotal"`
	DiskUsed   int64     `json:"diskUsed"`
	DiskTotal  int64     `json:"diskTotal"`
}

// Metric sampling bounds: CPU use is the CPU time used between two reads
// cpuWindow apart; the whole call is bounded by metricsTimeout.
const (
	cpuWindow      = 200 * time.Millisecond
	metricsTimeout = 5 * time.Second
)

// Metrics samples a running sandbox's CPU, memory and disk now, from the
// host (the instance's cgroups and the file backing its overlay): nothing
// runs inside the sandbox, so what its guest does to its own binaries or
// /proc cannot hang, flood or falsify the call. A paused sandbox has no
// current sample (an empty list).
func (s *Service) Metrics(ctx context.Context, id string) ([]Metric, error) {
	rec, err := s.st.GetSandbox(ctx, id)
	if err != nil {
		return nil, err
	}
	if rec.State != store.StateRunning {
		return []Metric{}, nil
	}
	sr, err := s.nodeOf(rec)
	if err != nil {
		return nil, err
	}
	ctx, cancel := context.WithTimeout(ctx, metricsTimeout)
	defer cancel()
	a, err := sr.Stats(ctx, id)
	if err != nil {
		return nil, fmt.Errorf("metrics of %s: %w", id, err)
	}
	select {
	case <-time.After(cpuWindow):
	case <-ctx.Done():
		return nil, fmt.Errorf("metrics of %s: %w: %v", id, errdefs.ErrUnavailable, ctx.Err())
	}
	b, err := sr.Stats(ctx, id)
	if err != nil {
		return nil, fmt.Errorf("metrics of %s: %w", id, err)
	}
	m := Metric{Timestamp: s.now(), CPUCount: rec.CPUCount, MemUsed: b.MemoryBytes, MemTotal: b.MemoryLimit,
		DiskUsed: b.DiskBytes, DiskTotal: int64(rec.DiskSizeMB) << 20}
	if m.MemTotal == 0 {
		m.MemTotal = int64(rec.MemoryMB) << 20
	}
	if dt := b.At.Sub(a.At); dt > 0 && rec.CPUCount > 0 {
		m.CPUUsedPct = min(100, 100*float64(b.CPUUsage-a.CPUUsage)/float64(dt)/float64(rec.CPUCount))
	}
	return []Metric{m}, nil
}

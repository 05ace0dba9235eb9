package control

import (
	"bytes"
	"context"
	"strconv"
	"strings"
	"time"

	"github.com/spore-run/spore/internal/runtime"
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

// Execer runs a command in a sandbox (the engine does).
type Execer interface {
	Exec(ctx context.Context, id string, spec runtime.ExecSpec) (int, error)
}

// metricsScript samples CPU twice 200 ms apart, memory and the root
// filesystem, as the sandbox's own kernel reports them.
const metricsScript = `head -1 /proc/stat; sleep 0.2; head -1 /proc/stat; grep -E '^(MemTotal|MemAvailable):' /proc/meminfo; df -B1 --output=used,size / | tail -1`

// Metrics samples a running sandbox's CPU, memory and disk now. A paused
// sandbox has no current sample (an empty list).
func (s *Service) Metrics(ctx context.Context, id string) ([]Metric, error) {
	rec, err := s.st.GetSandbox(ctx, id)
	if err != nil {
		return nil, err
	}
	if rec.State != store.StateRunning {
		return []Metric{}, nil
	}
	ex, ok := s.eng.(Execer)
	if !ok {
		return []Metric{}, nil
	}
	var out bytes.Buffer
	if _, err := ex.Exec(ctx, id, runtime.ExecSpec{Args: []string{"/bin/sh", "-c", metricsScript}, Stdout: &out}); err != nil {
		return nil, err
	}
	m := Metric{Timestamp: s.now(), CPUCount: rec.CPUCount}
	lines := strings.Split(strings.TrimSpace(out.String()), "\n")
	if len(lines) >= 5 {
		b1, i1 := cpuTimes(lines[0])
		b2, i2 := cpuTimes(lines[1])
		if d := b2 - b1; d > 0 {
			m.CPUUsedPct = 100 * float64(d-(i2-i1)) / float64(d)
		}
		total, avail := kb(lines[2]), kb(lines[3])
		m.MemTotal, m.MemUsed = total, total-avail
		if f := strings.Fields(lines[4]); len(f) == 2 {
			m.DiskUsed, _ = strconv.ParseInt(f[0], 10, 64)
			m.DiskTotal, _ = strconv.ParseInt(f[1], 10, 64)
		}
	}
	return []Metric{m}, nil
}

// cpuTimes returns total and idle jiffies of a /proc/stat "cpu" line.
func cpuTimes(line string) (total, idle int64) {
	f := strings.Fields(line)
	for i, v := range f[1:] {
		n, _ := strconv.ParseInt(v, 10, 64)
		total += n
		if i == 3 || i == 4 { // idle, iowait
			idle += n
		}
	}
	return total, idle
}

func kb(line string) int64 {
	f := strings.Fields(line)
	if len(f) < 2 {
		return 0
	}
	n, _ := strconv.ParseInt(f[1], 10, 64)
	return n * 1024
}

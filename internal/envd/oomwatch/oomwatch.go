// Package oomwatch is the sandbox's own out-of-memory killer, run by envd.
//
// gVisor has none: a sandbox that reaches its memory limit is handled by
// the host's OOM killer, which would pick the biggest host process of the
// sandbox, the gVisor kernel itself, and end the whole sandbox. The node
// makes every guest process's host stub the host OOM killer's first choice
// (oom_score_adj 1000), but stub sizes do not reflect guest memory, so the
// host may pick an innocent bystander. This watchdog kills the right
// process first, like Linux's OOM killer inside a VM: when the guest
// processes' resident memory passes a share of the sandbox's memory, the
// largest one (never envd) gets SIGKILL. Its parent sees it die of SIGKILL
// (a shell reports 137).
//
// It polls, more often the closer use is to the limit, and each poll is
// cheap until memory is actually short: it first reads one global figure,
// the sandbox kernel's memory in use (sysinfo(2): under gVisor, the
// allocated size of its memory file, so guest processes, tmpfs and page
// cache alike), and walks /proc only above ScanShare of the limit. An idle
// sandbox costs one system call per poll.
package oomwatch

import (
	"bytes"
	"context"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync/atomic"
	"syscall"
	"time"
)

// Config tunes the watchdog. Zero values take the defaults.
type Config struct {
	// Limit is the sandbox's memory in bytes. Zero: the sandbox's total
	// memory (MemTotal, which gVisor sets from the sandbox's memory
	// cgroup), read again at every check: a sandbox restored with more
	// (or less) memory than its snapshot was taken with is watched
	// against its own limit, not the one this daemon started under.
	Limit int64
	// Total reads the sandbox's total memory when Limit is zero (default:
	// sysinfo(2)'s totalram; MemTotal of Proc's meminfo when Proc is not
	// /proc, for tests).
	Total func() int64
	// Share of Limit the guest processes' resident memory may use before
	// the largest is killed (default 0.85: the sandbox kernel and page
	// cache need the rest).
	Share float64
	// ScanShare of Limit the sandbox's total memory in use (Used) must
	// reach before the processes are scanned at all (default 0.70).
	ScanShare float64
	// GrowthRate is the fastest growth (bytes/s) the poll interval is
	// sized for: the next poll comes before memory growing this fast could
	// cross the threshold (default 1 GiB/s, twice python filling a
	// bytearray here; faster hogs are left to the host's OOM killer, which
	// kills guest processes first), within [MinInterval, MaxInterval]
	// (default 10 ms, 1 s). Every poll wakes the sandbox, and a wake costs
	// the host ~1.7 ms of CPU whatever the poll does (measured), so idle
	// polls must be rare.
	GrowthRate  int64
	MinInterval time.Duration
	MaxInterval time.Duration
	// IdleInterval, when set, is the interval while memory is low (under
	// IdleShare of Limit, default 0.5) and no Alert came in the last
	// AlertHold (default 10 s). Set it only when the host alerts the
	// watchdog as the sandbox's memory rises (the node's runtime signals
	// envd): growth from idle is then announced, not polled for.
	IdleInterval time.Duration
	IdleShare    float64
	AlertHold    time.Duration
	// Proc is the proc filesystem (default /proc; tests).
	Proc string
	// Used reports the memory the whole sandbox uses, in bytes (default:
	// sysinfo(2)'s totalram - freeram; tests). An error makes every poll
	// scan the processes.
	Used func() (int64, error)
	// Protected reports processes never to kill (default: PID 1 and this
	// process).
	Protected func(pid int) bool
	// Kill kills a process (default SIGKILL; tests).
	Kill   func(pid int) error
	Logger *slog.Logger
}

func (c *Config) defaults() {
	if c.Share <= 0 || c.Share > 1 {
		c.Share = 0.85
	}
	if c.ScanShare <= 0 || c.ScanShare > c.Share {
		c.ScanShare = min(0.70, c.Share)
	}
	if c.GrowthRate <= 0 {
		c.GrowthRate = 1 << 30
	}
	if c.MinInterval <= 0 {
		c.MinInterval = 10 * time.Millisecond
	}
	if c.MaxInterval <= 0 {
		c.MaxInterval = time.Second
	}
	if c.IdleShare <= 0 || c.IdleShare > c.ScanShare {
		c.IdleShare = min(0.5, c.ScanShare)
	}
	if c.AlertHold <= 0 {
		c.AlertHold = 10 * time.Second
	}
	if c.Proc == "" {
		c.Proc = "/proc"
	}
	if c.Protected == nil {
		self := os.Getpid()
		c.Protected = func(pid int) bool { return pid == 1 || pid == self }
	}
	if c.Used == nil {
		c.Used = sysinfoUsed
	}
	if c.Kill == nil {
		c.Kill = func(pid int) error { return syscall.Kill(pid, syscall.SIGKILL) }
	}
	if c.Logger == nil {
		c.Logger = slog.New(slog.DiscardHandler)
	}
	if c.Total == nil {
		proc := c.Proc
		c.Total = func() int64 {
			if proc != "/proc" {
				return memTotal(proc)
			}
			return sysinfoTotal()
		}
	}
}

// Watchdog watches the sandbox's memory.
type Watchdog struct {
	cfg       Config
	follow    bool  // the limit is the sandbox's total memory, re-read
	limit     int64 // the limit the thresholds are from
	pageSize  int64
	lastKill  int // PID killed last, until it is gone
	killedAt  time.Time
	buf       []byte
	threshold int64
	scanAt    int64
	idleBelow int64
	scans     int          // how many Checks walked /proc (tests)
	alerted   atomic.Int64 // unix nanoseconds of the last Alert
	wake      chan struct{}
	now       func() time.Time
}

// New returns a watchdog, or nil when the sandbox's memory is unknown.
func New(cfg Config) *Watchdog {
	cfg.defaults()
	w := &Watchdog{cfg: cfg, pageSize: int64(os.Getpagesize()), buf: make([]byte, 512),
		wake: make(chan struct{}, 1), now: time.Now, follow: cfg.Limit <= 0}
	limit := cfg.Limit
	if w.follow {
		limit = cfg.Total()
	}
	if limit <= 0 {
		cfg.Logger.Warn("oomwatch: memory limit unknown: not watching")
		return nil
	}
	w.setLimit(limit)
	return w
}

// setLimit sets the limit and the thresholds made from it.
func (w *Watchdog) setLimit(limit int64) {
	w.limit = limit
	w.threshold = int64(float64(limit) * w.cfg.Share)
	w.scanAt = int64(float64(limit) * w.cfg.ScanShare)
	w.idleBelow = int64(float64(limit) * w.cfg.IdleShare)
}

// Limit is the memory limit the watchdog works from now.
func (w *Watchdog) Limit() int64 { return w.limit }

// Threshold is the resident memory at which the largest process is killed.
func (w *Watchdog) Threshold() int64 { return w.threshold }

// Run watches until ctx ends.
func (w *Watchdog) Run(ctx context.Context) {
	w.cfg.Logger.Info("oomwatch: watching", "limit", w.limit, "threshold", w.threshold)
	t := time.NewTimer(0)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		case <-w.wake:
			t.Stop()
		}
		t.Reset(w.Check())
	}
}

// Alert says the sandbox's memory is rising (the host saw it cross a
// share of the limit): check now, and poll by the headroom for AlertHold.
func (w *Watchdog) Alert() {
	w.alerted.Store(w.now().UnixNano())
	select {
	case w.wake <- struct{}{}:
	default:
	}
}

// Check samples once, kills if over the threshold, and returns when to
// check next.
func (w *Watchdog) Check() time.Duration {
	if w.follow {
		if t := w.cfg.Total(); t > 0 && t != w.limit {
			w.cfg.Logger.Info("oomwatch: the sandbox's memory changed", "limit", t, "was", w.limit)
			w.setLimit(t)
		}
	}
	// The cheap figure first: the sandbox's whole memory in use bounds
	// what its processes hold, so far below the threshold there is
	// nothing to look for.
	if used, err := w.cfg.Used(); err == nil && used < w.scanAt {
		if w.cfg.IdleInterval > 0 && used < w.idleBelow && w.now().Sub(time.Unix(0, w.alerted.Load())) > w.cfg.AlertHold {
			return w.cfg.IdleInterval
		}
		return w.interval(w.threshold - used)
	}
	w.scans++
	total, victim, victimRSS := w.scan()
	if total >= w.threshold && victim > 0 && !w.dying(victim) {
		w.cfg.Logger.Warn("oomwatch: out of memory: killing the largest process",
			"pid", victim, "rss", victimRSS, "total_rss", total, "threshold", w.threshold, "cmd", w.cmdline(victim))
		if err := w.cfg.Kill(victim); err == nil {
			w.lastKill, w.killedAt = victim, time.Now()
		}
		return w.cfg.MinInterval
	}
	return w.interval(w.threshold - total)
}

// interval is how long memory growing at GrowthRate takes to cover head
// bytes, bounded by MinInterval and MaxInterval.
func (w *Watchdog) interval(head int64) time.Duration {
	if head <= 0 {
		return w.cfg.MinInterval
	}
	d := time.Duration(float64(head) / float64(w.cfg.GrowthRate) * float64(time.Second))
	return min(max(d, w.cfg.MinInterval), w.cfg.MaxInterval)
}

// sysinfoUsed is the memory in use by the whole system as sysinfo(2)
// reports it. gVisor answers from its own accounting (one fstat of its
// memory file, no guest walk): total minus free moves with every guest
// allocation, tmpfs file and cached page (measured: a 300 MB bytearray
// moved it by 304 MB, 200 MB in /dev/shm by 200 MB).
func sysinfoUsed() (int64, error) {
	var si syscall.Sysinfo_t
	if err := syscall.Sysinfo(&si); err != nil {
		return 0, err
	}
	unit := max(int64(si.Unit), 1)
	return (int64(si.Totalram) - int64(si.Freeram)) * unit, nil
}

// sysinfoTotal is the sandbox's total memory as sysinfo(2) reports it
// (gVisor: its memory limit, the restored one after a restore).
func sysinfoTotal() int64 {
	var si syscall.Sysinfo_t
	if err := syscall.Sysinfo(&si); err != nil {
		return 0
	}
	return int64(si.Totalram) * max(int64(si.Unit), 1)
}

// dying reports whether pid is the process killed last and it may still
// be releasing its memory (then no second process dies for it).
func (w *Watchdog) dying(pid int) bool {
	return pid == w.lastKill && time.Since(w.killedAt) < time.Second
}

// scan sums the resident memory of every process and finds the largest
// one that may be killed.
func (w *Watchdog) scan() (total int64, victim int, victimRSS int64) {
	d, err := os.Open(w.cfg.Proc)
	if err != nil {
		return 0, 0, 0
	}
	defer d.Close()
	names, _ := d.Readdirnames(-1)
	for _, n := range names {
		pid, err := strconv.Atoi(n)
		if err != nil {
			continue
		}
		rss := w.rss(pid)
		total += rss
		if rss > victimRSS && !w.cfg.Protected(pid) {
			victim, victimRSS = pid, rss
		}
	}
	return total, victim, victimRSS
}

// rss reads a process's resident memory from /proc/<pid>/statm.
func (w *Watchdog) rss(pid int) int64 {
	f, err := os.Open(filepath.Join(w.cfg.Proc, strconv.Itoa(pid), "statm"))
	if err != nil {
		return 0
	}
	n, _ := io.ReadFull(f, w.buf)
	f.Close()
	fields := bytes.Fields(w.buf[:n])
	if len(fields) < 2 {
		return 0
	}
	pages, _ := strconv.ParseInt(string(fields[1]), 10, 64)
	return pages * w.pageSize
}

func (w *Watchdog) cmdline(pid int) string {
	b, _ := os.ReadFile(filepath.Join(w.cfg.Proc, strconv.Itoa(pid), "cmdline"))
	if len(b) > 200 {
		b = b[:200]
	}
	return strings.TrimSpace(strings.ReplaceAll(string(b), "\x00", " "))
}

// memTotal reads MemTotal from /proc/meminfo, in bytes (0 if unknown).
func memTotal(proc string) int64 {
	b, err := os.ReadFile(filepath.Join(proc, "meminfo"))
	if err != nil {
		return 0
	}
	for _, line := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(line, "MemTotal:"); ok {
			f := strings.Fields(v)
			if len(f) >= 1 {
				n, _ := strconv.ParseInt(f[0], 10, 64)
				return n << 10
			}
		}
	}
	return 0
}

package oomwatch

import (
	"os"
	"path/filepath"
	"strconv"
	"testing"
	"time"
)

// fakeProc writes a /proc with the given resident pages per PID.
func fakeProc(t *testing.T, memTotalKB int64, rss map[int]int64) string {
	t.Helper()
	dir := t.TempDir()
	os.WriteFile(filepath.Join(dir, "meminfo"), []byte("MemTotal:  "+strconv.FormatInt(memTotalKB, 10)+" kB\nMemFree: 1 kB\n"), 0o644)
	for pid, pages := range rss {
		p := filepath.Join(dir, strconv.Itoa(pid))
		os.MkdirAll(p, 0o755)
		os.WriteFile(filepath.Join(p, "statm"), []byte("100000 "+strconv.FormatInt(pages, 10)+" 10 1 0 5 0\n"), 0o644)
		os.WriteFile(filepath.Join(p, "cmdline"), []byte("proc\x00"+strconv.Itoa(pid)), 0o644)
	}
	os.MkdirAll(filepath.Join(dir, "self"), 0o755)
	return dir
}

func TestKillsLargestUnprotectedOverThreshold(t *testing.T) {
	page := int64(os.Getpagesize())
	limit := int64(100 << 20)
	// envd (PID 1) is the largest, then the hog (7), a bystander (9).
	proc := fakeProc(t, limit>>10, map[int]int64{1: 50 << 20 / page, 7: 30 << 20 / page, 9: 10 << 20 / page})
	var killed []int
	used := func() (int64, error) { return 95 << 20, nil }
	w := New(Config{Proc: proc, Used: used, Kill: func(pid int) error { killed = append(killed, pid); return nil }})
	if w.Threshold() != int64(float64(limit)*0.85) {
		t.Fatalf("threshold %d from MemTotal %d", w.Threshold(), limit)
	}
	if d := w.Check(); d != w.cfg.MinInterval || len(killed) != 1 || killed[0] != 7 {
		t.Fatalf("killed %v (next check in %v), want [7]: the largest process that is not PID 1", killed, d)
	}
	// Still over the limit while 7 dies: nobody else is killed for it.
	w.Check()
	if len(killed) != 1 {
		t.Fatalf("killed %v while the first victim was still dying", killed)
	}
}

func TestUnderThresholdKillsNothingAndPollsSlowly(t *testing.T) {
	page := int64(os.Getpagesize())
	proc := fakeProc(t, 1<<20, map[int]int64{1: 20 << 20 / page, 5: 10 << 20 / page})
	killed := 0
	used := func() (int64, error) { return 30 << 20, nil }
	w := New(Config{Proc: proc, Used: used, Kill: func(int) error { killed++; return nil }})
	if d := w.Check(); killed != 0 || d < 300*time.Millisecond {
		t.Fatalf("killed %d, next check in %v; want none and a long interval far from the limit", killed, d)
	}
	// Close to the threshold it polls faster.
	proc = fakeProc(t, 1<<20, map[int]int64{1: 20 << 20 / page, 5: 840 << 20 / page})
	used = func() (int64, error) { return 860 << 20, nil }
	w = New(Config{Proc: proc, Used: used, Kill: func(int) error { killed++; return nil }})
	if d := w.Check(); killed != 0 || d >= 100*time.Millisecond {
		t.Fatalf("killed %d, next check in %v; want none and a short interval near the limit", killed, d)
	}
}

// TestFarBelowTheLimitReadsOnlyTheGlobalFigure: while the sandbox's whole
// memory in use is under ScanShare of the limit, a poll reads that one
// figure and never walks /proc (the walk is what made an idle sandbox
// expensive); above it, the processes are scanned.
func TestFarBelowTheLimitReadsOnlyTheGlobalFigure(t *testing.T) {
	page := int64(os.Getpagesize())
	proc := fakeProc(t, 1<<20, map[int]int64{1: 20 << 20 / page, 5: 100 << 20 / page})
	used := int64(120 << 20)
	w := New(Config{Proc: proc, Used: func() (int64, error) { return used, nil }, Kill: func(int) error { return nil }})
	for range 10 {
		if d := w.Check(); d < 300*time.Millisecond {
			t.Fatalf("idle poll: next in %v, want a long interval", d)
		}
	}
	if w.scans != 0 {
		t.Fatalf("%d polls walked /proc while the sandbox used %d of %d bytes", w.scans, used, w.Limit())
	}
	used = int64(float64(w.Limit())*0.70) + 1
	w.Check()
	if w.scans != 1 {
		t.Fatalf("polls walking /proc above 70%%: %d, want 1", w.scans)
	}
	// Without the global figure, every poll scans.
	w = New(Config{Proc: proc, Used: func() (int64, error) { return 0, os.ErrNotExist }, Kill: func(int) error { return nil }})
	w.Check()
	if w.scans != 1 {
		t.Fatalf("polls walking /proc without the global figure: %d, want 1", w.scans)
	}
}

// TestGrowingHogIsCaughtBeforeTheLimit replays a hog growing steadily from
// an idle sandbox (450 MB/s, as python's bytearray measured here, and at
// the default GrowthRate the intervals are sized for) on a simulated clock: the poll
// that kills it comes before memory passes the threshold by more than one
// shortest interval's growth, far from the sandbox's limit.
func TestGrowingHogIsCaughtBeforeTheLimit(t *testing.T) {
	page := int64(os.Getpagesize())
	const limit = int64(1 << 30)
	for _, rate := range []int64{450 << 20, 1 << 30} {
		proc := fakeProc(t, limit>>10, map[int]int64{1: 20 << 20 / page, 9: 50 << 20 / page})
		start := int64(80 << 20) // envd + bystander + kernel
		var now time.Duration
		hog := func() int64 { return int64(float64(rate) * now.Seconds()) }
		var killedAt int64 = -1
		w := New(Config{Proc: proc, Used: func() (int64, error) { return start + hog(), nil },
			Kill: func(pid int) error {
				if pid != 7 {
					t.Errorf("rate %d: killed %d, want the hog 7", rate, pid)
				}
				killedAt = start + hog()
				return nil
			}})
		for killedAt < 0 && now < time.Minute {
			os.MkdirAll(filepath.Join(proc, "7"), 0o755)
			os.WriteFile(filepath.Join(proc, "7", "statm"), []byte("1 "+strconv.FormatInt(hog()/page, 10)+" 0\n"), 0o644)
			now += w.Check()
		}
		over := killedAt - w.Threshold()
		t.Logf("rate %d MB/s: killed at %d MB used (threshold %d MB), after %v, %d scans", rate>>20, killedAt>>20, w.Threshold()>>20, now, w.scans)
		if killedAt < 0 || over > int64(float64(rate)*w.cfg.MinInterval.Seconds())+70<<20 || killedAt >= limit {
			t.Fatalf("rate %d: killed at %d bytes, threshold %d, limit %d", rate, killedAt, w.Threshold(), limit)
		}
	}
}

// TestIdleIntervalUntilAlerted: where the host alerts the watchdog as
// memory rises (IdleInterval set), low memory is polled rarely; an alert
// switches to polling by the headroom at once and for AlertHold; memory
// above IdleShare is polled by the headroom whatever the alerts.
func TestIdleIntervalUntilAlerted(t *testing.T) {
	page := int64(os.Getpagesize())
	proc := fakeProc(t, 1<<20, map[int]int64{1: 20 << 20 / page})
	used := int64(100 << 20)
	now := time.Unix(1000, 0)
	w := New(Config{Proc: proc, IdleInterval: 10 * time.Second, Used: func() (int64, error) { return used, nil }, Kill: func(int) error { return nil }})
	w.now = func() time.Time { return now }
	if d := w.Check(); d != 10*time.Second {
		t.Fatalf("low memory, no alert: next poll in %v, want the idle interval", d)
	}
	w.Alert()
	select {
	case <-w.wake:
	default:
		t.Fatal("an alert did not wake the watchdog")
	}
	if d := w.Check(); d > time.Second {
		t.Fatalf("just alerted: next poll in %v, want the headroom's (at most 1 s)", d)
	}
	now = now.Add(11 * time.Second)
	if d := w.Check(); d != 10*time.Second {
		t.Fatalf("alert long past: next poll in %v, want the idle interval", d)
	}
	used = 600 << 20
	if d := w.Check(); d > time.Second {
		t.Fatalf("memory above the idle share: next poll in %v, want the headroom's", d)
	}
}

// TestLimitFollowsTheSandbox: a sandbox restored with more memory than
// its snapshot had is watched against its new limit: a process that was
// over the old threshold but is under the new one lives (it was killed
// at 1.2 GB in a 2 GB sandbox restored from a 1 GB template), and the
// thresholds follow the limit down again.
func TestLimitFollowsTheSandbox(t *testing.T) {
	page := int64(os.Getpagesize())
	total := int64(1 << 30)
	proc := fakeProc(t, total>>10, map[int]int64{1: 20 << 20 / page, 7: 1200 << 20 / page})
	used := func() (int64, error) { return 1230 << 20, nil }
	var killed []int
	w := New(Config{Proc: proc, Used: used, Total: func() int64 { return total },
		Kill: func(pid int) error { killed = append(killed, pid); return nil }})
	total = 2 << 30 // restored into a 2 GiB sandbox
	w.Check()
	if want := int64(float64(total) * 0.85); len(killed) != 0 || w.Limit() != 2<<30 || w.Threshold() != want {
		t.Fatalf("killed %v; limit %d, threshold %d: want the 2 GiB limit", killed, w.Limit(), w.Threshold())
	}
	total = 1 << 30 // and back to 1 GiB
	w.Check()
	if len(killed) != 1 || killed[0] != 7 {
		t.Fatalf("killed %v at a 1 GiB limit, want [7]", killed)
	}
	// A fixed Limit is not followed.
	killed = nil
	w = New(Config{Proc: proc, Used: used, Limit: 1 << 30, Total: func() int64 { return 4 << 30 },
		Kill: func(pid int) error { killed = append(killed, pid); return nil }})
	w.Check()
	if len(killed) != 1 {
		t.Fatalf("a fixed 1 GiB limit: killed %v", killed)
	}
}

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
	w := New(Config{Proc: proc, Kill: func(pid int) error { killed = append(killed, pid); return nil }})
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
	w := New(Config{Proc: proc, Kill: func(int) error { killed++; return nil }})
	if d := w.Check(); killed != 0 || d < 300*time.Millisecond {
		t.Fatalf("killed %d, next check in %v; want none and a long interval far from the limit", killed, d)
	}
	// Close to the threshold it polls faster.
	proc = fakeProc(t, 1<<20, map[int]int64{1: 20 << 20 / page, 5: 840 << 20 / page})
	w = New(Config{Proc: proc, Kill: func(int) error { killed++; return nil }})
	if d := w.Check(); killed != 0 || d >= 100*time.Millisecond {
		t.Fatalf("killed %d, next check in %v; want none and a short interval near the limit", killed, d)
	}
}

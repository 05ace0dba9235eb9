package interp_test

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"
)

// Output that child processes write to the kernel's real stdout and stderr
// all arrives before the execution ends, exactly once, in the cell that
// wrote it: a small echo, then 100 KB of stderr and 200 KB of stdout in
// several 32 KiB reads each, twenty cells in a row. Before the end of an
// execution waited for the raw streams, the tail (or all) of it was lost or
// showed up in the next cell, most runs and nearly always under CPU load.
func TestExecuteChildOutputComplete(t *testing.T) {
	s := newServer(t)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	// The bulk comes last: the end follows its final write at once.
	const cell = "import os\n" +
		"os.system('echo head; echo err-head >&2')\n" +
		`os.system('head -c 100000 /dev/zero | tr "\\0" b >&2')` + "\n" +
		`os.system('head -c 200000 /dev/zero | tr "\\0" a')` + "\n" +
		"n = n + 1 if 'n' in globals() else 1\n" +
		"n"
	wantOut := "head\n" + strings.Repeat("a", 200000)
	wantErr := "err-head\n" + strings.Repeat("b", 100000)
	for i := 1; i <= 20; i++ {
		code, evs := s.execute(ctx, map[string]any{"code": cell}, nil)
		if code != 200 {
			t.Fatalf("cell %d: status %d", i, code)
		}
		if e := find(evs, "error"); e != nil {
			t.Fatalf("cell %d: error %v", i, e)
		}
		if r := find(evs, "result"); r == nil || r["text"] != strconv.Itoa(i) {
			t.Fatalf("cell %d: result %v", i, r)
		}
		if got := text(evs, "stdout"); got != wantOut {
			t.Fatalf("cell %d: stdout has %d bytes, want %d (ends %q)", i, len(got), len(wantOut), tail(got))
		}
		if got := text(evs, "stderr"); got != wantErr {
			t.Fatalf("cell %d: stderr has %d bytes, want %d (ends %q)", i, len(got), len(wantErr), tail(got))
		}
		if last := evs[len(evs)-1]; last["type"] != "number_of_executions" || last["execution_count"] != float64(i) {
			t.Fatalf("cell %d: last event %v, want the execution count", i, last)
		}
	}
}

func tail(s string) string {
	if len(s) > 40 {
		return s[len(s)-40:]
	}
	return s
}

// Multi-byte characters written to the raw stdout arrive whole although the
// reads split them (32 KiB reads of 10-byte lines of 2-, 3- and 4-byte
// characters). Before, each split character became U+FFFD on both sides
// of the cut.
func TestExecuteRawOutputKeepsUTF8(t *testing.T) {
	s := newServer(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	line := "é€😀\n"
	_, evs := s.execute(ctx, map[string]any{"code": "import os\nb = ('\\u00e9\\u20ac\\U0001F600\\n' * 20000).encode()\nwhile b:\n    b = b[os.write(1, b):]"}, nil)
	if got, want := text(evs, "stdout"), strings.Repeat(line, 20000); got != want {
		t.Fatalf("stdout has %d bytes (%d U+FFFD), want %d", len(got), strings.Count(got, "\uFFFD"), len(want))
	}
}

// A background child that keeps writing to the kernel's stdout and stderr
// after its cell ended neither hangs later executions nor leaks the end
// markers into anyone's output; each later cell's own output is complete.
// Its lines may show in any cell after the one that started it.
func TestExecuteBackgroundWriter(t *testing.T) {
	s := newServer(t)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	_, evs := s.execute(ctx, map[string]any{"code": "import subprocess\n" +
		"bg = subprocess.Popen(['sh', '-c', 'while :; do echo bg-out; echo bg-err >&2; done'])\n" +
		"bg.pid"}, nil)
	r := find(evs, "result")
	if r == nil {
		t.Fatalf("start = %v", evs)
	}
	pid, _ := strconv.Atoi(r["text"].(string))
	t.Cleanup(func() {
		if pid > 0 {
			syscall.Kill(pid, syscall.SIGKILL)
		}
	})
	for i := 0; i < 20; i++ {
		mine := fmt.Sprintf("mine-%d", i)
		_, evs := s.execute(ctx, map[string]any{"code": "import os\nos.system('echo " + mine + "; echo " + mine + " >&2')\nos.write(1, b'" + mine + "-raw\\n')\n"}, nil)
		for _, kind := range []string{"stdout", "stderr"} {
			got := text(evs, kind)
			var own []string
			for _, l := range strings.SplitAfter(got, "\n") {
				switch strings.TrimSuffix(l, "\n") {
				case "bg-out", "bg-err", "":
				default:
					own = append(own, l)
				}
			}
			want := mine + "\n"
			if kind == "stdout" {
				want += mine + "-raw\n"
			}
			// A bg line's bytes never split (each echo is one small write),
			// so anything else is this cell's output or a leak.
			if strings.Join(own, "") != want {
				t.Fatalf("cell %d %s: own lines %q, want %q", i, kind, own, want)
			}
		}
		if find(evs, "number_of_executions") == nil {
			t.Fatalf("cell %d ended without its count: %v", i, evs)
		}
	}
	s.execute(ctx, map[string]any{"code": "bg.kill(); bg.wait()"}, nil)
}

// A marker-like string the user prints (even the kernel's own prefix with
// a guessed token) is output like any other.
func TestExecuteForgedMarkerIsOutput(t *testing.T) {
	s := newServer(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	forged := "\x00spore-sync:00000000000000000000000000000000:0000000000000002"
	_, evs := s.execute(ctx, map[string]any{"code": "import os\nos.write(1, b'a\\x00spore-sync:00000000000000000000000000000000:0000000000000002b')\nx = 5\nx"}, nil)
	if got := text(evs, "stdout"); got != "a"+forged+"b" {
		t.Fatalf("stdout = %q", got)
	}
	if r := find(evs, "result"); r == nil || r["text"] != "5" {
		t.Fatalf("result = %v", evs)
	}
}

// A kernel that dies while a background child still holds its stdout (and,
// through os.system, every file it did not close) ends the execution with
// an error, and the next execution gets a new kernel; neither waits for the
// child. Before, the child's copies of the kernel's pipes held both until
// the child exited.
func TestExecuteKernelDeathWithOutputHolder(t *testing.T) {
	s := newServer(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	pidFile := filepath.Join(t.TempDir(), "pid")
	t.Cleanup(func() {
		if b, err := os.ReadFile(pidFile); err == nil {
			if pid, err := strconv.Atoi(strings.TrimSpace(string(b))); err == nil && pid > 0 {
				syscall.Kill(pid, syscall.SIGKILL)
			}
		}
	})
	_, evs := s.execute(ctx, map[string]any{"code": "import os\nos.system('sleep 600 & echo $! > " + pidFile + "')\nprint('before')\nos._exit(3)"}, nil)
	if e := find(evs, "error"); e == nil || e["name"] != "KernelError" {
		t.Fatalf("death = %v", evs)
	}
	if text(evs, "stdout") != "before\n" {
		t.Fatalf("output before the death = %v", evs)
	}
	_, evs = s.execute(ctx, map[string]any{"code": "'kernel' in globals(), 1 + 1"}, nil)
	if r := find(evs, "result"); r == nil || r["text"] != "(False, 2)" {
		t.Fatalf("after the death = %v", evs)
	}
}

// An interrupt that reaches the kernel after the user's code finished (the
// client went away just as the execution ended) neither kills the kernel
// nor cuts the end of the execution. The cell makes the kernel signal
// itself from its own end-of-execution flush to hit that moment every time.
// Before, the KeyboardInterrupt escaped the kernel's loop: the kernel died
// with the context's variables.
func TestExecuteLateInterruptKeepsKernel(t *testing.T) {
	s := newServer(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	_, evs := s.execute(ctx, map[string]any{"code": "import os, signal, sys\nkept = 'yes'\n" +
		"sys.stdout.flush = lambda: os.kill(os.getpid(), signal.SIGINT)"}, nil)
	if find(evs, "number_of_executions") == nil || find(evs, "error") != nil {
		t.Fatalf("cell = %v", evs)
	}
	for i := 0; i < 3; i++ {
		_, evs = s.execute(ctx, map[string]any{"code": "kept"}, nil)
		if r := find(evs, "result"); r == nil || r["text"] != "'yes'" {
			t.Fatalf("after a late interrupt = %v", evs)
		}
	}
}

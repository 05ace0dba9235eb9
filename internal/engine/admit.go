package engine

import (
	"bufio"
	"bytes"
	"fmt"
	"os"
	"strconv"
	"strings"

	"github.com/spore-run/spore/internal/errdefs"
)

// DefaultMemoryReserve is the memory floor (host memory kept free of
// sandboxes) when the engine's MemoryReserve is 0: 1 GiB, enough for the
// host's own work and for the sandboxes already running to grow a little
// between two looks of the pressure relief (pressure.go).
const DefaultMemoryReserve int64 = 1 << 30

// TaskReserve is how many kernel tasks (threads) are kept free for the
// host: a gVisor sandbox runs ~40 host threads, so on a host with the
// default kernel.pid_max of 32768 the task table, not memory, is what runs
// out first (measured: ~880 idle sandboxes; then every fork on the host
// fails, the server's included).
const TaskReserve = 2048

// admit refuses a new instance that is not a sandbox's (a restore target's
// boot) when the host's task table is nearly full or the host lacks an
// instance's own memory above its floor (admission.go admits the
// sandboxes' launches by their images' memory).
func (e *Engine) admit() error {
	if err := e.admitTasks(); err != nil {
		return err
	}
	return e.checkRoom(e.life, e.mem.overhead, "a restore target")
}

// admitTasks refuses a new instance when the host's task table is nearly
// full (not checked when the engine admits by nothing: no floor).
func (e *Engine) admitTasks() error {
	if e.mem.floor.Load() < 0 {
		return nil
	}
	if used, limit, err := tasks(); err == nil && used+TaskReserve > limit {
		e.refusals.tasks.Add(1)
		return fmt.Errorf("host task table nearly full: %d of %d tasks in use (kernel.pid_max / threads-max; `spore setup` raises pid_max): %w",
			used, limit, errdefs.ErrResourceLimit)
	}
	return nil
}

// MemAvailable returns the host's MemAvailable from /proc/meminfo, in bytes.
func MemAvailable() (int64, error) {
	b, err := os.ReadFile("/proc/meminfo")
	if err != nil {
		return 0, err
	}
	sc := bufio.NewScanner(bytes.NewReader(b))
	for sc.Scan() {
		f := bytes.Fields(sc.Bytes())
		if len(f) >= 2 && string(f[0]) == "MemAvailable:" {
			kb, err := strconv.ParseInt(string(f[1]), 10, 64)
			if err != nil {
				return 0, fmt.Errorf("meminfo: %w", err)
			}
			return kb << 10, nil
		}
	}
	return 0, fmt.Errorf("meminfo: no MemAvailable line")
}

// tasks returns how many tasks (threads) the host runs and how many it
// can: the smaller of kernel.pid_max and kernel.threads-max.
func tasks() (used, limit int, err error) {
	b, err := os.ReadFile("/proc/loadavg") // "0.1 0.2 0.3 2/3877 12345"
	if err != nil {
		return 0, 0, err
	}
	f := strings.Fields(string(b))
	if len(f) < 4 {
		return 0, 0, fmt.Errorf("loadavg: %q", b)
	}
	_, total, ok := strings.Cut(f[3], "/")
	if !ok {
		return 0, 0, fmt.Errorf("loadavg: %q", b)
	}
	if used, err = strconv.Atoi(total); err != nil {
		return 0, 0, err
	}
	limit = 1 << 30
	for _, p := range []string{"/proc/sys/kernel/pid_max", "/proc/sys/kernel/threads-max"} {
		b, err := os.ReadFile(p)
		if err != nil {
			return 0, 0, err
		}
		n, err := strconv.Atoi(strings.TrimSpace(string(b)))
		if err != nil {
			return 0, 0, err
		}
		limit = min(limit, n)
	}
	return used, limit, nil
}

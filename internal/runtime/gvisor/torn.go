package gvisor

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"
)

// A process killed while runsc writes an instance's state file (a SIGKILL
// of the engine during a start, restore or delete) can leave that file
// empty or cut short. runsc then cannot load the instance: `runsc list`
// leaves it out and every `runsc delete` fails ("FetchSpec failed ...
// unexpected end of JSON input"), so without help the instance could never
// be removed. Kill therefore treats an instance whose state file does not
// parse as one runsc no longer holds: it kills what the instance's cgroups
// and runsc processes still hold and removes the state itself.

// stateFiles returns the instance's runsc state file and its lock file.
func (d *Driver) stateFiles(id string) (state string, lock string) {
	m, _ := filepath.Glob(filepath.Join(d.cfg.StateDir, "root", globEscape(id)+"_sandbox:*.state"))
	if len(m) != 1 {
		return "", ""
	}
	return m[0], strings.TrimSuffix(m[0], ".state") + ".lock"
}

// torn reports whether the instance's runsc state file exists but does not
// parse (read twice, a moment apart, so that a write in progress by a live
// runsc is not mistaken for a torn one).
func (d *Driver) torn(id string) bool {
	for i := 0; i < 2; i++ {
		state, _ := d.stateFiles(id)
		if state == "" {
			return false
		}
		b, err := readBounded(state, 4<<20)
		if err != nil {
			return false
		}
		var v map[string]any
		if json.Unmarshal(b, &v) == nil {
			return false
		}
		if i == 0 {
			time.Sleep(200 * time.Millisecond)
		}
	}
	return true
}

// reapTorn removes an instance whose runsc state is torn: it kills every
// process in the instance's cgroups (in every hierarchy) and every runsc
// process working on its bundle, then removes runsc's state and lock files
// and the instance's directory and cgroups.
func (d *Driver) reapTorn(ctx context.Context, id string) error {
	d.log.Warn("instance's runsc state file is torn: removing the instance without runsc", "instance", id)
	var pids []int
	for _, dir := range d.instanceCgroups(id) {
		b, _ := os.ReadFile(filepath.Join(dir, "cgroup.procs"))
		for _, f := range strings.Fields(string(b)) {
			if pid, err := strconv.Atoi(f); err == nil && pid != os.Getpid() {
				pids = append(pids, pid)
			}
		}
	}
	pids = append(pids, d.runscProcessesOf(id)...)
	for _, pid := range pids {
		_ = syscall.Kill(pid, syscall.SIGKILL)
	}
	deadline := time.Now().Add(5 * time.Second)
	for _, pid := range pids {
		for running(pid) && time.Now().Before(deadline) && ctx.Err() == nil {
			time.Sleep(10 * time.Millisecond)
		}
		if running(pid) {
			return fmt.Errorf("kill instance %s: process %d of a torn instance survived SIGKILL", id, pid)
		}
	}
	state, lock := d.stateFiles(id)
	for _, f := range []string{state, lock} {
		if f == "" {
			continue
		}
		if err := os.Remove(f); err != nil && !errors.Is(err, os.ErrNotExist) {
			return fmt.Errorf("kill instance %s: remove torn state: %w", id, err)
		}
	}
	d.cleanup(id)
	// The runsc-made cgroups. A task that exited a moment ago, or one the
	// sandbox started after cgroup.procs was read, keeps a cgroup busy:
	// kill what is listed again and retry (EBUSY) for a while, as
	// removeCgroups does. (Seen once in CI: one cgroup per hierarchy left
	// after a recover of a torn instance, on a loaded machine.)
	deadline = time.Now().Add(2 * time.Second)
	for _, dir := range d.instanceCgroups(id) {
		for {
			err := syscall.Rmdir(dir)
			if err == nil || errors.Is(err, syscall.ENOENT) || !errors.Is(err, syscall.EBUSY) || time.Now().After(deadline) {
				break
			}
			b, _ := os.ReadFile(filepath.Join(dir, "cgroup.procs"))
			for _, f := range strings.Fields(string(b)) {
				if pid, err := strconv.Atoi(f); err == nil && pid != os.Getpid() {
					_ = syscall.Kill(pid, syscall.SIGKILL)
				}
			}
			time.Sleep(5 * time.Millisecond)
		}
	}
	return nil
}

// reapTornStates removes every instance whose runsc state file is torn
// (Sweep: no call of the driver is in flight, so no runsc is writing one).
func (d *Driver) reapTornStates(ctx context.Context) {
	m, _ := filepath.Glob(filepath.Join(d.cfg.StateDir, "root", "*_sandbox:*.state"))
	for _, f := range m {
		id, _, ok := strings.Cut(filepath.Base(f), "_sandbox:")
		if !ok || d.checkID(id) != nil || !d.torn(id) {
			continue
		}
		if err := d.reapTorn(ctx, id); err != nil {
			d.log.Warn("sweep: torn instance", "instance", id, "err", err)
		}
	}
}

// instanceCgroups returns the instance's cgroup directory in every mounted
// hierarchy (whether runsc or the driver made it).
func (d *Driver) instanceCgroups(id string) []string {
	var out []string
	for _, parent := range d.cgroupDirs() {
		p := filepath.Join(parent, id)
		if st, err := os.Stat(p); err == nil && st.IsDir() {
			out = append(out, p)
		}
	}
	return out
}

// runscProcessesOf lists runsc processes of this driver (their command line
// names its --root) whose bundle is the instance's.
func (d *Driver) runscProcessesOf(id string) []int {
	rootFlag := []byte("--root=" + filepath.Join(d.cfg.StateDir, "root"))
	instPrefix := filepath.Join(d.cfg.StateDir, "inst") + "/"
	var out []int
	for _, p := range runscProcesses(rootFlag) {
		if instanceOfArgs(p.args, instPrefix) == id {
			out = append(out, p.pid)
		}
	}
	return out
}

// running reports whether pid is a process that has not exited: one
// look at its state, so that a process reaped between two looks is not
// taken for a live one. (Asking "alive?" with kill(pid, 0) and then
// "a zombie?" from its stat read two moments: a zombie reaped in between
// answered alive, then not a zombie, and a kill that had worked failed
// with "survived SIGKILL", once in CI.) Gone, a zombie (Z) or dead (X):
// not running.
func running(pid int) bool {
	switch procState(pid) {
	case 0, 'Z', 'X', 'x':
		return false
	}
	return true
}

// procState is the state letter of /proc/<pid>/stat (0: no such process,
// or unreadable).
func procState(pid int) byte {
	if pid <= 0 {
		return 0
	}
	b, err := os.ReadFile(filepath.Join("/proc", strconv.Itoa(pid), "stat"))
	if err != nil {
		return 0
	}
	s := string(b)
	if i := strings.LastIndexByte(s, ')'); i >= 0 && i+2 < len(s) {
		return s[i+2]
	}
	return 0
}

package gvisor

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/spore-run/spore/internal/runtime"
)

// On a cgroup v1 host runsc cannot clone the sandbox straight into its
// cgroup (CLONE_INTO_CGROUP is v2 only): it moves itself into the
// instance's cgroup in every mounted hierarchy, starts the gofer and the
// sandbox, and moves itself back: ~28 moves, of which one or two wait for
// an RCU grace period (2-17 ms each, in runsc's debug log). Median of 12
// alternated restores: 178 ms with runsc's cgroups, 158 ms with
// --ignore-cgroups, 162 ms with this file's 3 moves.
//
// So on v1 the driver can manage the instance's cgroups itself (opt-in,
// Config.Cgroups "driver"): it creates them only in the hierarchies limits
// need (memory, cpu, pids), writes the limits, and starts runsc from a
// shell that has already moved itself into them, with --ignore-cgroups. runsc, the gofer and the sandbox
// inherit the cgroups; a delete leaves them empty and the driver removes
// them. On v2 runsc's own handling is already one clone and is kept.
//
// The price: runsc derives the guest's total memory and CPU count from the
// cgroup it manages, so with --ignore-cgroups the guest's /proc/meminfo
// and nproc show the host's, while the limits still hold. Programs that
// size themselves from /proc/meminfo then overshoot into the host's OOM
// killer, which is why it is not the default.

// managedControllers are the v1 hierarchies an instance gets a cgroup in
// (cpuacct only for Stats: its CPU time).
var managedControllers = []string{"memory", "cpu", "cpuacct", "pids"}

const cgroupRoot = "/sys/fs/cgroup"

// cgroupV1 reports whether the host mounts the v1 hierarchies the driver
// needs.
func cgroupV1() bool {
	for _, c := range managedControllers {
		if _, err := os.Stat(filepath.Join(cgroupRoot, c, "cgroup.procs")); err != nil {
			return false
		}
	}
	return true
}

// cgroupPaths are the instance's cgroup directories, one per controller.
func (d *Driver) cgroupPaths(id string) []string {
	out := make([]string, 0, len(managedControllers))
	for _, c := range managedControllers {
		out = append(out, filepath.Join(cgroupRoot, c, d.cfg.CgroupParent, id))
	}
	return out
}

// makeCgroups creates the instance's cgroups and writes its limits. On
// failure nothing is left.
func (d *Driver) makeCgroups(id string, l runtime.Limits) (err error) {
	defer func() {
		if err != nil {
			d.removeCgroups(id)
		}
	}()
	for _, p := range d.cgroupPaths(id) {
		if err := os.MkdirAll(p, 0o755); err != nil {
			return fmt.Errorf("instance %s: cgroup: %w", id, err)
		}
	}
	dir := func(c string) string { return filepath.Join(cgroupRoot, c, d.cfg.CgroupParent, id) }
	var writes [][2]string
	if l.MemoryMB > 0 {
		writes = append(writes, [2]string{filepath.Join(dir("memory"), "memory.limit_in_bytes"), strconv.FormatInt(l.MemoryMB<<20, 10)})
	}
	if l.VCPUs > 0 {
		writes = append(writes,
			[2]string{filepath.Join(dir("cpu"), "cpu.cfs_period_us"), strconv.Itoa(cpuPeriod)},
			[2]string{filepath.Join(dir("cpu"), "cpu.cfs_quota_us"), strconv.FormatInt(int64(l.VCPUs*cpuPeriod), 10)})
	}
	if l.MaxProcs > 0 {
		writes = append(writes, [2]string{filepath.Join(dir("pids"), "pids.max"), strconv.FormatInt(pidsMax(l), 10)})
	}
	for _, w := range writes {
		if err := os.WriteFile(w[0], []byte(w[1]), 0o644); err != nil {
			return fmt.Errorf("instance %s: cgroup limit %s: %w", id, filepath.Base(w[0]), err)
		}
	}
	return nil
}

// removeCgroups removes the instance's cgroups, waiting briefly for the
// last tasks of a deleted sandbox to be reaped (rmdir fails with EBUSY
// until then).
func (d *Driver) removeCgroups(id string) {
	deadline := time.Now().Add(2 * time.Second)
	for _, p := range d.cgroupPaths(id) {
		for {
			err := syscall.Rmdir(p)
			if err == nil || errors.Is(err, syscall.ENOENT) {
				break
			}
			if !errors.Is(err, syscall.EBUSY) || time.Now().After(deadline) {
				d.log.Warn("remove cgroup", "instance", id, "cgroup", p, "err", err)
				break
			}
			time.Sleep(5 * time.Millisecond)
		}
	}
}

// joinScript is the shell prologue that moves itself into the instance's
// cgroups and then becomes runsc ("$0" "$@").
func (d *Driver) joinScript(id string) string {
	var b strings.Builder
	for _, p := range d.cgroupPaths(id) {
		fmt.Fprintf(&b, "echo $$ > '%s/cgroup.procs' && ", p)
	}
	b.WriteString(`exec "$0" "$@"`)
	return b.String()
}

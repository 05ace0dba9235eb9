package gvisor

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/spore-run/spore/internal/errdefs"
	"github.com/spore-run/spore/internal/runtime"
)

var _ runtime.StatsReader = (*Driver)(nil)

// maxFDs bounds how many of the sandbox process's descriptors Stats looks
// at to find the overlay's backing file (a sandbox holds a few dozen).
const maxFDs = 4096

// Stats implements runtime.StatsReader from the host side only: the
// instance's memory and cpuacct cgroups and the size on disk of the file
// backing its writable overlay. Nothing runs inside the sandbox, so a
// guest cannot slow or flood the call; every read is of a kernel file and
// bounded in size.
func (d *Driver) Stats(ctx context.Context, id string) (runtime.Stats, error) {
	if err := d.mustExist(id); err != nil {
		return runtime.Stats{}, err
	}
	pid := d.sandboxPID(id)
	if pid <= 0 || !pidAlive(pid) {
		return runtime.Stats{}, fmt.Errorf("stats of instance %s: its sandbox process is gone: %w", id, errdefs.ErrNotFound)
	}
	st := runtime.Stats{At: time.Now()}
	if memcg := cgroupDirOf(pid, "memory"); memcg != "" && !isRootCgroup(memcg, "memory") {
		usage := readInt(filepath.Join(memcg, "memory.usage_in_bytes"))
		// Like `docker stats`: page cache the kernel can drop at once is
		// not use.
		if inactive := statField(filepath.Join(memcg, "memory.stat"), "total_inactive_file"); inactive > 0 && inactive < usage {
			usage -= inactive
		}
		st.MemoryBytes = max(usage, 0)
		if l := readInt(filepath.Join(memcg, "memory.limit_in_bytes")); l > 0 && l < 1<<60 {
			st.MemoryLimit = l
		}
	}
	if err := ctx.Err(); err != nil {
		return runtime.Stats{}, fmt.Errorf("stats of instance %s: %w", id, err)
	}
	if cg := cgroupDirOf(pid, "cpuacct"); cg != "" && !isRootCgroup(cg, "cpuacct") {
		if ns := readInt(filepath.Join(cg, "cpuacct.usage")); ns > 0 {
			st.CPUUsage = time.Duration(ns)
		}
	}
	st.DiskBytes = d.overlayBytes(id, pid)
	return st, nil
}

// isRootCgroup reports whether dir is a hierarchy's root: there the
// figures are the whole host's (an instance whose driver did not put it
// in a cgroup of that controller).
func isRootCgroup(dir, controller string) bool {
	rel, err := filepath.Rel(cgroupRoot, dir)
	return err != nil || !strings.Contains(rel, "/")
}

// statField reads one "name value" line of a cgroup stat file.
func statField(path, name string) int64 {
	b, err := readBounded(path, 64<<10)
	if err != nil {
		return -1
	}
	for _, line := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(line, name+" "); ok {
			n, err := strconv.ParseInt(strings.TrimSpace(v), 10, 64)
			if err == nil {
				return n
			}
		}
	}
	return -1
}

// overlayBytes is the space allocated to the file backing the instance's
// writable overlay. runsc unlinks that file right after creating it, so it
// is found among the sandbox process's descriptors.
func (d *Driver) overlayBytes(id string, pid int) int64 {
	dir := d.overlayDir(id) + "/"
	fdDir := filepath.Join("/proc", strconv.Itoa(pid), "fd")
	f, err := os.Open(fdDir)
	if err != nil {
		return 0
	}
	defer f.Close()
	names, _ := f.Readdirnames(maxFDs)
	for _, n := range names {
		target, err := os.Readlink(filepath.Join(fdDir, n))
		if err != nil || !strings.HasPrefix(target, dir) {
			continue
		}
		var st syscall.Stat_t
		if syscall.Stat(filepath.Join(fdDir, n), &st) == nil && st.Mode&syscall.S_IFMT == syscall.S_IFREG {
			return st.Blocks * 512
		}
	}
	return 0
}

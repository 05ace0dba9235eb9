package fleet

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/spore-run/spore/internal/errdefs"
	"github.com/spore-run/spore/internal/node"
)

// PurgeNode removes everything a stopped node agent left on the host: its
// sandboxes (a node agent leaves them running when it stops, to re-attach
// on restart), their networks, mounts and cgroups, and the node's firewall
// table. It opens the node's data directory the way the agent did and
// uses the node's own cleanup. Run it inside the node's network namespace
// (`spore fleet purge-node`, which down starts there): the node's
// "host side" is that namespace.
func PurgeNode(ctx context.Context, cfg node.Config) error {
	n, err := node.Open(ctx, cfg)
	if err != nil {
		return fmt.Errorf("open the node in %s: %w", cfg.DataDir, err)
	}
	var errs []error
	for _, sb := range n.Engine.List(ctx) {
		if err := n.Engine.Kill(ctx, sb.ID); err != nil && !errdefs.IsNotFound(err) {
			errs = append(errs, err)
		}
	}
	n.Close()
	errs = append(errs, n.Runtime.Purge(ctx), n.Net.Sweep(ctx, nil), n.Net.RemoveHostRules())
	return errors.Join(errs...)
}

// purgeNode runs `spore fleet purge-node` for node n inside its namespace
// and waits for it.
func purgeNode(ctx context.Context, st *State, n Node, log *slog.Logger) error {
	if _, err := os.Stat(filepath.Join(netnsRunDir, n.Netns)); err != nil {
		return nil // never made (a failed up): nothing ran there
	}
	if _, err := os.Stat(n.DataDir); err != nil {
		return nil // the node never started
	}
	ctx, cancel := context.WithTimeout(ctx, 5*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, st.Executable, append([]string{"fleet", "purge-node"}, n.PurgeArgs...)...)
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	if err := startInNetns(cmd, n.Netns); err != nil {
		return err
	}
	if err := cmd.Wait(); err != nil {
		return fmt.Errorf("purge-node: %v: %s", err, out.Bytes())
	}
	log.Info("node purged", "node", n.Index, "node_id", n.ID)
	return nil
}

// sweepLeftovers is the backstop after the nodes' own cleanup: processes
// whose command line names the fleet directory (runsc's sandboxes and
// gofers name their node's state directory), namespaces named with a
// node's prefix, mounts under the directory, and the nodes' cgroups.
func sweepLeftovers(ctx context.Context, st *State, log *slog.Logger) []error {
	var errs []error
	var killed []Proc
	for _, p := range procsMentioning(st.Dir) {
		log.Warn("killing a leftover process", "pid", p.PID, "cmd", p.Name)
		syscall.Kill(p.PID, syscall.SIGKILL)
		killed = append(killed, p)
	}
	for _, p := range killed {
		if !waitGone(ctx, p, 30*time.Second) {
			errs = append(errs, fmt.Errorf("leftover process %d (%s) survives SIGKILL", p.PID, p.Name))
		}
	}
	ents, _ := os.ReadDir(netnsRunDir)
	for _, e := range ents {
		for _, n := range st.Nodes {
			if strings.HasPrefix(e.Name(), n.NetPrefix+"-") {
				log.Warn("removing a leftover namespace", "netns", e.Name())
				if err := deleteNetns(e.Name()); err != nil {
					errs = append(errs, err)
				}
			}
		}
	}
	m := mountsUnder(st.Dir)
	sort.Sort(sort.Reverse(sort.StringSlice(m))) // deepest first
	for _, p := range m {
		log.Warn("unmounting a leftover mount", "path", p)
		if err := unix.Unmount(p, unix.MNT_DETACH); err != nil && !errors.Is(err, unix.EINVAL) && !errors.Is(err, unix.ENOENT) {
			errs = append(errs, fmt.Errorf("unmount %s: %w", p, err))
		}
	}
	for _, n := range st.Nodes {
		for _, dir := range CgroupDirs(n) {
			if err := removeCgroupTree(dir); err != nil {
				errs = append(errs, err)
			}
		}
	}
	return errs
}

// CgroupDirs are node n's cgroup parent in every mounted hierarchy that
// has it.
func CgroupDirs(n Node) []string {
	parent := ""
	for i, a := range n.PurgeArgs {
		if a == "--cgroup-parent" && i+1 < len(n.PurgeArgs) {
			parent = n.PurgeArgs[i+1]
		}
	}
	if parent == "" {
		return nil
	}
	roots, _ := filepath.Glob("/sys/fs/cgroup/*")
	roots = append(roots, "/sys/fs/cgroup")
	var out []string
	for _, r := range roots {
		p := filepath.Join(r, parent)
		if st, err := os.Stat(p); err == nil && st.IsDir() {
			out = append(out, p)
		}
	}
	return out
}

// removeCgroupTree removes a cgroup and its children, deepest first
// (cgroup directories go with rmdir, which fails while tasks remain).
func removeCgroupTree(dir string) error {
	ents, err := os.ReadDir(dir)
	if err != nil {
		if errors.Is(err, os.ErrNotExist) {
			return nil
		}
		return err
	}
	for _, e := range ents {
		if e.IsDir() {
			if err := removeCgroupTree(filepath.Join(dir, e.Name())); err != nil {
				return err
			}
		}
	}
	if err := syscall.Rmdir(dir); err != nil && !errors.Is(err, syscall.ENOENT) {
		return fmt.Errorf("remove cgroup %s: %w", dir, err)
	}
	return nil
}

// procsMentioning lists the processes (not this one) whose command line
// contains dir.
func procsMentioning(dir string) []Proc {
	needle := []byte(filepath.Clean(dir) + "/")
	procs, _ := os.ReadDir("/proc")
	var out []Proc
	for _, e := range procs {
		pid, err := strconv.Atoi(e.Name())
		if err != nil || pid == os.Getpid() {
			continue
		}
		cmdline, err := os.ReadFile(filepath.Join("/proc", e.Name(), "cmdline"))
		if err != nil || !bytes.Contains(cmdline, needle) {
			continue
		}
		stt, err := startTime(pid)
		if err != nil {
			continue
		}
		args := strings.Split(strings.TrimRight(string(cmdline), "\x00"), "\x00")
		out = append(out, Proc{PID: pid, StartTime: stt, Name: filepath.Base(args[0]), Args: args})
	}
	return out
}

// mountsUnder lists the mount points at or below dir.
func mountsUnder(dir string) []string {
	b, err := os.ReadFile("/proc/self/mountinfo")
	if err != nil {
		return nil
	}
	dir = filepath.Clean(dir)
	var out []string
	for _, line := range strings.Split(string(b), "\n") {
		f := strings.Fields(line)
		if len(f) < 5 {
			continue
		}
		mp := unescapeMount(f[4])
		if mp == dir || strings.HasPrefix(mp, dir+"/") {
			out = append(out, mp)
		}
	}
	return out
}

// unescapeMount undoes mountinfo's octal escapes (\040 for a space...).
func unescapeMount(s string) string {
	if !strings.Contains(s, `\`) {
		return s
	}
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		if s[i] == '\\' && i+3 < len(s) {
			if n, err := strconv.ParseUint(s[i+1:i+4], 8, 8); err == nil {
				b.WriteByte(byte(n))
				i += 3
				continue
			}
		}
		b.WriteByte(s[i])
	}
	return b.String()
}

// Leftovers lists what of the fleet st describes is still on the host:
// its processes (by PID and start time) and any process naming its
// directory, namespaces (recorded, and any named with a node's prefix),
// links, firewall tables, mounts under its directory, the nodes' cgroups,
// and the directory. Empty after a successful Down.
func Leftovers(st *State) []string {
	var out []string
	for _, p := range st.Processes {
		if p.alive() {
			out = append(out, fmt.Sprintf("process %s (pid %d)", p.Name, p.PID))
		}
	}
	for _, p := range procsMentioning(st.Dir) {
		out = append(out, fmt.Sprintf("process %d naming the fleet directory: %s", p.PID, strings.Join(p.Args, " ")))
	}
	ents, _ := os.ReadDir(netnsRunDir)
	for _, e := range ents {
		for _, n := range st.Nodes {
			if e.Name() == n.Netns || strings.HasPrefix(e.Name(), n.NetPrefix+"-") {
				out = append(out, "network namespace "+e.Name())
			}
		}
	}
	for _, v := range st.Veths {
		if _, err := netlinkLinkByName(v); err == nil {
			out = append(out, "interface "+v)
		}
	}
	for _, t := range st.NftTables {
		if ok, err := tableExists(t.Name); err != nil || ok {
			out = append(out, fmt.Sprintf("nftables table %s %s (%v)", t.Family, t.Name, err))
		}
	}
	for _, m := range mountsUnder(st.Dir) {
		out = append(out, "mount "+m)
	}
	for _, n := range st.Nodes {
		for _, d := range CgroupDirs(n) {
			out = append(out, "cgroup "+d)
		}
	}
	if _, err := os.Stat(st.Dir); err == nil {
		out = append(out, "directory "+st.Dir)
	}
	return out
}

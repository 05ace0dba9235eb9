package gvisor

import (
	"bytes"
	"context"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"
)

// killStrays kills runsc processes of this driver (their command line names
// its --root) that belong to no instance runsc knows: what a start or
// restore leaves when the calling process dies half-way. Only processes
// whose command line names this driver's own state directory are touched.
func (d *Driver) killStrays(ctx context.Context) {
	rootFlag := []byte("--root=" + filepath.Join(d.cfg.StateDir, "root"))
	instPrefix := filepath.Join(d.cfg.StateDir, "inst") + "/"
	procs, _ := os.ReadDir("/proc")
	var killed []int
	for _, p := range procs {
		pid, err := strconv.Atoi(p.Name())
		if err != nil || pid == os.Getpid() {
			continue
		}
		cmdline, err := os.ReadFile(filepath.Join("/proc", p.Name(), "cmdline"))
		if err != nil || !bytes.Contains(cmdline, rootFlag) {
			continue
		}
		args := strings.Split(strings.TrimRight(string(cmdline), "\x00"), "\x00")
		if !strings.HasPrefix(filepath.Base(args[0]), "runsc") {
			continue
		}
		id := instanceOfArgs(args, instPrefix)
		if id == "" || d.exists(id) {
			continue
		}
		d.log.Warn("killing stray runsc process", "pid", pid, "instance", id, "cmd", args[0])
		if syscall.Kill(pid, syscall.SIGKILL) == nil {
			killed = append(killed, pid)
		}
	}
	// Wait for them to go, so their cgroups can be removed.
	deadline := time.Now().Add(5 * time.Second)
	for _, pid := range killed {
		for pidAlive(pid) && time.Now().Before(deadline) && ctx.Err() == nil {
			time.Sleep(10 * time.Millisecond)
		}
	}
}

// instanceOfArgs finds the instance a runsc command line works on from its
// bundle path (<state>/inst/<id>/bundle).
func instanceOfArgs(args []string, instPrefix string) string {
	for i, a := range args {
		var bundle string
		switch {
		case strings.HasPrefix(a, "--bundle="):
			bundle = strings.TrimPrefix(a, "--bundle=")
		case (a == "--bundle" || a == "-bundle") && i+1 < len(args):
			bundle = args[i+1]
		default:
			continue
		}
		if rest, ok := strings.CutPrefix(bundle, instPrefix); ok {
			return strings.Split(rest, "/")[0]
		}
	}
	return ""
}

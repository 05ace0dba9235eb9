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
	var killed []int
	for _, p := range runscProcesses(rootFlag) {
		id := instanceOfArgs(p.args, instPrefix)
		if id == "" || d.exists(id) {
			continue
		}
		d.log.Warn("killing stray runsc process", "pid", p.pid, "instance", id, "cmd", p.args[0])
		if syscall.Kill(p.pid, syscall.SIGKILL) == nil {
			killed = append(killed, p.pid)
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

type runscProcess struct {
	pid  int
	args []string
}

// runscProcesses lists the runsc processes whose command line contains
// rootFlag (this driver's --root).
func runscProcesses(rootFlag []byte) []runscProcess {
	var out []runscProcess
	for _, p := range processesNaming(rootFlag) {
		if strings.HasPrefix(filepath.Base(p.args[0]), "runsc") {
			out = append(out, p)
		}
	}
	return out
}

// processesNaming lists the processes (but this one) whose command line
// contains flag: runsc's own, and a shell that runs it.
func processesNaming(flag []byte) []runscProcess {
	procs, _ := os.ReadDir("/proc")
	var out []runscProcess
	for _, p := range procs {
		pid, err := strconv.Atoi(p.Name())
		if err != nil || pid == os.Getpid() {
			continue
		}
		cmdline, err := os.ReadFile(filepath.Join("/proc", p.Name(), "cmdline"))
		if err != nil || !bytes.Contains(cmdline, flag) {
			continue
		}
		out = append(out, runscProcess{pid: pid, args: strings.Split(strings.TrimRight(string(cmdline), "\x00"), "\x00")})
	}
	return out
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

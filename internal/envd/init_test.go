package envd_test

import (
	"context"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"connectrpc.com/connect"

	"github.com/spore-run/spore/internal/testenv"
	processpb "github.com/spore-run/spore/proto/gen/process"
	"github.com/spore-run/spore/proto/gen/process/processpbconnect"
)

// The daemon as a process, doing init's duties: orphans are reaped, and a
// SIGTERM it receives is forwarded to the processes it started.
func TestInitDuties(t *testing.T) {
	bin := testenv.EnvdBinary(t)
	ln, _ := net.Listen("tcp", "127.0.0.1:0")
	addr := ln.Addr().String()
	ln.Close()
	cmd := exec.Command(bin, "-addr", addr, "-code-addr", "", "-user", "root")
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	defer cmd.Process.Kill()
	for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(50 * time.Millisecond) { // a loaded host starts it slowly
		if resp, err := http.Get("http://" + addr + "/health"); err == nil {
			resp.Body.Close()
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("envd did not start within 30 s")
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	proc := processpbconnect.NewProcessClient(http.DefaultClient, "http://"+addr)
	run := func(script string) {
		st, err := proc.Start(ctx, connect.NewRequest(&processpb.StartRequest{Process: &processpb.ProcessConfig{Cmd: "/bin/sh", Args: []string{"-c", script}}}))
		if err != nil {
			t.Fatal(err)
		}
		for st.Receive() {
		}
	}
	// An orphan (its parent exits at once) is reparented to envd and
	// reaped when it ends: no zombie children remain. Its end is waited
	// for, not a fixed second (a loaded host may not have ended it by
	// then, or not yet let envd reap it): reaped, its /proc entry goes
	// (a zombie keeps one); for up to 30 s.
	orphan := filepath.Join(t.TempDir(), "orphan")
	run(fmt.Sprintf("(sleep 0.3 & echo $! > %s) ; exit 0", orphan))
	b, err := os.ReadFile(orphan)
	if err != nil {
		t.Fatal(err)
	}
	pid := strings.TrimSpace(string(b))
	for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(50 * time.Millisecond) {
		if st, err := os.ReadFile("/proc/" + pid + "/stat"); err != nil || !strings.Contains(string(st), "(sleep)") {
			break // reaped (or its PID already another process's)
		}
		if time.Now().After(deadline) {
			t.Fatalf("the orphan %s not reaped 30 s after its start; zombie children of envd: %v", pid, zombiesOf(cmd.Process.Pid))
		}
	}
	if z := zombiesOf(cmd.Process.Pid); len(z) > 0 {
		t.Fatalf("zombie children of envd: %v", z)
	}
	// SIGTERM to envd reaches the processes it started. It is sent once
	// the child's trap is set (waited for, up to 30 s, not a fixed 200 ms:
	// on a loaded host bash may not have set it by then, and the signal
	// would end the child before its trap could say so).
	mark := filepath.Join(t.TempDir(), "got")
	st, err := proc.Start(ctx, connect.NewRequest(&processpb.StartRequest{Process: &processpb.ProcessConfig{
		Cmd: "/bin/bash", Args: []string{"-c", fmt.Sprintf(`trap 'echo got-term > %[1]s; exit 0' TERM; echo > %[1]s.trap; while :; do sleep 0.05; done`, mark)}}}))
	if err != nil {
		t.Fatal(err)
	}
	st.Receive()
	for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(10 * time.Millisecond) {
		if _, err := os.Stat(mark + ".trap"); err == nil {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the child did not set its trap within 30 s")
		}
	}
	cmd.Process.Signal(syscall.SIGTERM)
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	select {
	case <-done:
	case <-time.After(10 * time.Second):
		t.Fatal("envd did not stop on SIGTERM")
	}
	// The trap runs once the child's sleep ends: up to 30 s on a loaded
	// host.
	for deadline := time.Now().Add(30 * time.Second); time.Now().Before(deadline); time.Sleep(50 * time.Millisecond) {
		if b, _ := os.ReadFile(mark); strings.TrimSpace(string(b)) == "got-term" {
			return
		}
	}
	t.Fatal("the child did not get the forwarded SIGTERM")
}

func zombiesOf(pid int) []string {
	var out []string
	ents, _ := os.ReadDir("/proc")
	for _, e := range ents {
		b, err := os.ReadFile("/proc/" + e.Name() + "/stat")
		if err != nil {
			continue
		}
		s := string(b)
		i := strings.LastIndexByte(s, ')')
		if i < 0 {
			continue
		}
		f := strings.Fields(s[i+1:])
		if len(f) > 2 && f[0] == "Z" && f[1] == fmt.Sprint(pid) {
			out = append(out, e.Name())
		}
	}
	return out
}

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
	for i := 0; ; i++ {
		if resp, err := http.Get("http://" + addr + "/health"); err == nil {
			resp.Body.Close()
			break
		}
		if i > 100 {
			t.Fatal("envd did not start")
		}
		time.Sleep(50 * time.Millisecond)
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
	// reaped when it ends: no zombie children remain.
	run("(sleep 0.3 &) ; exit 0")
	time.Sleep(time.Second)
	if z := zombiesOf(cmd.Process.Pid); len(z) > 0 {
		t.Fatalf("zombie children of envd: %v", z)
	}
	// SIGTERM to envd reaches the processes it started.
	mark := filepath.Join(t.TempDir(), "got")
	st, err := proc.Start(ctx, connect.NewRequest(&processpb.StartRequest{Process: &processpb.ProcessConfig{
		Cmd: "/bin/bash", Args: []string{"-c", fmt.Sprintf(`trap 'echo got-term > %s; exit 0' TERM; while :; do sleep 0.05; done`, mark)}}}))
	if err != nil {
		t.Fatal(err)
	}
	st.Receive()
	time.Sleep(200 * time.Millisecond)
	cmd.Process.Signal(syscall.SIGTERM)
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	select {
	case <-done:
	case <-time.After(10 * time.Second):
		t.Fatal("envd did not stop on SIGTERM")
	}
	for i := 0; i < 50; i++ {
		if b, _ := os.ReadFile(mark); strings.TrimSpace(string(b)) == "got-term" {
			return
		}
		time.Sleep(50 * time.Millisecond)
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

package reaper

import (
	"os"
	"syscall"
	"testing"
	"time"
)

func TestStartAndExit(t *testing.T) {
	r := New(false)
	pid, done, err := r.Start("/bin/sh", []string{"sh", "-c", "exit 3"}, &os.ProcAttr{Files: []*os.File{nil, nil, nil}})
	if err != nil || pid <= 0 {
		t.Fatal(pid, err)
	}
	select {
	case e := <-done:
		if !e.Status.Exited() || e.Status.ExitStatus() != 3 {
			t.Fatalf("exit %v", e.Status)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("no exit")
	}
	pid, done, err = r.Start("/bin/sleep", []string{"sleep", "60"}, &os.ProcAttr{Files: []*os.File{nil, nil, nil}})
	if err != nil {
		t.Fatal(err)
	}
	syscall.Kill(pid, syscall.SIGKILL)
	e := <-done
	if !e.Status.Signaled() || e.Status.Signal() != syscall.SIGKILL {
		t.Fatalf("exit %v", e.Status)
	}
	if _, _, err := r.Start("/no/such/binary", []string{"x"}, &os.ProcAttr{}); err == nil {
		t.Fatal("start of a missing binary succeeded")
	}
}

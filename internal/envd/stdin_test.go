package envd_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"syscall"
	"testing"
	"time"

	"connectrpc.com/connect"
	"golang.org/x/sys/unix"

	"github.com/spore-run/spore/internal/envd"
	processpb "github.com/spore-run/spore/proto/gen/process"
	"github.com/spore-run/spore/proto/gen/process/processpbconnect"
)

// pattern is n bytes of numbered 8-byte lines ("0000000\n", "0000001\n"...),
// so a lost, repeated or reordered chunk shows as a mismatch.
func pattern(n int) []byte {
	b := make([]byte, 0, n+8)
	for i := 0; len(b) < n; i++ {
		b = fmt.Appendf(b, "%07d\n", i)
	}
	return b[:n]
}

// stream is what one output stream delivered, read without t.Fatal so it
// can run in its own goroutine.
type stream struct {
	stdout []byte
	end    *processpb.ProcessEvent_EndEvent
	err    error
}

func drain(next func() bool, ev func() *processpb.ProcessEvent, errf func() error) stream {
	var s stream
	for next() {
		switch e := ev().GetEvent().(type) {
		case *processpb.ProcessEvent_Data:
			s.stdout = append(s.stdout, e.Data.GetStdout()...)
		case *processpb.ProcessEvent_End:
			s.end = e.End
		}
	}
	s.err = errf()
	return s
}

func startWithStdin(t *testing.T, ctx context.Context, d *daemon, cmd string, args ...string) (*connect.ServerStreamForClient[processpb.StartResponse], *processpb.ProcessSelector) {
	t.Helper()
	yes := true
	st, err := d.proc.Start(ctx, connect.NewRequest(&processpb.StartRequest{Process: &processpb.ProcessConfig{Cmd: cmd, Args: args}, Stdin: &yes}))
	if err != nil {
		t.Fatal(err)
	}
	if !st.Receive() {
		t.Fatalf("no start event: %v", st.Err())
	}
	pid := st.Msg().GetEvent().GetStart().GetPid()
	return st, &processpb.ProcessSelector{Selector: &processpb.ProcessSelector_Pid{Pid: pid}}
}

func stdinReq(sel *processpb.ProcessSelector, b []byte) *connect.Request[processpb.SendInputRequest] {
	return connect.NewRequest(&processpb.SendInputRequest{Process: sel, Input: &processpb.ProcessInput{Input: &processpb.ProcessInput_Stdin{Stdin: b}}})
}

func firstDiff(a, b []byte) int {
	for i := range min(len(a), len(b)) {
		if a[i] != b[i] {
			return i
		}
	}
	return min(len(a), len(b))
}

// 8 MiB through cat in 1 MiB SendInput calls comes back complete and in
// order. Each write blocks until cat has read it, and cat only reads once
// its output is taken: the output pump must publish while a write blocks
// (it used to wait for the lock the write held, and both hung).
func TestStdinEchoedThroughCat(t *testing.T) {
	for name, opts := range codecs() {
		t.Run(name, func(t *testing.T) {
			d := newDaemon(t, opts...)
			ctx := ctxFor(t)
			want := pattern(8 << 20)
			st, sel := startWithStdin(t, ctx, d, "/bin/cat")
			out := make(chan stream, 1)
			go func() {
				out <- drain(st.Receive, func() *processpb.ProcessEvent { return st.Msg().GetEvent() }, st.Err)
			}()
			for off := 0; off < len(want); off += 1 << 20 {
				if _, err := d.proc.SendInput(ctx, stdinReq(sel, want[off:off+1<<20])); err != nil {
					t.Fatalf("SendInput at %d MiB: %v", off>>20, err)
				}
			}
			if _, err := d.proc.CloseStdin(ctx, connect.NewRequest(&processpb.CloseStdinRequest{Process: sel})); err != nil {
				t.Fatal(err)
			}
			r := <-out
			if r.err != nil || r.end == nil || r.end.GetExitCode() != 0 {
				t.Fatalf("stream: err %v, end %+v", r.err, r.end)
			}
			if !bytes.Equal(r.stdout, want) {
				t.Fatalf("echoed %d bytes of %d, first difference at byte %d", len(r.stdout), len(want), firstDiff(r.stdout, want))
			}
		})
	}
}

// waitPipeFull waits until the pipe that is pid's stdin holds as much as it
// can: a write of more is then blocked.
func waitPipeFull(t *testing.T, pid uint32) {
	t.Helper()
	f, err := os.OpenFile("/proc/"+strconv.Itoa(int(pid))+"/fd/0", os.O_RDONLY|unix.O_NONBLOCK, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	size, err := unix.FcntlInt(f.Fd(), unix.F_GETPIPE_SZ, 0)
	if err != nil {
		t.Fatal(err)
	}
	for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(10 * time.Millisecond) {
		n, err := unix.IoctlGetInt(int(f.Fd()), unix.TIOCINQ)
		if err != nil {
			t.Fatal(err)
		}
		if n >= size {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("stdin pipe holds %d of %d bytes: the write never filled it", n, size)
		}
	}
}

// While a write to a process's stdin is blocked (the process never reads),
// signals and CloseStdin still answer, and the blocked write then fails.
func TestSignalDuringBlockedWrite(t *testing.T) {
	for _, how := range []string{"kill", "close-stdin"} {
		t.Run(how, func(t *testing.T) {
			d := newDaemon(t)
			ctx := ctxFor(t)
			st, sel := startWithStdin(t, ctx, d, "/bin/sleep", "1000")
			t.Cleanup(func() { // whatever happened, no sleeper is left behind
				unix.Kill(int(sel.GetPid()), unix.SIGKILL)
			})
			written := make(chan error, 1)
			go func() {
				_, err := d.proc.SendInput(ctx, stdinReq(sel, pattern(8<<20)))
				written <- err
			}()
			waitPipeFull(t, sel.GetPid())

			// Generous deadlines: these must answer at all, not fast.
			actx, cancel := context.WithTimeout(ctx, 10*time.Second)
			defer cancel()
			var err error
			if how == "kill" {
				_, err = d.proc.SendSignal(actx, connect.NewRequest(&processpb.SendSignalRequest{Process: sel, Signal: processpb.Signal_SIGNAL_SIGKILL}))
			} else {
				_, err = d.proc.CloseStdin(actx, connect.NewRequest(&processpb.CloseStdinRequest{Process: sel}))
			}
			if err != nil {
				t.Fatalf("%s during a blocked write: %v", how, err)
			}
			select {
			case err := <-written:
				if err == nil {
					t.Fatal("an 8 MiB write to a process that never read it succeeded")
				}
				t.Logf("blocked write ended with: %v", err)
			case <-actx.Done():
				t.Fatalf("the blocked write did not return after %s", how)
			}
			if how == "close-stdin" {
				unix.Kill(int(sel.GetPid()), unix.SIGKILL)
			}
			r := drain(st.Receive, func() *processpb.ProcessEvent { return st.Msg().GetEvent() }, st.Err)
			if r.err != nil || r.end.GetStatus() != "signal: killed" {
				t.Fatalf("end = %+v, %v", r.end, r.err)
			}
		})
	}
}

// A subscriber that stops reading slows the process down for a bounded
// time, then its stream ends with resource_exhausted: never a clean end
// that looks like complete output. The subscriber that keeps reading gets
// every byte and the end.
func TestSlowSubscriberGetsError(t *testing.T) {
	// No gzip: what a stalled connection holds is then what was sent.
	noGzip := connect.WithAcceptCompression("gzip", nil, nil)
	// The grace (the product's default is 10 s) must outlast the reading
	// subscriber's longest pause: with 1 s, its reader (this test, under
	// -race, holding ~120 MB of output) went a second without taking an
	// event in 4 of 6 runs on 2026-12-02, and it was the one cut off.
	d := newDaemonConfig(t, envd.Config{DefaultUser: "root", Keepalive: 200 * time.Millisecond, SlowSubscriber: 5 * time.Second}, noGzip)
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute) // -race on a busy host
	defer cancel()
	// 64 MiB of output: far more than the stalled client's connection holds
	// (its receive buffer is fixed at 64 KiB, the server's send buffer is at
	// most net.core.wmem_max, and the stream's queue 2 MiB), and more than
	// the 1024-event queue that used to drop a subscriber silently.
	want := make([]byte, 64<<20)
	rand.NewChaCha8([32]byte{'s', 'p', 'o', 'r', 'e'}).Read(want)
	file := filepath.Join(t.TempDir(), "out.bin")
	if err := os.WriteFile(file, want, 0o644); err != nil {
		t.Fatal(err)
	}
	st, sel := startWithStdin(t, ctx, d, "/bin/bash", "-c", "read go && exec cat "+file)
	small := &net.Dialer{Control: func(_, _ string, c syscall.RawConn) error {
		var err error
		c.Control(func(fd uintptr) { err = unix.SetsockoptInt(int(fd), unix.SOL_SOCKET, unix.SO_RCVBUF, 64<<10) })
		return err
	}}
	slowClient := processpbconnect.NewProcessClient(&http.Client{Transport: &http.Transport{DialContext: small.DialContext}}, d.srv.URL, noGzip)
	slow, err := slowClient.Connect(ctx, connect.NewRequest(&processpb.ConnectRequest{Process: sel}))
	if err != nil {
		t.Fatal(err)
	}
	if !slow.Receive() || slow.Msg().GetEvent().GetStart() == nil {
		t.Fatalf("connect: %v", slow.Err())
	}
	// Subscribed (the start event is sent after subscribing): let it run.
	if _, err := d.proc.SendInput(ctx, stdinReq(sel, []byte("go\n"))); err != nil {
		t.Fatal(err)
	}
	fast := drain(st.Receive, func() *processpb.ProcessEvent { return st.Msg().GetEvent() }, st.Err)
	if fast.err != nil || fast.end.GetExitCode() != 0 || !bytes.Equal(fast.stdout, want) {
		t.Fatalf("reading subscriber: %d of %d bytes (first difference at %d), end %+v, err %v",
			len(fast.stdout), len(want), firstDiff(fast.stdout, want), fast.end, fast.err)
	}
	r := drain(slow.Receive, func() *processpb.ProcessEvent { return slow.Msg().GetEvent() }, slow.Err)
	t.Logf("stalled subscriber got %d bytes, then: %v", len(r.stdout), r.err)
	if r.end != nil || len(r.stdout) >= len(want) {
		t.Fatalf("stalled subscriber got %d bytes and end %+v: it was expected to be cut off", len(r.stdout), r.end)
	}
	var cerr *connect.Error
	if !errors.As(r.err, &cerr) || cerr.Code() != connect.CodeResourceExhausted {
		t.Fatalf("stalled subscriber's stream ended with %v, want resource_exhausted", r.err)
	}
}

package envd_test

import (
	"context"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"connectrpc.com/connect"

	"github.com/spore-run/spore/internal/envd"
	processpb "github.com/spore-run/spore/proto/gen/process"
)

// warmPID waits for the daemon's warm shell and returns its PID.
func (d *daemon) warmPID() int {
	d.t.Helper()
	for deadline := time.Now().Add(20 * time.Second); time.Now().Before(deadline); time.Sleep(10 * time.Millisecond) {
		if pid, ok := d.envd.Processes().WarmShell(); ok {
			return pid
		}
	}
	d.t.Fatal("no warm shell was started")
	return 0
}

// TestWarmShellSameAsAFreshShell: commands the SDKs send (`bash -l -c
// CMD`) produce the same output, exit status and environment whether a
// warm shell runs them or a new process does, and the warm shell is the
// process the client sees (its PID, signals reach its group).
func TestWarmShellSameAsAFreshShell(t *testing.T) {
	warm := newDaemon(t)
	cold := newDaemonConfig(t, envd.Config{DefaultUser: "root", Keepalive: 200 * time.Millisecond, NoWarmShell: true})
	ctx := ctxFor(t)
	if r := warm.run(ctx, sh("true")); r.end.GetExitCode() != 0 { // starts the first warm shell
		t.Fatalf("first command: %+v", r)
	}
	scripts := []string{
		`echo out; echo err >&2; exit 3`,
		`false`,
		`shopt -q login_shell && echo login; echo "$0" "$HOME" "$USER" "$PWD"; umask`,
		`echo ( bad`,
		`cat; echo "stdin ended: $?"`,
		`read -r x; echo "read: $? [$x]"`,
		`(sleep 0.05; echo late) & echo early`,
		`ls /nonexistent-spore-dir`,
		`kill -TERM $$`,
		`printf 'a\0b' | od -c | head -1`,
		"echo 'two\nlines'",
		`echo "héllo wörld ✓ $((6*7))"`,
		"x='" + strings.Repeat("a", 100000) + "'; echo ${#x}", // read in chunks, not per byte
		"",
	}
	for _, script := range scripts {
		pid := warm.warmPID()
		w := warm.run(ctx, sh(script))
		c := cold.run(ctx, sh(script))
		if int(w.pid) != pid {
			t.Errorf("%q: ran in pid %d, not in the warm shell %d", script, w.pid, pid)
		}
		// A syntax error is reported by eval, not -c: the rest is the same.
		ws := strings.ReplaceAll(w.stderr, "bash: eval:", "bash: -c:")
		if w.stdout != c.stdout || ws != c.stderr || w.end.GetExitCode() != c.end.GetExitCode() || w.end.GetStatus() != c.end.GetStatus() {
			t.Errorf("%q:\nwarm: out %q err %q end %+v\ncold: out %q err %q end %+v", script, w.stdout, w.stderr, w.end, c.stdout, c.stderr, c.end)
		}
	}

	// Another shape (an env var) is not served by the warm shell of the
	// old one, which ends without running anything.
	old := warm.warmPID()
	req := sh(`echo "$GREETING"; echo $$`)
	req.Process.Envs = map[string]string{"GREETING": "hello"}
	r := warm.run(ctx, req)
	if r.stdout != "hello\n"+strconv.Itoa(int(r.pid))+"\n" || int(r.pid) == old {
		t.Fatalf("another shape: %+v (old warm shell %d)", r, old)
	}
	waitGone(t, old)
	// Its own warm shell serves the next one of the new shape.
	next := warm.warmPID()
	if r := warm.run(ctx, req); int(r.pid) != next || !strings.HasPrefix(r.stdout, "hello\n") {
		t.Fatalf("new shape, warm: %+v (warm shell %d)", r, next)
	}

	// A signal reaches what the warm shell runs.
	pid := warm.warmPID()
	long := sh(`sleep 30 & wait`)
	long.Process.Envs = req.Process.Envs
	st, err := warm.proc.Start(ctx, connect.NewRequest(long))
	if err != nil {
		t.Fatal(err)
	}
	st.Receive()
	if got := st.Msg().GetEvent().GetStart().GetPid(); int(got) != pid {
		t.Fatalf("started in %d, not in the warm shell %d", got, pid)
	}
	if _, err := warm.proc.SendSignal(ctx, connect.NewRequest(&processpb.SendSignalRequest{
		Process: &processpb.ProcessSelector{Selector: &processpb.ProcessSelector_Pid{Pid: uint32(pid)}}, Signal: processpb.Signal_SIGNAL_SIGKILL,
	})); err != nil {
		t.Fatal(err)
	}
	r = collect(t, st.Receive, func() *processpb.ProcessEvent { return st.Msg().GetEvent() }, st.Err)
	if r.end.GetStatus() != "signal: killed" {
		t.Fatalf("after SIGKILL: %+v", r.end)
	}

	// Close ends the warm shell.
	last := warm.warmPID()
	warm.envd.Processes().Close()
	waitGone(t, last)
}

// waitGone waits until process pid no longer exists.
func waitGone(t *testing.T, pid int) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	for syscall.Kill(pid, 0) == nil {
		if ctx.Err() != nil {
			t.Fatalf("process %d still runs", pid)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

package build

import (
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/spore-run/spore/internal/errdefs"
)

// waitForPort is the stock SDK's waitForPort(8000) (e2b@2.51.0).
const waitForPort = `[ -n "$(ss -Htuln sport = :8000)" ]`

// readyBuilder is a builder whose ready wait ends in 2 s, so a build that
// polls a hopeless ready command to its timeout (the old behaviour) ends
// too, and fails the assertions on what it did rather than hanging.
func readyBuilder() (*Builder, *snapPlatform) {
	b, p := newBuilder()
	b.ReadyTimeout = 2 * time.Second
	return b, p
}

func runsOf(p *snapPlatform, cmd string) int {
	p.mu.Lock()
	defer p.mu.Unlock()
	n := 0
	for _, c := range p.ran {
		if c == cmd {
			n++
		}
	}
	return n
}

// failedAtFinalize checks err is a failed finalize step of kind invalid
// argument whose message has each of want, and that the failed build made
// no template and left no sandbox.
func failedAtFinalize(t *testing.T, p *snapPlatform, err error, want ...string) {
	t.Helper()
	var se *StepError
	if !errors.As(err, &se) || se.Step != StepFinalize || !errdefs.IsInvalidArgument(err) {
		t.Fatalf("err = %v (%T), want an invalid-argument StepError at %s", err, err, StepFinalize)
	}
	for _, w := range want {
		if !strings.Contains(err.Error(), w) {
			t.Errorf("err = %q, want it to say %q", err, w)
		}
	}
	if _, ok := p.templates["t"]; ok {
		t.Error("a failed build made the template")
	}
	if p.live != 0 {
		t.Error("a failed build left its sandbox")
	}
}

// A ready command whose program the image lacks fails the build on its
// first run, naming the program, instead of being polled to the ready
// timeout (5 minutes by default: `fromTemplate('base')` with waitForPort
// did so when base had no `ss`).
func TestReadyCommandThatCannotRunFailsAtOnce(t *testing.T) {
	for name, c := range map[string]struct {
		cmd  string
		run  fakeRun
		want []string
	}{
		"waitForPort without ss": {waitForPort,
			fakeRun{[]string{"/bin/bash: line 1: ss: command not found"}, 1}, []string{"the ready command cannot run: ss: command not found", "install it in a run step"}},
		"a pipeline whose first program is missing": {`ss -tuln | grep :8000`,
			fakeRun{[]string{"/bin/bash: line 1: ss: command not found"}, 1}, []string{"ss: command not found"}},
		"waitForURL without curl": {`curl -s -o /dev/null -w "%{http_code}" http://localhost:3000/health | grep -q "200"`,
			fakeRun{[]string{"/bin/bash: line 1: curl: command not found"}, 1}, []string{"curl: command not found"}},
		"an image without bash (dash)": {`pgrep my-daemon > /dev/null`,
			fakeRun{[]string{"/bin/sh: 1: pgrep: not found"}, 127}, []string{"pgrep: not found"}},
		"a missing path": {`./healthcheck`,
			fakeRun{[]string{"/bin/bash: line 1: ./healthcheck: No such file or directory"}, 127}, []string{"./healthcheck: No such file or directory"}},
		"not executable": {`/app/check.sh`,
			fakeRun{[]string{"/bin/bash: line 1: /app/check.sh: Permission denied"}, 126}, []string{"/app/check.sh: Permission denied", "not an executable"}},
		"exit 127 from another program": {`timeout 5 nc -z localhost 8000`,
			fakeRun{[]string{"timeout: failed to run command 'nc': No such file or directory"}, 127}, []string{"exit 127", "'nc'"}},
	} {
		t.Run(name, func(t *testing.T) {
			b, p := readyBuilder()
			p.scripted[c.cmd] = []fakeRun{c.run} // the same on every run
			_, _, err := run(t, b, "t", Spec{FromTemplate: "base", StartCmd: "server", ReadyCmd: c.cmd})
			failedAtFinalize(t, p, err, c.want...)
			if n := runsOf(p, c.cmd); n != 1 {
				t.Errorf("the ready command ran %d times, want 1 (it can never pass)", n)
			}
		})
	}
}

// A ready command that fails for a while, the normal case while a server
// starts, is polled until it passes, whatever it prints: a file the start
// command has yet to write is missing, not a program.
func TestReadyCommandThatFailsForAWhileStillPasses(t *testing.T) {
	for name, c := range map[string]struct {
		cmd  string
		runs []fakeRun
	}{
		"waitForPort": {waitForPort, []fakeRun{{nil, 1}, {nil, 1}, {nil, 1}, {nil, 0}}},
		"a redirect from a file not yet written": {`grep -q up < /tmp/status`, []fakeRun{
			{[]string{"/bin/bash: line 1: /tmp/status: No such file or directory"}, 1}, {nil, 1}, {nil, 0}}},
		"a program's own missing file": {`cat /tmp/ready`, []fakeRun{
			{[]string{"cat: /tmp/ready: No such file or directory"}, 1}, {[]string{"ok"}, 0}}},
		"ss inside gVisor (no sock_diag: it reads /proc/net)": {waitForPort, []fakeRun{
			{[]string{"Cannot open netlink socket: Protocol not supported"}, 1}, {[]string{"Cannot open netlink socket: Protocol not supported"}, 0}}},
	} {
		t.Run(name, func(t *testing.T) {
			b, p := newBuilder()
			p.scripted[c.cmd] = c.runs
			if _, _, err := run(t, b, "t", Spec{FromTemplate: "base", StartCmd: "server", ReadyCmd: c.cmd}); err != nil {
				t.Fatal(err)
			}
			if n := runsOf(p, c.cmd); n != len(c.runs) {
				t.Errorf("the ready command ran %d times, want %d", n, len(c.runs))
			}
		})
	}
}

// A start command that cannot run (it exits 127 at once) fails the build
// at once too, naming the program, while the ready command would only
// have failed until the timeout. One that ran and ended (a daemon that
// forked) is logged, and the ready command decides.
func TestStartCommandThatCannotRunFailsTheBuild(t *testing.T) {
	b, p := readyBuilder()
	start := "pyhton3 -m http.server 8000"
	p.startExits[start] = Exit{Code: 127, Tail: []string{"/bin/bash: line 1: pyhton3: command not found"}}
	p.scripted[waitForPort] = []fakeRun{{nil, 1}}
	_, _, err := run(t, b, "t", Spec{FromTemplate: "base", StartCmd: start, ReadyCmd: waitForPort})
	failedAtFinalize(t, p, err, "the start command cannot run: pyhton3: command not found")
	// The start's end is read between two polls: the first one, unless the
	// host stalled this goroutine for the 200 ms between them.
	if n := runsOf(p, waitForPort); n > 2 {
		t.Errorf("the ready command ran %d times after the start command could not run", n)
	}

	for name, ex := range map[string]Exit{
		"a daemon that forked": {Code: 0},
		"one that crashed":     {Code: 1, Tail: []string{"cat: /etc/app.conf: No such file or directory"}},
	} {
		t.Run(name, func(t *testing.T) {
			b, p := newBuilder()
			p.startExits["daemon"] = ex
			p.scripted[waitForPort] = []fakeRun{{nil, 1}, {nil, 0}}
			_, logs, err := run(t, b, "t", Spec{FromTemplate: "base", StartCmd: "daemon", ReadyCmd: waitForPort})
			if err != nil {
				t.Fatal(err)
			}
			seen := false
			for _, l := range logs {
				seen = seen || strings.HasPrefix(l.Message, "the start command exited ")
			}
			if !seen {
				t.Error("the start command's end is not in the log")
			}
		})
	}
}

// cannotRun reads what real shells print: bash as build sandboxes run it
// (the shell() wrapper), and dash as images without bash run it (as
// /bin/sh). A file missing or unreadable after `<`, or a program's own
// complaint, is no program that cannot run.
func TestCannotRunReadsRealShells(t *testing.T) {
	dir := t.TempDir()
	noExec := filepath.Join(dir, "check.sh")
	noInterp := filepath.Join(dir, "serve")
	if err := os.WriteFile(noExec, []byte("#!/bin/sh\ntrue\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(noInterp, []byte("#!/nonexistent/node\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	const missing = "spore-no-such-program"
	bash := func(script string) *exec.Cmd {
		argv := shell(script)
		return exec.Command(argv[0], argv[1:]...)
	}
	dash := func(script string) *exec.Cmd {
		cmd := exec.Command("/bin/dash")
		cmd.Args = []string{"/bin/sh", "-c", script}
		return cmd
	}
	for _, c := range []struct {
		name  string
		cmd   *exec.Cmd
		names string // "" when the command could run
	}{
		{"bash: waitForPort", bash(strings.Replace(waitForPort, "ss", missing, 1)), missing},
		{"bash: a pipeline", bash(missing + " -tuln | grep :8000"), missing},
		{"bash: a missing path", bash(filepath.Join(dir, "nothing") + " --check"), filepath.Join(dir, "nothing")},
		{"bash: not executable", bash(noExec), noExec},
		{"bash: a missing interpreter", bash(noInterp), noInterp},
		{"bash: a redirect from a missing file", bash("grep -q up < " + filepath.Join(dir, "status")), ""},
		{"bash: a program's own missing file", bash("cat " + filepath.Join(dir, "status")), ""},
		{"bash: a failing test", bash(`[ -f /nonexistent ]`), ""},
		{"bash: exit 2", bash("exit 2"), ""},
		{"dash: a pipeline", dash(missing + " | cat"), missing},
		{"dash: a missing path", dash(filepath.Join(dir, "nothing")), filepath.Join(dir, "nothing")},
		{"dash: a redirect from a missing file", dash("grep -q up < " + filepath.Join(dir, "status")), ""},
	} {
		b, err := c.cmd.CombinedOutput()
		code := 0
		if ee := (*exec.ExitError)(nil); errors.As(err, &ee) {
			code = ee.ExitCode()
		} else if err != nil {
			t.Fatalf("%s: %v", c.name, err)
		}
		var out output
		for _, l := range strings.Split(strings.TrimRight(string(b), "\n"), "\n") {
			out.add(l)
		}
		why := cannotRun(code, out)
		t.Logf("%s: exit %d, cannot run: %q", c.name, code, why)
		switch {
		case c.names == "" && why != "":
			t.Errorf("%s (exit %d, %q): cannot run: %s", c.name, code, b, why)
		case c.names != "" && !strings.Contains(why, c.names):
			t.Errorf("%s (exit %d, %q): cannotRun = %q, want it to name %s", c.name, code, b, why, c.names)
		}
	}
}

package build

import (
	"fmt"
	"regexp"
	"strings"
)

// A ready command is polled until it passes, for up to the ready timeout:
// right for a server still starting, wrong for a command that cannot run
// at all (the stock SDK's waitForPort runs `ss`, which an image may lack),
// which fails the same way on every poll. cannotRun tells the two apart
// so such a build fails at once, naming the program.

// shellCannotRun matches the line a shell prints when it cannot run a
// command: bash's "/bin/bash: line 1: ss: command not found" (or "...: No
// such file or directory", "...: Permission denied", "...: cannot execute:
// required file not found"), dash's "/bin/sh: 1: ss: not found", busybox's
// "/bin/sh: ss: not found". Group 1 is the program, group 2 the reason.
var shellCannotRun = regexp.MustCompile(`^(?:\S*/)?(?:ba|da|a)?sh: (?:line )?(?:\d+: )?([^:]+): (command not found|not found|No such file or directory|Permission denied|cannot execute.*)$`)

// maxShellLines bounds the cannot-run lines kept of one command's output.
const maxShellLines = 8

// output keeps what cannotRun reads of a command's output (stdout and
// stderr lines): the shell's cannot-run lines and the last line.
type output struct {
	shell []string
	last  string
}

func (o *output) add(line string) {
	line = strings.TrimSpace(line)
	if len(o.shell) < maxShellLines && shellCannotRun.MatchString(line) {
		o.shell = append(o.shell, line)
	}
	o.last = line
}

// cannotRun returns why a command that exited code, printing out, could
// not run at all, or "" if it could:
//   - the shell did not find a program (whatever the exit code: in
//     `ss -tuln | grep :8000` or `[ -n "$(ss ...)" ]` the code is grep's or
//     the test's, 1, while bash printed "ss: command not found");
//   - exit 127 or 126, the shell's codes for a program not found or not
//     executable, named by the shell's line when it printed one.
//
// A missing file after `<` reads like a missing program ("/bin/bash: line
// 1: /tmp/status: No such file or directory") but exits 1: such lines count
// only with 126 or 127, so a ready command reading a file the start command
// has yet to write keeps being polled.
func cannotRun(code int, out output) string {
	const lacks = " (the template's image lacks it; install it in a run step)"
	const notExec = " (it is not an executable the template's image can run)"
	var other string
	for _, l := range out.shell {
		m := shellCannotRun.FindStringSubmatch(l)
		if m[2] == "command not found" || m[2] == "not found" {
			return m[1] + ": " + m[2] + lacks
		}
		if other == "" {
			other = m[1] + ": " + m[2]
		}
	}
	hint := lacks
	switch code {
	case 127:
	case 126:
		hint = notExec
	default:
		return ""
	}
	if other != "" {
		return other + hint
	}
	last := ""
	if out.last != "" {
		last = ": " + out.last
	}
	return fmt.Sprintf("exit %d%s%s", code, last, hint)
}

// startEnded judges a start command that ended during the ready wait: one
// that could not run fails the build; one that ran and ended (a daemon
// that forked, or one that crashed) is logged, and the ready command
// decides.
func startEnded(ex Exit, info func(step, format string, a ...any)) error {
	var out output
	for _, l := range ex.Tail {
		out.add(l)
	}
	if why := cannotRun(ex.Code, out); why != "" {
		return failed("the start command cannot run: %s", why)
	}
	last := ""
	if out.last != "" {
		last = ": " + out.last
	}
	info(StepFinalize, "the start command exited %d%s", ex.Code, last)
	return nil
}

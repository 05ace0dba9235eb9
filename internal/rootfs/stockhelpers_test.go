package rootfs

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"

	"github.com/spore-run/spore/internal/testenv"
)

// stockReadyHelpers are the ready commands the stock E2B SDK makes (npm
// e2b@2.51.0, dist/index.js: waitForPort, waitForURL, waitForProcess,
// waitForFile, waitForTimeout; each string is the SDK's own output for
// these arguments, its code run under node; the Python SDK's helpers make
// the same strings), and the programs each runs inside the build sandbox.
// The start helpers add none: setStartCmd runs the user's own command, and
// a Dockerfile's CMD or ENTRYPOINT becomes a start command with
// waitForTimeout(20000), so `sleep 20`. (Older SDKs' waitForPort was
// `ss -tuln | grep :PORT`: the same two programs.)
var stockReadyHelpers = []struct {
	helper, cmd string
	programs    []string
}{
	{"waitForPort(8000)", `[ -n "$(ss -Htuln sport = :8000)" ]`, []string{"ss"}},
	{"waitForURL('http://localhost:3000/health')", `curl -s -o /dev/null -w "%{http_code}" http://localhost:3000/health | grep -q "200"`, []string{"curl", "grep"}},
	{"waitForURL('http://x/a b', 204)", `curl -s -o /dev/null -w "%{http_code}" 'http://x/a b' | grep -q "204"`, []string{"curl", "grep"}},
	{"waitForProcess('my-daemon')", `pgrep my-daemon > /dev/null`, []string{"pgrep"}},
	{"waitForFile('/tmp/ready')", `[ -f /tmp/ready ]`, nil}, // a shell builtin
	{"waitForTimeout(5000)", `sleep 5`, []string{"sleep"}},
}

// stockRunHelpers are the template builder's other helpers: RUN steps the
// SDK writes for the user (same package, runCmd with these programs), and
// whether base provides their programs. The missing ones are the user's to
// install (pip, npm, bun), or belong to E2B templates of their own (the SDK
// refuses them on any other base).
var stockRunHelpers = []struct {
	helper   string
	programs []string
	inBase   bool
}{
	{"remove, rename, makeDir, makeSymlink", []string{"rm", "mv", "mkdir", "ln"}, true},
	{"gitClone", []string{"git"}, true},
	{"aptInstall", []string{"apt-get"}, true},
	{"pipInstall", []string{"pip"}, false},
	{"npmInstall", []string{"npm"}, false},
	{"bunInstall", []string{"bun"}, false},
	{"addMcpServer (E2B's mcp-gateway template only)", []string{"mcp-gateway"}, false},
	{"betaDevContainerPrebuild, betaSetDevContainerStart (E2B's devcontainer template only)", []string{"devcontainer", "sudo"}, false},
}

// programPackage is the Debian bookworm package that ships each program
// base must have, checked by hand with `dpkg -S` on a bookworm host.
var programPackage = map[string]string{
	"ss":      "iproute2",
	"curl":    "curl",
	"grep":    "grep",
	"pgrep":   "procps",
	"sleep":   "coreutils",
	"rm":      "coreutils",
	"mv":      "coreutils",
	"mkdir":   "coreutils",
	"ln":      "coreutils",
	"git":     "git",
	"apt-get": "apt",
	"bash":    "bash", // the shell every start and ready command runs in (build.shell)
}

// minbaseAlways are the packages debootstrap's minbase variant installs
// whatever the list: the required ones and apt (debootstrap(8)). Only apt
// is relied on here.
var minbaseAlways = []string{"apt"}

// shellBuiltins are command words bash runs itself.
var shellBuiltins = []string{"[", "[[", "test", "echo", "printf", "true", "false", "cd", "export", "exec", "!"}

var programWord = regexp.MustCompile(`^[A-Za-z_./][A-Za-z0-9_./+-]*$`)

// commandPrograms lists the programs a one-line shell command runs: the
// first word of each simple command in its lists, pipelines and command
// substitutions, less assignments and builtins. Enough for the SDK's
// helpers (a separator inside quotes would split wrongly: a human reads
// any disagreement with the table).
func commandPrograms(cmd string) []string {
	seps := strings.NewReplacer("$(", "\n", "`", "\n", "&&", "\n", "||", "\n", "|", "\n", ";", "\n", "&", "\n", "(", "\n", ")", "\n")
	redirs := strings.NewReplacer(">&", "> ", "<&", "< ") // 2>&1 is no background job
	var out []string
	for seg := range strings.SplitSeq(seps.Replace(redirs.Replace(cmd)), "\n") {
		words := strings.Fields(seg)
		for len(words) > 0 && strings.Contains(words[0], "=") && !strings.HasPrefix(words[0], "=") {
			words = words[1:] // VAR=value before the command
		}
		if len(words) == 0 || slices.Contains(shellBuiltins, words[0]) || !programWord.MatchString(words[0]) {
			continue
		}
		if !slices.Contains(out, words[0]) {
			out = append(out, words[0])
		}
	}
	return out
}

func TestCommandPrograms(t *testing.T) {
	for cmd, want := range map[string][]string{
		`ss -tuln | grep :8000`:                  {"ss", "grep"},
		`A=1 B=2 env | sort && echo done`:        {"env", "sort"},
		`[ -n "$(pgrep x)" ] || (sleep 1; true)`: {"pgrep", "sleep"},
		`[ -f /tmp/x ]`:                          nil,
		`python3 /app/check.py > /dev/null 2>&1`: {"python3"},
	} {
		if got := commandPrograms(cmd); !slices.Equal(got, want) {
			t.Errorf("commandPrograms(%q) = %q, want %q", cmd, got, want)
		}
	}
}

// Every program the stock SDK's ready helpers run comes from a package in
// BaseSpec, so `fromTemplate('base').setStartCmd(..., waitForPort(8000))`
// can pass (before iproute2 joined the list it polled `ss` for the ready
// timeout and failed).
func TestBaseHasWhatTheStockReadyHelpersRun(t *testing.T) {
	pkgs := BaseSpec().Packages
	need := []string{"bash"}
	for _, h := range stockReadyHelpers {
		if got := commandPrograms(h.cmd); !slices.Equal(got, h.programs) {
			t.Errorf("%s = %q runs %q, the table says %q", h.helper, h.cmd, got, h.programs)
		}
		need = append(need, h.programs...)
	}
	slices.Sort(need)
	for _, p := range slices.Compact(need) {
		pkg, ok := programPackage[p]
		if !ok {
			t.Errorf("%s: no package known for it (add it to programPackage after checking with dpkg -S)", p)
			continue
		}
		if !slices.Contains(pkgs, pkg) {
			t.Errorf("%s is in package %s, which BaseSpec lacks: %q", p, pkg, pkgs)
		}
	}
	for _, h := range stockRunHelpers {
		if !h.inBase {
			continue
		}
		for _, p := range h.programs {
			if pkg := programPackage[p]; !slices.Contains(pkgs, pkg) && !slices.Contains(minbaseAlways, pkg) {
				t.Errorf("%s (%s) is said to be in base, but its package %q is neither in BaseSpec nor in every minbase tree", p, h.helper, pkg)
			}
		}
	}
}

// The base tree `make setup` built has every program of the stock helpers
// that base provides, as an executable file on the sandbox's PATH.
func TestBuiltBaseHasTheStockHelpersPrograms(t *testing.T) {
	root := testenv.BaseRootFS(t)
	want := []string{"bash"}
	for _, h := range stockReadyHelpers {
		want = append(want, h.programs...)
	}
	for _, h := range stockRunHelpers {
		if h.inBase {
			want = append(want, h.programs...)
		}
	}
	slices.Sort(want)
	for _, p := range slices.Compact(want) {
		if err := executableOnPath(root, p); err != nil {
			t.Errorf("%s: %v (package %s)", p, err, programPackage[p])
		}
	}
}

// sandboxPath is the PATH of sandbox processes (envd's default).
var sandboxPath = []string{"/usr/local/sbin", "/usr/local/bin", "/usr/sbin", "/usr/bin", "/sbin", "/bin"}

// executableOnPath finds program in the tree at root as the sandbox would:
// in a PATH directory, through symbolic links resolved inside the tree.
func executableOnPath(root, program string) error {
	for _, dir := range sandboxPath {
		p, err := resolveInTree(root, path.Join(dir, program))
		if errors.Is(err, fs.ErrNotExist) {
			continue
		}
		if err != nil {
			return err
		}
		st, err := os.Stat(p)
		if err != nil {
			return err
		}
		if !st.Mode().IsRegular() || st.Mode().Perm()&0o111 == 0 {
			return fmt.Errorf("%s is not an executable file (%v)", path.Join(dir, program), st.Mode())
		}
		return nil
	}
	return fmt.Errorf("not found on PATH %s", strings.Join(sandboxPath, ":"))
}

// resolveInTree returns the host path of name (absolute, as seen inside
// the tree at root), following symbolic links one component at a time: an
// absolute target is taken from root, never from the host (alternatives
// and merged-/usr links are absolute or relative).
func resolveInTree(root, name string) (string, error) {
	todo := strings.Split(strings.Trim(name, "/"), "/")
	cur := "/"
	for hops := 0; len(todo) > 0; {
		next := path.Join(cur, todo[0])
		todo = todo[1:]
		st, err := os.Lstat(filepath.Join(root, next))
		if err != nil {
			return "", err
		}
		if st.Mode()&fs.ModeSymlink == 0 {
			cur = next
			continue
		}
		if hops++; hops > 40 {
			return "", fmt.Errorf("%s: too many levels of symbolic links", name)
		}
		target, err := os.Readlink(filepath.Join(root, next))
		if err != nil {
			return "", err
		}
		if !path.IsAbs(target) {
			target = path.Join(cur, target)
		}
		todo = append(strings.Split(strings.Trim(target, "/"), "/"), todo...)
		cur = "/"
	}
	return filepath.Join(root, cur), nil
}

// The resolver stays inside the tree: an absolute link is the tree's, a
// relative one climbing above the root stops at it.
func TestResolveInTree(t *testing.T) {
	root := t.TempDir()
	os.MkdirAll(filepath.Join(root, "usr", "bin"), 0o755)
	os.WriteFile(filepath.Join(root, "usr", "bin", "ss"), []byte("#!/bin/sh\n"), 0o755)
	os.WriteFile(filepath.Join(root, "usr", "bin", "data"), []byte("x"), 0o644)
	os.Symlink("usr/bin", filepath.Join(root, "bin"))                 // merged /usr
	os.Symlink("/usr/bin/ss", filepath.Join(root, "usr", "bin", "a")) // absolute: the tree's
	os.Symlink("../../../../usr/bin/ss", filepath.Join(root, "usr", "bin", "b"))
	os.Symlink("/etc/passwd", filepath.Join(root, "usr", "bin", "host")) // the host's exists, the tree's not
	for _, p := range []string{"ss", "a", "b"} {
		if err := executableOnPath(root, p); err != nil {
			t.Errorf("%s: %v", p, err)
		}
	}
	if got, err := resolveInTree(root, "/bin/ss"); err != nil || got != filepath.Join(root, "usr", "bin", "ss") {
		t.Errorf("/bin/ss = %q, %v", got, err)
	}
	for _, p := range []string{"data", "host", "nothing"} {
		if err := executableOnPath(root, p); err == nil {
			t.Errorf("%s counts as an executable on PATH", p)
		}
	}
}

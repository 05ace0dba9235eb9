package sdk

import (
	"bytes"
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/spore-run/spore/internal/api"
)

// cli runs the spore binary against the test's server.
func (s *server) cli(stdin string, args ...string) (string, string, int) {
	s.t.Helper()
	cmd := exec.Command(filepath.Join(s.bin, "spore"), args...)
	cmd.Env = append(os.Environ(), "SPORE_API_URL=http://"+s.addr, "SPORE_API_KEY="+apiKey)
	cmd.Stdin = strings.NewReader(stdin)
	var out, errb bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errb
	err := cmd.Run()
	code := 0
	if ee, ok := err.(*exec.ExitError); ok {
		code = ee.ExitCode()
	} else if err != nil {
		s.t.Fatalf("spore %v: %v", args, err)
	}
	return out.String(), errb.String(), code
}

func (s *server) ok(args ...string) string {
	s.t.Helper()
	out, errs, code := s.cli("", args...)
	if code != 0 {
		s.t.Fatalf("spore %v: exit %d: %s%s", args, code, out, errs)
	}
	return strings.TrimSpace(out)
}

func TestCLI(t *testing.T) {
	s := newServer(t)
	id := s.ok("start", "base", "--metadata", "suite=cli", "--env", "GREETING=hi")
	if !strings.HasPrefix(id, "i") {
		t.Fatalf("start printed %q", id)
	}
	// exec streams output and exits with the command's code.
	out, _, code := s.cli("", "exec", id, "--", "echo $GREETING; echo err >&2; exit 3")
	if out != "hi\n" || code != 3 {
		t.Fatalf("exec: %q, exit %d", out, code)
	}
	out, _, code = s.cli("line one\nline two\n", "exec", "-i", id, "--", "cat")
	if out != "line one\nline two\n" || code != 0 {
		t.Fatalf("exec -i: %q, exit %d", out, code)
	}
	if got := s.ok("exec", "--user", "root", id, "--", "id", "-u"); got != "0" {
		t.Fatalf("exec as root: %q", got)
	}
	// The API's port (on the host's 127.0.0.1) is out of reach from inside.
	port := s.addr[strings.LastIndexByte(s.addr, ':')+1:]
	probe := "curl -s -m 2 -o /dev/null -w %{http_code} http://127.0.0.1:" + port + "/health; echo; curl -s -m 2 -o /dev/null -w %{http_code} http://10.0.0.1:" + port + "/health"
	if out, _, _ := s.cli("", "exec", id, "--", probe); strings.Contains(out, "200") {
		t.Fatalf("a sandbox reached the API port: %q", out)
	}
	// cp both ways, binary intact.
	dir := t.TempDir()
	blob := bytes.Repeat([]byte{0, 1, 2, 255, 'x'}, 300000)
	os.WriteFile(filepath.Join(dir, "in.bin"), blob, 0o644)
	s.ok("cp", filepath.Join(dir, "in.bin"), id+":/home/user/up/in.bin")
	s.ok("cp", id+":/home/user/up/in.bin", filepath.Join(dir, "out.bin"))
	if b, _ := os.ReadFile(filepath.Join(dir, "out.bin")); !bytes.Equal(b, blob) {
		t.Fatalf("cp round trip: %d bytes back of %d", len(b), len(blob))
	}
	// snapshot, ls, fork, rollback.
	snap := s.ok("snapshot", "create", id, "--name", "cli-snap")
	if ls := s.ok("snapshot", "ls", "--sandbox-id", id); !strings.Contains(ls, snap) || !strings.Contains(ls, "cli-snap") {
		t.Fatalf("snapshot ls: %s", ls)
	}
	var kids []childResult
	if err := json.Unmarshal([]byte(s.ok("fork", id, "-n", "3", "--json")), &kids); err != nil || len(kids) != 3 || kids[0].ID == "" {
		t.Fatalf("fork: %v %v", kids, err)
	}
	s.ok("exec", id, "--", "rm /home/user/up/in.bin")
	if got := s.ok("rollback", id, "cli-snap"); !strings.Contains(got, "rolled back") {
		t.Fatalf("rollback: %s", got)
	}
	if got := s.ok("exec", id, "--", "test -f /home/user/up/in.bin && echo back"); got != "back" {
		t.Fatalf("after rollback: %q", got)
	}
	// snapshot diff: what changed between two snapshots, text diffs of
	// small text files, the sandboxes it starts gone after.
	s.ok("exec", id, "--", "printf 'a=1\\nb=2\\n' > /home/user/app.conf; echo old > /home/user/gone.txt")
	before := s.ok("snapshot", "create", id)
	s.ok("exec", id, "--", "printf 'a=1\\nb=3\\n' > /home/user/app.conf; rm /home/user/gone.txt; echo hi > /home/user/new.txt; "+
		"head -c 100 /dev/zero > /home/user/up/in.bin; chmod 600 /home/user/up/in.bin")
	after := s.ok("snapshot", "create", id)
	running := len(s.listed())
	var d api.SnapshotDiff
	if err := json.Unmarshal([]byte(s.ok("snapshot", "diff", before, after, "--json")), &d); err != nil {
		t.Fatal(err)
	}
	got := map[string]string{}
	for _, c := range d.Changes {
		got[c.Path] = c.Change
	}
	want := map[string]string{"/home/user/app.conf": "changed", "/home/user/gone.txt": "removed", "/home/user/new.txt": "added", "/home/user/up/in.bin": "changed"}
	if len(got) != len(want) || d.Added != 1 || d.Removed != 1 || d.Changed != 2 {
		t.Fatalf("snapshot diff: %v (%d/%d/%d), want %v", got, d.Added, d.Removed, d.Changed, want)
	}
	for p, k := range want {
		if got[p] != k {
			t.Fatalf("snapshot diff: %s %s, want %s", p, got[p], k)
		}
	}
	began := time.Now()
	text := s.ok("snapshot", "diff", before, after)
	t.Logf("spore snapshot diff (two sandboxes started, listed, read, killed): %v", time.Since(began))
	for _, l := range []string{"M /home/user/app.conf\n", "D /home/user/gone.txt (4 bytes)", "A /home/user/new.txt (3 bytes)",
		"M /home/user/up/in.bin (mode 0644 -> 0600, 1500000 -> 100 bytes)", "--- a/home/user/app.conf", "-b=2\n+b=3", "+hi", "-old",
		"1 added, 1 removed, 2 changed"} {
		if !strings.Contains(text, l) {
			t.Fatalf("snapshot diff lacks %q:\n%s", l, text)
		}
	}
	if n := len(s.listed()); n != running {
		t.Fatalf("%d sandboxes after a diff, %d before", n, running)
	}
	// pause, info, resume, timeout.
	s.ok("pause", id)
	var info struct {
		SporeState string `json:"sporeState"`
	}
	json.Unmarshal([]byte(s.ok("info", id, "--json")), &info)
	if info.SporeState != "paused" {
		t.Fatalf("info after pause: %+v", info)
	}
	s.ok("resume", id)
	s.ok("timeout", id, "10m")
	s.ok("pause", "--hibernate", id)
	// exec on a hibernated sandbox resumes it (connect semantics).
	if got := s.ok("exec", id, "--", "echo awake"); got != "awake" {
		t.Fatalf("exec after hibernate: %q", got)
	}
	// An interactive shell through a PTY (driven by a pipe here).
	out, _, code = s.cli("echo $((6*7))\nexit 4\n", "connect", id)
	if !strings.Contains(out, "42") || code != 4 {
		t.Fatalf("connect: exit %d, %q", code, out)
	}
	// Templates: build, list, start from, remove.
	tpl := s.ok("template", "build", "cli-tpl", "--run", "echo built > /opt/marker", "--ready", "test -f /opt/marker")
	if ls := s.ok("template", "ls"); !strings.Contains(ls, "cli-tpl") || !strings.Contains(ls, tpl) {
		t.Fatalf("template ls: %s", ls)
	}
	fromTpl := s.ok("start", "cli-tpl")
	if got := s.ok("exec", fromTpl, "--", "cat /opt/marker"); got != "built" {
		t.Fatalf("sandbox from the built template: %q", got)
	}
	// ls, with a filter, tables and JSON.
	if ls := s.ok("ls", "--metadata", "suite=cli"); !strings.Contains(ls, id) || !strings.Contains(ls, "SANDBOX") {
		t.Fatalf("ls: %s", ls)
	}
	// Errors: a clear message and a non-zero exit, nothing changed.
	for _, bad := range [][]string{
		{"start", "no-such-template"},
		{"kill", "i0000000000000000000"},
		{"fork", id, "-n", "0"},
		{"rollback", id, "no-such-snapshot"},
		{"exec", "../etc", "--", "true"},
		{"timeout", id, "-5s"},
		{"cp", "/nope", id + ":/x"},
		{"snapshot", "diff", before, "no-such-snapshot"},
		{"snapshot", "diff", "bad!ref", before},
	} {
		_, errs, code := s.cli("", bad...)
		if code == 0 || !strings.HasPrefix(errs, "spore: ") {
			t.Errorf("spore %v: exit %d, stderr %q; want a message and a non-zero exit", bad, code, errs)
		}
	}
	// spore up's /metrics shows the sandbox traffic its proxy carried
	// (exec and cp went through it) and its egress proxy's counts.
	code, body := s.rest("GET", "/metrics", "")
	if code != 200 || !regexp.MustCompile(`(?m)^spore_proxy_requests_total\{code="200",side="replica"\} [1-9]`).Match(body) ||
		!regexp.MustCompile(`(?m)^spore_proxy_bytes_total\{direction="out",side="replica"\} [1-9]`).Match(body) ||
		!strings.Contains(string(body), `spore_egress_connections_total{outcome="allowed"}`) {
		t.Fatalf("metrics: %d, no proxied requests or egress counts in:\n%s", code, grepLines(string(body), "spore_proxy_", "spore_egress_"))
	}
	// Kill everything this test made.
	for _, sb := range s.listed() {
		s.ok("kill", sb)
	}
	s.ok("template", "rm", "cli-tpl")
	s.ok("snapshot", "rm", snap, before, after)
	if got := s.ok("ls", "--json"); got != "null" && got != "[]" {
		t.Fatalf("left after kill: %s", got)
	}
}

// grepLines is the lines of s that start with one of prefixes.
func grepLines(s string, prefixes ...string) string {
	var out []string
	for _, l := range strings.Split(s, "\n") {
		for _, p := range prefixes {
			if strings.HasPrefix(l, p) {
				out = append(out, l)
				break
			}
		}
	}
	return strings.Join(out, "\n")
}

// listed is the sandboxes spore ls shows.
func (s *server) listed() []string {
	s.t.Helper()
	var all []struct {
		SandboxID string `json:"sandboxID"`
	}
	if err := json.Unmarshal([]byte(s.ok("ls", "--json")), &all); err != nil {
		s.t.Fatal(err)
	}
	var ids []string
	for _, sb := range all {
		ids = append(ids, sb.SandboxID)
	}
	return ids
}

type childResult struct {
	ID  string `json:"sandboxID"`
	Err string `json:"error"`
}

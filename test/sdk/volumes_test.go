package sdk

import (
	"bytes"
	"encoding/json"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"github.com/spore-run/spore/internal/api"
)

// E2B's volume API through the stock SDK's Volume module (volumes.mjs)
// and through `spore volume`: records, modes, sizes, tokens, mounts in
// sandboxes (read-write and read-only), copies in and out (cp, files),
// usage, and the clear refusals where they stop.
func TestVolumesThroughTheSDKAndCLI(t *testing.T) {
	s := newServer(t)
	out := s.node("volumes.mjs")
	t.Log(out)
	if !strings.Contains(out, "10 passed, 0 failed") {
		t.Fatal("the SDK part did not pass")
	}
	got, errs, code := s.cli("", "volume", "create", "--exclusive", "--size", "2G", "cli-vol", "--json")
	var v api.VolumeAndToken
	if code != 0 || json.Unmarshal([]byte(got), &v) != nil || v.Name != "cli-vol" || v.Mode != "exclusive" || v.SizeMB != 2048 {
		t.Fatalf("spore volume create: %d %s %s", code, got, errs)
	}
	if out := s.ok("volume", "ls"); !strings.Contains(out, v.VolumeID) || !strings.Contains(out, "2 GiB") || strings.Contains(out, v.Token) {
		t.Fatalf("spore volume ls: %s", out)
	}
	for _, bad := range [][]string{
		{"volume", "create", "cli-vol"}, {"volume", "create", "--size", "lots", "x"}, {"volume", "info", "missing"}, {"volume", "rm", "missing"},
	} {
		if _, errs, code := s.cli("", bad...); code == 0 || strings.TrimSpace(errs) == "" {
			t.Errorf("spore %v: exit %d, stderr %q", bad, code, errs)
		}
	}
	// spore start --volume: a shared volume, read-write and read-only.
	if _, errs, code := s.cli("", "volume", "create", "cli-shared", "--size", "64M"); code != 0 {
		t.Fatalf("spore volume create: %s", errs)
	}
	rw := s.ok("start", "base", "--volume", "cli-shared:/home/user/work")
	ro := s.ok("start", "base", "--volume", "cli-shared:/mnt/work:ro")
	s.ok("exec", rw, "--", "echo from-the-cli > /home/user/work/f")
	if got := s.ok("exec", ro, "--", "cat /mnt/work/f"); got != "from-the-cli" {
		t.Fatalf("the read-only mount shows %q", got)
	}
	if _, _, code := s.cli("", "exec", ro, "--", "touch /mnt/work/g"); code == 0 {
		t.Fatal("a write on a read-only mount passed")
	}
	// spore volume cp and files: a local tree into the volume, seen by
	// the sandbox; the sandbox's file out of it; its usage in info.
	up := t.TempDir()
	os.MkdirAll(filepath.Join(up, "sub"), 0o755)
	os.WriteFile(filepath.Join(up, "sub", "x.txt"), []byte("from-the-host"), 0o644)
	os.WriteFile(filepath.Join(up, "big"), bytes.Repeat([]byte("0123456789abcdef"), 1<<16), 0o644) // 1 MiB
	s.ok("volume", "cp", "-r", up, "cli-shared:/up")
	if got := s.ok("exec", rw, "--", "cat /home/user/work/up/sub/x.txt; echo; wc -c < /home/user/work/up/big"); got != "from-the-host\n1048576" {
		t.Fatalf("the sandbox sees the uploaded tree as %q", got)
	}
	if got := s.ok("volume", "cp", "cli-shared:/f", "-"); got != "from-the-cli" {
		t.Fatalf("spore volume cp of the sandbox's file: %q", got)
	}
	if out := s.ok("volume", "files", "-r", "cli-shared"); !strings.Contains(out, "/up/sub/x.txt") || !strings.Contains(out, "/f") {
		t.Fatalf("spore volume files: %s", out)
	}
	if out := s.ok("volume", "info", "cli-shared"); !regexp.MustCompile(`USED[\s\S]*\d(\.\d)? MiB of \d+(\.\d)? MiB`).MatchString(out) {
		t.Fatalf("spore volume info: no usage: %s", out)
	}
	if out := s.ok("info", ro); !strings.Contains(out, "cli-shared:/mnt/work:ro") {
		t.Fatalf("spore info of a sandbox with a volume: %s", out)
	}
	for _, bad := range [][]string{{"start", "base", "--volume", "cli-shared"}, {"start", "base", "--volume", "cli-shared:rel"}, {"start", "base", "--volume", "missing:/data"}} {
		if _, errs, code := s.cli("", bad...); code == 0 || strings.TrimSpace(errs) == "" {
			t.Errorf("spore %v: exit %d, stderr %q", bad, code, errs)
		}
	}
	if _, errs, code := s.cli("", "volume", "rm", "cli-shared"); code == 0 || !strings.Contains(errs, "mounted by sandbox") {
		t.Fatalf("spore volume rm of a mounted volume: %d %s", code, errs)
	}
	s.ok("kill", rw)
	s.ok("kill", ro)
	s.ok("volume", "rm", "cli-shared")

	// The exclusive volume: captured with the sandbox's snapshot, back
	// with its rollback; one read-write holder; each fork child a volume
	// of its own; the snapshot keeps the content after the volume goes.
	ex := s.ok("start", "base", "--volume", "cli-vol:/home/user/ex")
	s.ok("exec", ex, "--", "echo at-snapshot > /home/user/ex/f")
	s.ok("snapshot", "create", ex, "--name", "ex-snap")
	s.ok("exec", ex, "--", "echo changed > /home/user/ex/f; touch /home/user/ex/new")
	s.ok("rollback", ex, "ex-snap")
	if got := s.ok("exec", ex, "--", "cat /home/user/ex/f; test -e /home/user/ex/new || echo no-new"); got != "at-snapshot\nno-new" {
		t.Fatalf("after the rollback the exclusive volume holds %q", got)
	}
	if _, errs, code := s.cli("", "start", "base", "--volume", "cli-vol:/x"); code == 0 || !strings.Contains(errs, "exclusive") {
		t.Fatalf("a second read-write mount of the exclusive volume: %d %s", code, errs)
	}
	var kids []childResult
	if err := json.Unmarshal([]byte(s.ok("fork", ex, "-n", "2", "--json")), &kids); err != nil || len(kids) != 2 {
		t.Fatalf("fork: %v %v", kids, err)
	}
	for i, k := range kids {
		if got := s.ok("exec", k.ID, "--", "cat /home/user/ex/f"); got != "at-snapshot" {
			t.Fatalf("fork child %s sees %q", k.ID, got)
		}
		s.ok("exec", k.ID, "--", "echo child-"+string(rune('0'+i))+" > /home/user/ex/f")
		if out := s.ok("info", k.ID); !strings.Contains(out, "cli-vol-"+k.ID+":/home/user/ex") {
			t.Fatalf("spore info of a fork child: want its own volume: %s", out)
		}
	}
	if got := s.ok("exec", ex, "--", "cat /home/user/ex/f"); got != "at-snapshot" {
		t.Fatalf("the children's writes reached the parent: %q", got)
	}
	s.ok("kill", ex)
	for _, k := range kids {
		s.ok("kill", k.ID)
		s.ok("volume", "rm", "cli-vol-"+k.ID)
	}
	if out := s.ok("volume", "rm", "cli-vol"); !strings.Contains(out, "deleted") {
		t.Fatalf("spore volume rm: %s", out)
	}
	if out := s.ok("volume", "ls"); strings.Contains(out, "cli-vol") {
		t.Fatalf("after rm: %s", out)
	}
	from := s.ok("start", "ex-snap")
	if got := s.ok("exec", from, "--", "cat /home/user/ex/f"); got != "at-snapshot" {
		t.Fatalf("a sandbox from the snapshot, its volume deleted, sees %q", got)
	}
	s.ok("kill", from)
	s.ok("volume", "rm", "cli-vol-"+from)
	s.ok("snapshot", "rm", "ex-snap")
}

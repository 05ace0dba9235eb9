package sdk

import (
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/spore-run/spore/internal/api"
)

// E2B's secrets API through the stock SDK's Secret module (secrets.mjs)
// and through `spore secret`: values go in on stdin, never come out, and
// are sealed in the server's database (the value's bytes are in no file
// of the data directory).
func TestSecretsThroughTheSDKAndCLI(t *testing.T) {
	s := newServer(t)
	out := s.node("secrets.mjs")
	t.Log(out)
	if !strings.Contains(out, "8 passed, 0 failed") {
		t.Fatal("the SDK part did not pass")
	}

	const value = "sk-cli-7d1f3a9c5e"
	got, errs, code := s.cli(value+"\n", "secret", "create", "cli-key", "--metadata", "env=test", "--json")
	var sec api.Secret
	if code != 0 || json.Unmarshal([]byte(got), &sec) != nil || sec.Name != "cli-key" || sec.CurrentVersion != 1 {
		t.Fatalf("spore secret create: %d %s %s", code, got, errs)
	}
	if out := s.ok("secret", "ls"); !strings.Contains(out, sec.SecretID) || !strings.Contains(out, "env=test") || strings.Contains(out, value) {
		t.Fatalf("spore secret ls: %s", out)
	}
	if got, errs, code := s.cli("sk-cli-rotated\n", "secret", "update", "cli-key"); code != 0 || !strings.Contains(got, "version 2") {
		t.Fatalf("spore secret update: %d %s %s", code, got, errs)
	}
	if out := s.ok("secret", "info", sec.SecretID); !strings.Contains(out, "cli-key") || strings.Contains(out, "sk-cli") {
		t.Fatalf("spore secret info: %s", out)
	}
	// Sealed at rest: no file of the data directory holds a value.
	filepath.WalkDir(s.data, func(p string, d os.DirEntry, err error) error {
		if err != nil || d.IsDir() || !d.Type().IsRegular() {
			return nil
		}
		if info, _ := d.Info(); info == nil || info.Size() > 64<<20 {
			return nil
		}
		if b, _ := os.ReadFile(p); strings.Contains(string(b), value) || strings.Contains(string(b), "sk-cli-rotated") {
			t.Errorf("%s holds a secret's value", p)
		}
		return nil
	})
	// Bad input: a message and a non-zero exit, nothing changed.
	for _, bad := range []struct {
		stdin string
		args  []string
	}{
		{"", []string{"secret", "create", "empty"}},
		{"x\n", []string{"secret", "create", "cli-key"}},
		{"x\n", []string{"secret", "create", "a{b}"}},
		{"x\n", []string{"secret", "update", "missing"}},
		{"", []string{"secret", "info", "missing"}},
		{"", []string{"secret", "rm", "missing"}},
	} {
		if _, errs, code := s.cli(bad.stdin, bad.args...); code == 0 || strings.TrimSpace(errs) == "" {
			t.Errorf("spore %v: exit %d, stderr %q", bad.args, code, errs)
		}
	}
	if out := s.ok("secret", "info", "cli-key", "--json"); !strings.Contains(out, `"currentVersion": 2`) {
		t.Fatalf("refused commands changed the secret: %s", out)
	}
	if out := s.ok("secret", "rm", "cli-key"); !strings.Contains(out, "deleted") {
		t.Fatalf("spore secret rm: %s", out)
	}
}

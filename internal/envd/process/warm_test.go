package process

import (
	"os"
	"path/filepath"
	"testing"
)

// TestIsBash: a warm shell is only bash itself, never another binary
// linked under bash's name (busybox images link it to busybox) nor a
// wrapper script named bash.
func TestIsBash(t *testing.T) {
	if !isBash("/bin/bash") {
		t.Fatal("/bin/bash on this host is not taken for bash")
	}
	dir := t.TempDir()
	link := filepath.Join(dir, "link", "bash")
	script := filepath.Join(dir, "script", "bash")
	for _, d := range []string{filepath.Dir(link), filepath.Dir(script)} {
		if err := os.Mkdir(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.Symlink("/bin/true", link); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(script, []byte("#!/bin/sh\nexec /bin/sh \"$@\"\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	for _, p := range []string{"/bin/sh", "/bin/true", link, script, filepath.Join(dir, "bash")} {
		if isBash(p) {
			t.Errorf("%s taken for bash", p)
		}
	}
	// A copy of bash under bash's name is bash.
	b, err := os.ReadFile("/bin/bash")
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(script, b, 0o755); err != nil {
		t.Fatal(err)
	}
	if !isBash(script) {
		t.Error("a copy of bash is not taken for bash")
	}
}

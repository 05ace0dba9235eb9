package main

import (
	"archive/tar"
	"bytes"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
)

// The test binary runs main() when asked, so the tests drive the real
// flag wiring and exit codes.
func TestMain(m *testing.M) {
	if os.Getenv("SPORE_ENVD_TEST_MAIN") == "1" {
		main()
		os.Exit(0)
	}
	os.Exit(m.Run())
}

func runEnvd(t *testing.T, args ...string) (int, string) {
	t.Helper()
	cmd := exec.Command(os.Args[0], args...)
	cmd.Env = append(os.Environ(), "SPORE_ENVD_TEST_MAIN=1")
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	err := cmd.Run()
	if ee, ok := err.(*exec.ExitError); ok {
		return ee.ExitCode(), stderr.String()
	}
	if err != nil {
		t.Fatal(err)
	}
	return 0, stderr.String()
}

func tarOf(t *testing.T, names ...string) string {
	t.Helper()
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	for _, n := range names {
		tw.WriteHeader(&tar.Header{Name: n, Typeflag: tar.TypeReg, Mode: 0o644, Size: int64(len(n))})
		tw.Write([]byte(n))
	}
	tw.Close()
	p := filepath.Join(t.TempDir(), "a.tar")
	os.WriteFile(p, buf.Bytes(), 0o600)
	return p
}

func TestCopyMode(t *testing.T) {
	if os.Getuid() != 0 {
		t.Fatal("needs root (it chowns)")
	}
	dest := filepath.Join(t.TempDir(), "out") + "/"
	code, stderr := runEnvd(t, "-copy", "-archive", tarOf(t, "app/a.txt"), "-src", "app", "-dest", dest, "-mode", "0600", "-user", "5:6")
	if code != 0 {
		t.Fatalf("exit %d: %s", code, stderr)
	}
	fi, err := os.Stat(filepath.Join(dest, "a.txt"))
	if err != nil || fi.Mode() != 0o600 || fi.Sys().(*syscall.Stat_t).Uid != 5 || fi.Sys().(*syscall.Stat_t).Gid != 6 {
		t.Fatalf("%v %v", fi, err)
	}
	// Without -user: root, not the daemon's default user.
	dest3 := filepath.Join(t.TempDir(), "out3")
	if code, stderr := runEnvd(t, "-copy", "-archive", tarOf(t, "b"), "-src", "b", "-dest", dest3); code != 0 {
		t.Fatalf("exit %d: %s", code, stderr)
	}
	if fi, err := os.Stat(dest3); err != nil || fi.Sys().(*syscall.Stat_t).Uid != 0 {
		t.Fatalf("%v %v", fi, err)
	}
	// An invalid archive: exit 2, one line on stderr, nothing written.
	dest2 := filepath.Join(t.TempDir(), "out2")
	code, stderr = runEnvd(t, "-copy", "-archive", tarOf(t, "ok", "../evil"), "-src", ".", "-dest", dest2)
	if code != 2 || strings.Count(strings.TrimSpace(stderr), "\n") != 0 || !strings.Contains(stderr, "climbs out") {
		t.Fatalf("exit %d, stderr %q", code, stderr)
	}
	if _, err := os.Stat(dest2); err == nil {
		t.Fatal("written despite the refusal")
	}
	// Another failure: exit 1.
	code, stderr = runEnvd(t, "-copy", "-archive", "/nonexistent.tar", "-src", ".", "-dest", dest2)
	if code != 1 || stderr == "" {
		t.Fatalf("exit %d, stderr %q", code, stderr)
	}
}

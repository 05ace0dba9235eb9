package rootfs

import (
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/spore-run/spore/internal/errdefs"
)

func TestParseMirror(t *testing.T) {
	cases := map[string]string{
		"Types: deb\nURIs: http://mirror.example/debian\nSuites: bookworm\n":                "http://mirror.example/debian",
		"deb http://m.example/debian bookworm main\n":                                       "http://m.example/debian",
		"deb [signed-by=/k.gpg] http://m.example/debian/ bookworm main\n":                   "http://m.example/debian/",
		"# deb http://commented.example/debian bookworm main\n":                             "",
		"Types: deb\nURIs: http://sec.example/debian-security\nSuites: bookworm-security\n": "",
	}
	for in, want := range cases {
		if got := parseMirror(in); got != want {
			t.Errorf("parseMirror(%q) = %q, want %q", in, got, want)
		}
	}
}

func TestLookupAndUpToDate(t *testing.T) {
	dir := t.TempDir()
	if _, err := Lookup(dir, "base"); !errdefs.IsNotFound(err) {
		t.Fatalf("Lookup(missing) = %v", err)
	}
	if _, err := Lookup(dir, "../etc"); !errdefs.IsInvalidArgument(err) {
		t.Fatalf("Lookup(../etc) = %v", err)
	}
	spec := BaseSpec()
	os.MkdirAll(filepath.Join(dir, "base"), 0o755)
	stamp := func(packages []string, revision int) {
		t.Helper()
		b, err := json.Marshal(Stamp{ID: "r1", Suite: "bookworm", Variant: "minbase", Packages: packages, Revision: revision})
		if err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(dir, "base.json"), b, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	stamp(spec.Packages, treeRevision-1)
	if UpToDate(dir, spec) {
		t.Fatal("an older revision counts as up to date")
	}
	// A tree built before a package joined the list (iproute2 for the SDK's
	// waitForPort) is rebuilt.
	stamp([]string{"bash", "coreutils", "python3", "procps", "ca-certificates", "curl", "git"}, treeRevision)
	if UpToDate(dir, spec) {
		t.Fatal("a tree built from another package list counts as up to date")
	}
	stamp(spec.Packages, treeRevision)
	if !UpToDate(dir, spec) {
		t.Fatal("the current build is not up to date")
	}
	if st, err := Lookup(dir, "base"); err != nil || st.ID != "r1" {
		t.Fatalf("Lookup = %+v, %v", st, err)
	}
}

// The tree gets the sandbox's own name-service files, replacing what
// debootstrap left (the build host's resolver), without following links.
func TestWriteEtc(t *testing.T) {
	root := t.TempDir()
	outside := filepath.Join(t.TempDir(), "outside")
	os.WriteFile(outside, []byte("keep"), 0o644)
	os.MkdirAll(filepath.Join(root, "etc"), 0o755)
	os.Mkdir(filepath.Join(root, "tmp"), 0o1777)
	os.WriteFile(filepath.Join(root, "etc", "resolv.conf"), []byte("nameserver 10.255.255.53\n"), 0o755)
	os.Symlink(outside, filepath.Join(root, "etc", "hosts"))
	if err := writeEtc(root); err != nil {
		t.Fatal(err)
	}
	read := func(name string) string {
		b, err := os.ReadFile(filepath.Join(root, "etc", name))
		if err != nil {
			t.Fatal(err)
		}
		return string(b)
	}
	if got := read("resolv.conf"); got != "nameserver 10.0.0.1\n" {
		t.Errorf("resolv.conf = %q", got)
	}
	hosts := read("hosts")
	for _, line := range []string{"127.0.0.1\tlocalhost", "10.0.0.2\t" + Hostname} {
		if !strings.Contains(hosts, line+"\n") {
			t.Errorf("hosts lacks %q:\n%s", line, hosts)
		}
	}
	if got := read("hostname"); got != Hostname+"\n" {
		t.Errorf("hostname = %q", got)
	}
	if ents, err := os.ReadDir(filepath.Join(root, "tmp")); err != nil || len(ents) == 0 {
		t.Errorf("/tmp is empty (runsc would mount an unsized tmpfs over it): %v %v", ents, err)
	}
	if b, _ := os.ReadFile(outside); string(b) != "keep" {
		t.Errorf("wrote through a symbolic link: %q", b)
	}
	if st, _ := os.Lstat(filepath.Join(root, "etc", "hosts")); st.Mode()&os.ModeSymlink != 0 || st.Mode().Perm() != 0o644 {
		t.Errorf("hosts mode %v", st.Mode())
	}
}

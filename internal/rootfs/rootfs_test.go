package rootfs

import (
	"os"
	"path/filepath"
	"strconv"
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
	os.WriteFile(filepath.Join(dir, "base.json"), []byte(`{"id":"r1","suite":"bookworm","variant":"minbase","packages":["bash","coreutils","python3","procps","ca-certificates","curl","git"],"revision":`+strconv.Itoa(treeRevision-1)+`}`), 0o644)
	if UpToDate(dir, spec) {
		t.Fatal("an older revision counts as up to date")
	}
	os.WriteFile(filepath.Join(dir, "base.json"), []byte(`{"id":"r1","suite":"bookworm","variant":"minbase","packages":["bash","coreutils","python3","procps","ca-certificates","curl","git"],"revision":`+strconv.Itoa(treeRevision)+`}`), 0o644)
	if !UpToDate(dir, spec) {
		t.Fatal("the current build is not up to date")
	}
	if st, err := Lookup(dir, "base"); err != nil || st.ID != "r1" {
		t.Fatalf("Lookup = %+v, %v", st, err)
	}
}

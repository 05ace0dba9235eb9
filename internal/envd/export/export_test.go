package export

import (
	"archive/tar"
	"bytes"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

func TestLineRoundTrip(t *testing.T) {
	for _, e := range []Entry{
		{Path: "etc/passwd", Type: TypeFile, Mode: 0o4755, UID: 1, GID: 2, Size: 3, Mtime: 1700000000123456789},
		{Path: "a b/\n\"x\"\xff", Type: TypeSymlink, Mode: 0o777, Link: "../t a\nrg"},
		{Path: "dev/null", Type: TypeChar, Mode: 0o666, Rdev: 259},
	} {
		got, err := ParseLine(strings.TrimSuffix(string(e.AppendLine(nil)), "\n"))
		if err != nil || got != e {
			t.Fatalf("%+v: got %+v, %v", e, got, err)
		}
	}
	for _, bad := range []string{`"../x" f 644 0 0 0 0 0 ""`, `"/abs" f 644 0 0 0 0 0 ""`, `"a/./b" f 644 0 0 0 0 0 ""`,
		`"x" z 644 0 0 0 0 0 ""`, `"x" f 644 0 0 0 0 ""`, `x f 644 0 0 0 0 0 ""`} {
		if _, err := ParseLine(bad); err == nil {
			t.Fatalf("%q parsed", bad)
		}
	}
}

func TestDiff(t *testing.T) {
	f := func(p string, mt int64) Entry { return Entry{Path: p, Type: TypeFile, Mode: 0o644, Mtime: mt, Size: 1} }
	d := func(p string, mt int64) Entry { return Entry{Path: p, Type: TypeDir, Mode: 0o755, Mtime: mt} }
	lower := []Entry{d("a", 1), f("a/same", 1), f("a/changed", 1), f("a/gone", 1), d("b", 1), f("b/x", 1), d("c", 1), f("c/y", 1),
		d("proc", 1), f("proc/z", 1), f("e", 1)}
	upper := []Entry{d("a", 2), f("a/same", 1), f("a/changed", 2), f("a/new", 2), // b deleted wholly
		f("c", 2),                                                // dir replaced by a file
		{Path: "proc", Type: TypeMount}, d("e", 2), f("e/in", 2), // file replaced by a dir
		{Path: "sock", Type: TypeSocket}}
	changed, deleted := Diff(lower, upper)
	var paths []string
	for _, e := range changed {
		paths = append(paths, e.Path)
	}
	if want := []string{"a", "a/changed", "a/new", "c", "e", "e/in"}; !slices.Equal(paths, want) {
		t.Fatalf("changed %v, want %v", paths, want)
	}
	if want := []string{"a/gone", "b"}; !slices.Equal(deleted, want) {
		t.Fatalf("deleted %v, want %v", deleted, want)
	}
}

// TestWalkAndTar: the walk and the tar of a tree agree with it, skip
// Spore's per-sandbox files, and hard links become links to the first.
func TestWalkAndTar(t *testing.T) {
	dir := t.TempDir()
	must := func(err error) {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
	}
	must(os.MkdirAll(filepath.Join(dir, "etc"), 0o755))
	must(os.MkdirAll(filepath.Join(dir, "tmp"), 0o1777))
	must(os.WriteFile(filepath.Join(dir, "etc", "hostname"), []byte("sandbox\n"), 0o644))
	must(os.WriteFile(filepath.Join(dir, "tmp", ".spore-tmp-on-disk"), []byte("x"), 0o644))
	must(os.WriteFile(filepath.Join(dir, "etc", "os"), []byte("hello"), 0o640))
	must(os.Link(filepath.Join(dir, "etc", "os"), filepath.Join(dir, "etc", "os2")))
	must(os.Symlink("os", filepath.Join(dir, "etc", "link")))
	var got []string
	must(Walk(dir, false, func(e Entry) error { got = append(got, e.Path+":"+string(e.Type)); return nil }))
	if want := []string{"etc:d", "etc/link:l", "etc/os:f", "etc/os2:f", "tmp:d"}; !slices.Equal(got, want) {
		t.Fatalf("walk %v, want %v", got, want)
	}
	root, err := os.OpenRoot(dir)
	must(err)
	defer root.Close()
	var buf bytes.Buffer
	tw := &TarWriter{Root: root, TW: tar.NewWriter(&buf)}
	for _, p := range []string{"etc", "etc/link", "etc/os", "etc/os2", "etc/missing"} {
		_, err := tw.Write(p)
		must(err)
	}
	must(tw.TW.Close())
	tr := tar.NewReader(&buf)
	var hdrs []string
	for {
		h, err := tr.Next()
		if err == io.EOF {
			break
		}
		must(err)
		b, _ := io.ReadAll(tr)
		hdrs = append(hdrs, h.Name+":"+string(h.Typeflag)+":"+h.Linkname+":"+string(b))
	}
	if want := []string{"etc/:5::", "etc/link:2:os:", "etc/os:0::hello", "etc/os2:1:etc/os:"}; !slices.Equal(hdrs, want) {
		t.Fatalf("tar %q, want %q", hdrs, want)
	}
	if _, err := tw.Write("../x"); err == nil {
		t.Fatal("wrote ../x")
	}
}

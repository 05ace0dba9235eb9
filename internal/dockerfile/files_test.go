package dockerfile

import (
	"archive/tar"
	"bytes"
	"compress/gzip"
	"context"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"reflect"
	"testing"
	"time"

	"github.com/spore-run/spore/internal/envd/copyin"
	"github.com/spore-run/spore/internal/errdefs"
)

func mustHash(t *testing.T, dir, src, dest string) string {
	t.Helper()
	h, err := HashFiles(dir, src, dest)
	if err != nil {
		t.Fatal(err)
	}
	return h
}

func TestHashFilesChanges(t *testing.T) {
	dir := writeTree(t, map[string]string{
		"app/main.py":   "print(1)\n",
		"app/lib/x.py":  "x = 1\n",
		"app/link":      "->main.py",
		"app/cache.pyc": "junk",
		"other.txt":     "unrelated",
		".dockerignore": "*/*.pyc\n",
	})
	base := mustHash(t, dir, "app", "/srv/")
	if again := mustHash(t, dir, "app", "/srv/"); again != base {
		t.Fatal("hash not deterministic")
	}
	unchanged := map[string]func(){
		"mtime":           func() { os.Chtimes(filepath.Join(dir, "app/main.py"), time.Unix(1, 0), time.Unix(1, 0)) },
		"unrelated file":  func() { os.WriteFile(filepath.Join(dir, "other.txt"), []byte("changed"), 0o600) },
		"ignored file":    func() { os.WriteFile(filepath.Join(dir, "app/cache.pyc"), []byte("changed junk"), 0o600) },
		"rewrite as same": func() { os.WriteFile(filepath.Join(dir, "app/main.py"), []byte("print(1)\n"), 0o644) },
	}
	for name, change := range unchanged {
		change()
		if h := mustHash(t, dir, "app", "/srv/"); h != base {
			t.Errorf("%s changed the hash", name)
		}
	}
	changed := []struct {
		name   string
		change func()
	}{
		{"content (same size)", func() { os.WriteFile(filepath.Join(dir, "app/main.py"), []byte("print(2)\n"), 0o644) }},
		{"mode", func() { os.Chmod(filepath.Join(dir, "app/main.py"), 0o755) }},
		{"symlink target", func() {
			os.Remove(filepath.Join(dir, "app/link"))
			os.Symlink("lib/x.py", filepath.Join(dir, "app/link"))
		}},
		{"new file", func() { os.WriteFile(filepath.Join(dir, "app/lib/y.py"), nil, 0o644) }},
		{"directory mode", func() { os.Chmod(filepath.Join(dir, "app/lib"), 0o700) }},
		{"rename", func() { os.Rename(filepath.Join(dir, "app/lib/y.py"), filepath.Join(dir, "app/lib/z.py")) }},
	}
	prev := base
	for _, c := range changed {
		c.change()
		h := mustHash(t, dir, "app", "/srv/")
		if h == prev {
			t.Errorf("%s did not change the hash", c.name)
		}
		prev = h
	}
	if mustHash(t, dir, "app", "/other/") == prev {
		t.Error("dest is not part of the hash")
	}
}

func TestFilesRefuseEscapes(t *testing.T) {
	outside := t.TempDir()
	os.WriteFile(filepath.Join(outside, "secret"), []byte("s"), 0o600)
	dir := writeTree(t, map[string]string{"a": "a", "out": "->" + outside, "rel": "->../"})
	for _, src := range []string{"../x", "/etc/passwd", "a/../../x", "out/secret", "rel/x"} {
		if _, err := HashFiles(dir, src, "/d"); !errdefs.IsInvalidArgument(err) {
			t.Errorf("HashFiles %q: %v, want invalid argument", src, err)
		}
		if err := TarFiles(io.Discard, dir, src, false); !errdefs.IsInvalidArgument(err) {
			t.Errorf("TarFiles %q: %v, want invalid argument", src, err)
		}
	}
	// A symlink leaving the context is archived as a symlink, not followed.
	entries := tarEntries(t, dir, "out", false)
	if want := []string{"out symlink " + outside}; !reflect.DeepEqual(entries, want) {
		t.Fatalf("got %q want %q", entries, want)
	}
}

func tarEntries(t *testing.T, dir, src string, gz bool) []string {
	t.Helper()
	var buf bytes.Buffer
	if err := TarFiles(&buf, dir, src, gz); err != nil {
		t.Fatal(err)
	}
	var r io.Reader = &buf
	if gz {
		zr, err := gzip.NewReader(&buf)
		if err != nil {
			t.Fatal(err)
		}
		r = zr
	}
	tr := tar.NewReader(r)
	var out []string
	for {
		h, err := tr.Next()
		if err == io.EOF {
			return out
		}
		if err != nil {
			t.Fatal(err)
		}
		switch h.Typeflag {
		case tar.TypeDir:
			out = append(out, fmt.Sprintf("%s dir %o", h.Name, h.Mode&0o7777))
		case tar.TypeSymlink:
			out = append(out, fmt.Sprintf("%s symlink %s", h.Name, h.Linkname))
		case tar.TypeReg:
			b, _ := io.ReadAll(tr)
			out = append(out, fmt.Sprintf("%s file %o %q uid=%d", h.Name, h.Mode&0o7777, b, h.Uid))
		default:
			t.Fatalf("unexpected entry %+v", h)
		}
	}
}

func TestTarFilesEntries(t *testing.T) {
	dir := writeTree(t, map[string]string{
		"src/a.txt":     "A",
		"src/sub/b.sh":  "B",
		"src/sub/l":     "->b.sh",
		"src/skip.log":  "no",
		"top.txt":       "T",
		".dockerignore": "**/*.log\n",
	})
	os.Chmod(filepath.Join(dir, "src/sub/b.sh"), 0o750)
	want := []string{
		"src/ dir 755",
		`src/a.txt file 644 "A" uid=0`,
		"src/sub/ dir 755",
		`src/sub/b.sh file 750 "B" uid=0`,
		"src/sub/l symlink b.sh",
	}
	for _, gz := range []bool{false, true} {
		if got := tarEntries(t, dir, "src", gz); !reflect.DeepEqual(got, want) {
			t.Errorf("gzip=%v:\n got %q\nwant %q", gz, got, want)
		}
	}
	if got := tarEntries(t, dir, "*.txt", false); !reflect.DeepEqual(got, []string{`top.txt file 644 "T" uid=0`}) {
		t.Errorf("glob: %q", got)
	}
	// "." is the whole context (minus .dockerignore'd files).
	files, err := ListFiles(dir, ".")
	if err != nil {
		t.Fatal(err)
	}
	if want := []string{".dockerignore", "src", "src/a.txt", "src/sub", "src/sub/b.sh", "src/sub/l", "top.txt"}; !reflect.DeepEqual(files, want) {
		t.Errorf("ListFiles(.) = %q", files)
	}
}

// What TarFiles writes, the daemon's copy mode unpacks with COPY's
// meaning: the two ends of a COPY step agree.
func TestTarFilesRoundTrip(t *testing.T) {
	dir := writeTree(t, map[string]string{
		"src/a.txt":    "A",
		"src/sub/b.sh": "B",
		"src/sub/l":    "->b.sh",
	})
	var buf bytes.Buffer
	if err := TarFiles(&buf, dir, "src", true); err != nil {
		t.Fatal(err)
	}
	arch := filepath.Join(t.TempDir(), "a.tar.gz")
	os.WriteFile(arch, buf.Bytes(), 0o600)
	root := t.TempDir()
	if err := copyin.Copy(context.Background(), copyin.Options{Root: root, Archive: arch, Src: "src", Dest: "/app"}); err != nil {
		t.Fatal(err)
	}
	for p, want := range map[string]string{"app/a.txt": "A", "app/sub/b.sh": "B", "app/sub/l": "B"} {
		if b, err := os.ReadFile(filepath.Join(root, p)); err != nil || string(b) != want {
			t.Errorf("%s: %q %v", p, b, err)
		}
	}
	if l, _ := os.Readlink(filepath.Join(root, "app/sub/l")); l != "b.sh" {
		t.Errorf("symlink: %q", l)
	}
}

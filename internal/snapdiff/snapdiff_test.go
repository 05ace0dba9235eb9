package snapdiff

import (
	"strings"
	"testing"
	"time"

	"github.com/spore-run/spore/internal/nodeapi"
)

func TestCompare(t *testing.T) {
	t0 := time.Unix(1000, 0)
	t1 := time.Unix(2000, 0)
	file := func(p string, size int64, mt time.Time) nodeapi.FileEntry {
		return nodeapi.FileEntry{Path: p, Type: nodeapi.FileRegular, Mode: 0o644, Size: size, Mtime: mt}
	}
	dir := func(p string, mt time.Time) nodeapi.FileEntry {
		return nodeapi.FileEntry{Path: p, Type: nodeapi.FileDir, Mode: 0o755, Mtime: mt}
	}
	from := []nodeapi.FileEntry{
		dir("/home", t0),
		file("/home/same", 3, t0),
		file("/home/grown", 3, t0),
		file("/home/touched", 3, t0),
		file("/home/gone", 3, t0),
		{Path: "/home/link", Type: nodeapi.FileSymlink, Mode: 0o777, Link: "same", Mtime: t0},
		file("/home/chmod", 3, t0),
		file("/home/becomes-dir", 3, t0),
		{Path: "/mnt/vol", Type: nodeapi.FileMount},
		{Path: "/run/sock", Type: nodeapi.FileSocket},
	}
	chmod := file("/home/chmod", 3, t0)
	chmod.Mode = 0o600
	to := []nodeapi.FileEntry{
		dir("/home", t1), // only its time: not a change
		file("/home/same", 3, t0),
		file("/home/grown", 9, t1),
		file("/home/touched", 3, t1),
		{Path: "/home/link", Type: nodeapi.FileSymlink, Mode: 0o777, Link: "grown", Mtime: t1},
		chmod,
		dir("/home/becomes-dir", t1),
		file("/home/new", 1, t1),
		{Path: "/run/sock2", Type: nodeapi.FileSocket},
	}
	got := Compare(from, to)
	want := []struct{ path, kind string }{
		{"/home/becomes-dir", Changed},
		{"/home/chmod", Changed},
		{"/home/gone", Removed},
		{"/home/grown", Changed},
		{"/home/link", Changed},
		{"/home/new", Added},
		{"/home/touched", Changed},
	}
	if len(got) != len(want) {
		t.Fatalf("changes = %+v, want %v", got, want)
	}
	for i, w := range want {
		if got[i].Path != w.path || got[i].Kind != w.kind {
			t.Fatalf("change %d = %s %s, want %s %s", i, got[i].Path, got[i].Kind, w.path, w.kind)
		}
		c := got[i]
		if (c.From == nil) != (c.Kind == Added) || (c.To == nil) != (c.Kind == Removed) {
			t.Fatalf("%s %s: from %v to %v", c.Path, c.Kind, c.From, c.To)
		}
	}
	if got[0].Readable() {
		t.Fatal("a file that became a directory is readable as text")
	}
	if !got[3].Readable() || !got[5].Readable() || !got[2].Readable() {
		t.Fatal("small regular files are not readable")
	}
	big := Change{Path: "/big", Kind: Changed, From: &nodeapi.FileEntry{Type: nodeapi.FileRegular, Size: MaxTextBytes + 1}, To: &nodeapi.FileEntry{Type: nodeapi.FileRegular, Size: 1}}
	if big.Readable() {
		t.Fatal("a file over MaxTextBytes is readable")
	}
}

func TestSetContent(t *testing.T) {
	e := &nodeapi.FileEntry{Type: nodeapi.FileRegular}
	c := Change{Path: "/etc/app.conf", Kind: Changed, From: e, To: e}
	c.SetContent([]byte("a\nb\nc\n"), []byte("a\nB\nc\nd\n"))
	for _, l := range []string{"--- a/etc/app.conf", "+++ b/etc/app.conf", "-b", "+B", "+d", " a"} {
		if !strings.Contains(c.Diff, l+"\n") {
			t.Fatalf("diff lacks %q:\n%s", l, c.Diff)
		}
	}
	if c.Binary {
		t.Fatal("text marked binary")
	}

	added := Change{Path: "/new.txt", Kind: Added, To: e}
	added.SetContent(nil, []byte("hello\n"))
	if !strings.Contains(added.Diff, "--- /dev/null\n") || !strings.Contains(added.Diff, "+hello\n") {
		t.Fatalf("added file's diff:\n%s", added.Diff)
	}
	removed := Change{Path: "/old.txt", Kind: Removed, From: e}
	removed.SetContent([]byte("bye\n"), nil)
	if !strings.Contains(removed.Diff, "+++ /dev/null\n") || !strings.Contains(removed.Diff, "-bye\n") {
		t.Fatalf("removed file's diff:\n%s", removed.Diff)
	}

	same := Change{Path: "/touched", Kind: Changed, From: e, To: e}
	same.SetContent([]byte("x\n"), []byte("x\n"))
	if same.Diff != "" || same.Binary {
		t.Fatalf("same content: %+v", same)
	}
	bin := Change{Path: "/bin.dat", Kind: Changed, From: e, To: e}
	bin.SetContent([]byte{0, 1, 2}, []byte{0, 1, 3})
	if bin.Diff != "" || !bin.Binary {
		t.Fatalf("binary content: %+v", bin)
	}
	utf := Change{Path: "/latin1", Kind: Changed, From: e, To: e}
	utf.SetContent([]byte("caf\xe9\n"), []byte("cafe\n"))
	if utf.Diff != "" || !utf.Binary {
		t.Fatalf("invalid UTF-8: %+v", utf)
	}
}

package nodetest

import (
	"bytes"
	"strings"
	"testing"

	"github.com/spore-run/spore/internal/errdefs"
	"github.com/spore-run/spore/internal/ids"
	"github.com/spore-run/spore/internal/nodeapi"
)

// testFiles: malformed requests are InvalidArgument on every node; a node
// without Images (one that cannot reach a sandbox's daemon) answers
// Conflict. With Images: FileTree lists what a command in the sandbox
// wrote, with its type, mode and size, a directory before its entries,
// and ReadFiles reads them back (a large file by its size only, a missing
// one marked); an unknown sandbox is NotFound, a paused one Conflict.
func testFiles(t *testing.T, s *suite) {
	ctx := s.ctx
	id := ids.New('i')
	for what, paths := range map[string][]string{
		"no paths":      nil,
		"relative path": {"etc/passwd"},
		"unclean path":  {"/etc/../etc/passwd"},
		"the root":      {"/"},
		"a path twice":  {"/a", "/a"},
		"too many":      make([]string, nodeapi.MaxReadFiles+1),
	} {
		_, err := s.n.ReadFiles(ctx, id, paths)
		wantKind(t, "read files with "+what, err, errdefs.ErrInvalidArgument)
	}
	_, err := s.n.FileTree(ctx, "Bad/ID")
	wantKind(t, "file tree of a malformed ID", err, errdefs.ErrInvalidArgument)
	if s.Images == nil {
		_, err := s.n.FileTree(ctx, id)
		wantKind(t, "file tree on a node that reads no files", err, errdefs.ErrConflict)
		_, err = s.n.ReadFiles(ctx, id, []string{"/etc/passwd"})
		wantKind(t, "read files on a node that reads no files", err, errdefs.ErrConflict)
		return
	}
	_, err = s.n.FileTree(ctx, id)
	wantKind(t, "file tree of an unknown sandbox", err, errdefs.ErrNotFound)

	sb := s.create(nodeapi.CreateRequest{Template: s.Template})
	if _, err := s.Images.Shell(ctx, sb, `mkdir -p /tmp/ft/sub && printf 'one\ntwo\n' > /tmp/ft/sub/a.txt && chmod 640 /tmp/ft/sub/a.txt &&
		head -c 100000 /dev/zero > /tmp/ft/big && : > /tmp/ft/empty && ln -s sub/a.txt /tmp/ft/link`); err != nil {
		t.Fatal(err)
	}
	tree, err := s.n.FileTree(ctx, sb.ID)
	if err != nil {
		t.Fatal(err)
	}
	at := map[string]int{}
	for i, e := range tree {
		at[e.Path] = i
	}
	want := map[string]nodeapi.FileEntry{
		"/tmp/ft/sub":       {Type: nodeapi.FileDir},
		"/tmp/ft/sub/a.txt": {Type: nodeapi.FileRegular, Mode: 0o640, Size: 8},
		"/tmp/ft/big":       {Type: nodeapi.FileRegular, Size: 100000},
		"/tmp/ft/link":      {Type: nodeapi.FileSymlink, Link: "sub/a.txt"},
	}
	for p, w := range want {
		i, ok := at[p]
		if !ok {
			t.Fatalf("file tree of %s (%d entries) lacks %s", sb.ID, len(tree), p)
		}
		e := tree[i]
		if e.Type != w.Type || e.Size != w.Size || e.Link != w.Link || (w.Mode != 0 && e.Mode != w.Mode) || e.Mtime.IsZero() {
			t.Fatalf("file tree: %s = %+v, want %+v", p, e, w)
		}
	}
	if at["/tmp/ft/sub"] > at["/tmp/ft/sub/a.txt"] {
		t.Fatalf("file tree lists /tmp/ft/sub/a.txt before its directory")
	}
	for _, e := range tree {
		if strings.HasPrefix(e.Path, "/proc/") || e.Path == "/etc/hosts" {
			t.Fatalf("file tree has %s, which is never listed", e.Path)
		}
	}

	files, err := s.n.ReadFiles(ctx, sb.ID, []string{"/tmp/ft/sub/a.txt", "/tmp/ft/big", "/tmp/ft/empty", "/tmp/ft/none", "/tmp/ft/sub"})
	if err != nil {
		t.Fatal(err)
	}
	if len(files) != 5 {
		t.Fatalf("read 5 files, got %d", len(files))
	}
	if f := files[0]; f.Path != "/tmp/ft/sub/a.txt" || !bytes.Equal(f.Data, []byte("one\ntwo\n")) || f.Size != 8 || f.Missing {
		t.Fatalf("a.txt = %+v", f)
	}
	if f := files[1]; f.Data != nil || f.Size != 100000 || f.Missing {
		t.Fatalf("a file over %d bytes = size %d, %d bytes of data, missing %v", nodeapi.MaxReadBytes, f.Size, len(f.Data), f.Missing)
	}
	if f := files[2]; f.Data == nil || len(f.Data) != 0 || f.Missing {
		t.Fatalf("an empty file = %+v", f)
	}
	if f := files[3]; !f.Missing || f.Path != "/tmp/ft/none" {
		t.Fatalf("a missing file = %+v", f)
	}
	if f := files[4]; !f.Missing {
		t.Fatalf("a directory read as a file = %+v", f)
	}

	if err := s.n.Pause(ctx, sb.ID); err != nil {
		t.Fatal(err)
	}
	_, err = s.n.FileTree(ctx, sb.ID)
	wantKind(t, "file tree of a paused sandbox", err, errdefs.ErrConflict)
}

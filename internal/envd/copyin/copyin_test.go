package copyin

import (
	"archive/tar"
	"bytes"
	"compress/gzip"
	"context"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"

	"github.com/spore-run/spore/internal/errdefs"
)

// ent is an archive entry: a name ending in / is a directory, link a
// symlink target, hard a hard link's target.
type ent struct {
	name, body, link, hard string
	mode                   int64
}

func writeArchive(t *testing.T, gz bool, ents ...ent) string {
	t.Helper()
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	for _, e := range ents {
		h := &tar.Header{Name: e.name, Mode: e.mode, Uid: 4242, Gid: 4242}
		switch {
		case strings.HasSuffix(e.name, "/"):
			h.Typeflag = tar.TypeDir
		case e.link != "":
			h.Typeflag, h.Linkname = tar.TypeSymlink, e.link
		case e.hard != "":
			h.Typeflag, h.Linkname = tar.TypeLink, e.hard
		default:
			h.Typeflag, h.Size = tar.TypeReg, int64(len(e.body))
		}
		if h.Mode == 0 {
			h.Mode = 0o644
			if h.Typeflag == tar.TypeDir {
				h.Mode = 0o755
			}
		}
		if err := tw.WriteHeader(h); err != nil {
			t.Fatal(err)
		}
		if h.Typeflag == tar.TypeReg {
			tw.Write([]byte(e.body))
		}
	}
	tw.Close()
	data := buf.Bytes()
	if gz {
		var z bytes.Buffer
		zw := gzip.NewWriter(&z)
		zw.Write(data)
		zw.Close()
		data = z.Bytes()
	}
	p := filepath.Join(t.TempDir(), "ctx.tar")
	if err := os.WriteFile(p, data, 0o600); err != nil {
		t.Fatal(err)
	}
	return p
}

// newRoot is a sandbox-like root: /etc/passwd and /etc/group with a user
// "app" (1001:1002), a merged-usr /bin -> usr/bin and an absolute
// symlink /opt/tools -> /usr/bin, which must resolve inside the root.
func newRoot(t *testing.T) string {
	t.Helper()
	root := t.TempDir()
	for _, d := range []string{"etc", "usr/bin", "opt", "srv"} {
		os.MkdirAll(filepath.Join(root, d), 0o755)
	}
	os.WriteFile(filepath.Join(root, "etc/passwd"), []byte("root:x:0:0:root:/root:/bin/sh\napp:x:1001:1002::/home/app:/bin/sh\n"), 0o644)
	os.WriteFile(filepath.Join(root, "etc/group"), []byte("root:x:0:\nappgrp:x:1002:\nstaff:x:50:\n"), 0o644)
	os.Symlink("usr/bin", filepath.Join(root, "bin"))
	os.Symlink("/usr/bin", filepath.Join(root, "opt/tools"))
	return root
}

type fileInfo struct {
	mode     os.FileMode
	uid, gid uint32
	body     string
}

func stat(t *testing.T, p string) fileInfo {
	t.Helper()
	fi, err := os.Lstat(p)
	if err != nil {
		t.Fatal(err)
	}
	st := fi.Sys().(*syscall.Stat_t)
	out := fileInfo{mode: fi.Mode(), uid: st.Uid, gid: st.Gid}
	if fi.Mode().IsRegular() {
		b, _ := os.ReadFile(p)
		out.body = string(b)
	}
	if fi.Mode()&os.ModeSymlink != 0 {
		out.body, _ = os.Readlink(p)
	}
	return out
}

func mustCopy(t *testing.T, o Options) {
	t.Helper()
	if err := Copy(context.Background(), o); err != nil {
		t.Fatal(err)
	}
}

func TestCopyDirectoryContents(t *testing.T) {
	root := newRoot(t)
	arch := writeArchive(t, true, // gzip: found by its magic bytes
		ent{name: "other.txt", body: "not copied"},
		ent{name: "src/", mode: 0o700},
		ent{name: "src/a.py", body: "A", mode: 0o600},
		ent{name: "src/pkg/", mode: 0o750},
		ent{name: "src/pkg/b.py", body: "B"},
		ent{name: "src/pkg/link", link: "b.py"},
		ent{name: "src/pkg/hard", hard: "src/pkg/b.py"},
	)
	mustCopy(t, Options{Root: root, Archive: arch, Src: "src", Dest: "app/new/", Workdir: "/srv", User: "app", Mode: "0755"})
	want := map[string]fileInfo{
		"srv/app":              {mode: os.ModeDir | 0o755, uid: 1001, gid: 1001}, // a parent it made
		"srv/app/new":          {mode: os.ModeDir | 0o700, uid: 1001, gid: 1001}, // the src dir's own mode
		"srv/app/new/a.py":     {mode: 0o755, uid: 1001, gid: 1001, body: "A"},
		"srv/app/new/pkg":      {mode: os.ModeDir | 0o750, uid: 1001, gid: 1001},
		"srv/app/new/pkg/b.py": {mode: 0o755, uid: 1001, gid: 1001, body: "B"},
		"srv/app/new/pkg/link": {mode: os.ModeSymlink | 0o777, uid: 1001, gid: 1001, body: "b.py"},
		"srv/app/new/pkg/hard": {mode: 0o755, uid: 1001, gid: 1001, body: "B"},
	}
	for p, w := range want {
		if got := stat(t, filepath.Join(root, p)); got != w {
			t.Errorf("%s: got %+v, want %+v", p, got, w)
		}
	}
	if _, err := os.Stat(filepath.Join(root, "srv/app/new/other.txt")); err == nil {
		t.Error("a path outside src was copied")
	}
	if got := stat(t, filepath.Join(root, "srv")); got.uid != 0 || got.mode != os.ModeDir|0o755 {
		t.Errorf("an existing parent was changed: %+v", got)
	}
	a, _ := os.Stat(filepath.Join(root, "srv/app/new/pkg/b.py"))
	b, _ := os.Stat(filepath.Join(root, "srv/app/new/pkg/hard"))
	if !os.SameFile(a, b) {
		t.Error("the hard link is not a hard link")
	}
}

func TestCopyFileDestinations(t *testing.T) {
	root := newRoot(t)
	arch := writeArchive(t, false,
		ent{name: "cfg/app.yaml", body: "a: 1", mode: 0o640},
		ent{name: "tool.sh", body: "#!/bin/sh", mode: 0o755},
		ent{name: "x.sh", body: "x", mode: 0o755},
		ent{name: "y.txt", body: "y"},
	)
	cases := []struct {
		o    Options
		path string
		want fileInfo
	}{
		// dest ending with /: dest/<base>, parents made.
		{Options{Src: "cfg/app.yaml", Dest: "/etc/app/"}, "etc/app/app.yaml", fileInfo{mode: 0o640, body: "a: 1"}},
		// dest an existing directory: dest/<base>.
		{Options{Src: "cfg/app.yaml", Dest: "/srv"}, "srv/app.yaml", fileInfo{mode: 0o640, body: "a: 1"}},
		// otherwise dest itself; user:group by names, then numbers.
		{Options{Src: "./cfg/app.yaml", Dest: "/etc/app.conf", User: "app:staff"}, "etc/app.conf", fileInfo{mode: 0o640, uid: 1001, gid: 50, body: "a: 1"}},
		{Options{Src: "tool.sh", Dest: "/srv/t", User: "7:8", Mode: "4755"}, "srv/t", fileInfo{mode: 0o755 | os.ModeSetuid, uid: 7, gid: 8, body: "#!/bin/sh"}},
		// the image's symlinks on the way are followed, inside the root.
		{Options{Src: "tool.sh", Dest: "/bin/"}, "usr/bin/tool.sh", fileInfo{mode: 0o755, body: "#!/bin/sh"}},
		{Options{Src: "tool.sh", Dest: "/opt/tools/t2"}, "usr/bin/t2", fileInfo{mode: 0o755, body: "#!/bin/sh"}},
		// a glob: each match into dest/.
		{Options{Src: "*.sh", Dest: "/srv/bin/"}, "srv/bin/x.sh", fileInfo{mode: 0o755, body: "x"}},
		{Options{Src: "*.sh", Dest: "/srv/bin/"}, "srv/bin/tool.sh", fileInfo{mode: 0o755, body: "#!/bin/sh"}},
		// "." is the whole archive.
		{Options{Src: ".", Dest: "/all"}, "all/cfg/app.yaml", fileInfo{mode: 0o640, body: "a: 1"}},
	}
	for _, c := range cases {
		c.o.Root, c.o.Archive = root, arch
		mustCopy(t, c.o)
		if got := stat(t, filepath.Join(root, c.path)); got != c.want {
			t.Errorf("%+v: %s got %+v, want %+v", c.o, c.path, got, c.want)
		}
	}
	// Copying again replaces files.
	mustCopy(t, Options{Root: root, Archive: arch, Src: "y.txt", Dest: "/srv/t"})
	if got := stat(t, filepath.Join(root, "srv/t")); got.body != "y" || got.uid != 0 {
		t.Errorf("replace: %+v", got)
	}
}

func TestCopyRefusals(t *testing.T) {
	for _, tc := range []struct {
		name string
		ents []ent
		o    Options
		want string
	}{
		{"absolute name", []ent{{name: "ok", body: "1"}, {name: "/etc/passwd", body: "x"}}, Options{Src: ".", Dest: "/d"}, "absolute name"},
		{"dotdot name", []ent{{name: "ok", body: "1"}, {name: "a/../../x", body: "x"}}, Options{Src: ".", Dest: "/d"}, "climbs out"},
		{"dotdot hard link", []ent{{name: "h", hard: "../x"}}, Options{Src: ".", Dest: "/d"}, "leaves the build context"},
		{"src escapes", []ent{{name: "a", body: "1"}}, Options{Src: "../a", Dest: "/d"}, "leaves the build context"},
		{"src missing", []ent{{name: "a", body: "1"}}, Options{Src: "b", Dest: "/d"}, "not in the archive"},
		{"unknown user", []ent{{name: "a", body: "1"}}, Options{Src: "a", Dest: "/d", User: "nobody2"}, "unknown user"},
		{"bad mode", []ent{{name: "a", body: "1"}}, Options{Src: "a", Dest: "/d", Mode: "9"}, "not octal"},
		{"glob to a file", []ent{{name: "a.sh", body: "1"}, {name: "b.sh", body: "2"}}, Options{Src: "*.sh", Dest: "/d"}, "must be a directory"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			root := newRoot(t)
			tc.o.Root, tc.o.Archive = root, writeArchive(t, false, tc.ents...)
			err := Copy(context.Background(), tc.o)
			if !errdefs.IsInvalidArgument(err) || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("got %v, want invalid argument containing %q", err, tc.want)
			}
			// Checked before anything is written.
			if _, err := os.Lstat(filepath.Join(root, "d")); err == nil {
				t.Error("something was written")
			}
		})
	}
}

// An archive that plants a symlink and then writes through it must not
// reach what the symlink points at, whatever alias it uses.
func TestCopyNeverWritesThroughPlantedSymlink(t *testing.T) {
	outside := t.TempDir()
	for _, tc := range []struct {
		name string
		ents []ent
	}{
		{"direct", []ent{{name: "d/", mode: 0o755}, {name: "d/link", link: outside}, {name: "d/link/evil", body: "pwned"}}},
		{"relative", []ent{{name: "d/link", link: "../../../../../../../../" + outside}, {name: "d/link/evil", body: "pwned"}}},
		{"via an alias", []ent{{name: "d/link", link: outside}, {name: "e", link: "d"}, {name: "e/link/evil", body: "pwned"}}},
		{"dir entry", []ent{{name: "d/link", link: outside}, {name: "d/link/sub/", mode: 0o755}}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			root := newRoot(t)
			err := Copy(context.Background(), Options{Root: root, Archive: writeArchive(t, false, tc.ents...), Src: ".", Dest: "/x/"})
			if !errdefs.IsInvalidArgument(err) || !strings.Contains(err.Error(), "symlink the archive created") {
				t.Fatalf("got %v", err)
			}
			if ents, _ := os.ReadDir(outside); len(ents) != 0 {
				t.Fatalf("wrote outside: %v", ents)
			}
		})
	}
	// Replacing a planted symlink by a file is fine: it is not followed.
	root := newRoot(t)
	mustCopy(t, Options{Root: root, Archive: writeArchive(t, false, ent{name: "l", link: outside}, ent{name: "l", body: "file"}), Src: ".", Dest: "/x/"})
	if got := stat(t, filepath.Join(root, "x/l")); got.body != "file" || !got.mode.IsRegular() {
		t.Fatalf("got %+v", got)
	}
	if ents, _ := os.ReadDir(outside); len(ents) != 0 {
		t.Fatalf("wrote outside: %v", ents)
	}
}

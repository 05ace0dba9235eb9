package oci

import (
	"archive/tar"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/google/go-containerregistry/pkg/compression"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/static"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
	"github.com/google/go-containerregistry/pkg/v1/types"
	"golang.org/x/sys/unix"

	"github.com/spore-run/spore/internal/errdefs"
)

// describe walks a tree and returns one line per path (the root excluded):
// type, mode (with setuid/setgid/sticky), owner, and content, link target
// or device numbers. Comparing it whole proves nothing extra exists.
func describe(t *testing.T, root string) map[string]string {
	t.Helper()
	out := map[string]string{}
	err := filepath.WalkDir(root, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(root, p)
		if rel == "." {
			return nil
		}
		var st unix.Stat_t
		if err := unix.Lstat(p, &st); err != nil {
			return err
		}
		own := fmt.Sprintf("%04o %d:%d", st.Mode&0o7777, st.Uid, st.Gid)
		switch st.Mode & unix.S_IFMT {
		case unix.S_IFDIR:
			out[rel] = "dir " + own
		case unix.S_IFREG:
			b, err := os.ReadFile(p)
			if err != nil {
				return err
			}
			out[rel] = "file " + own + " " + string(b)
		case unix.S_IFLNK:
			target, err := os.Readlink(p)
			if err != nil {
				return err
			}
			out[rel] = fmt.Sprintf("link %d:%d -> %s", st.Uid, st.Gid, target)
		case unix.S_IFCHR:
			out[rel] = fmt.Sprintf("char %s %d,%d", own, unix.Major(st.Rdev), unix.Minor(st.Rdev))
		case unix.S_IFBLK:
			out[rel] = fmt.Sprintf("block %s %d,%d", own, unix.Major(st.Rdev), unix.Minor(st.Rdev))
		case unix.S_IFIFO:
			out[rel] = "fifo " + own
		default:
			out[rel] = fmt.Sprintf("other %o", st.Mode)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return out
}

func diffTrees(t *testing.T, got, want map[string]string) {
	t.Helper()
	for _, k := range slices.Sorted(maps.Keys(want)) {
		if got[k] != want[k] {
			t.Errorf("%s: got %q, want %q", k, got[k], want[k])
		}
	}
	for _, k := range slices.Sorted(maps.Keys(got)) {
		if _, ok := want[k]; !ok {
			t.Errorf("%s: unexpected %q", k, got[k])
		}
	}
}

func mtime(t *testing.T, p string) time.Time {
	t.Helper()
	var st unix.Stat_t
	if err := unix.Lstat(p, &st); err != nil {
		t.Fatal(err)
	}
	return time.Unix(st.Mtim.Unix()).UTC()
}

// TestUnpackAppliesLayersLikeARuntime applies three layers covering every
// entry kind, whiteouts, an opaque directory, hard links across layers,
// replacements, a directory entry after its children, and symlinks in a
// lower layer pointing outside (absolute and ../..) written through later;
// then compares the whole tree with what a container runtime produces.
func TestUnpackAppliesLayersLikeARuntime(t *testing.T) {
	mustRoot(t)
	outside, err := os.MkdirTemp("", "oci-outside-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(outside) })

	l1 := layerOf(t,
		dir("./", 0o755),
		dir("etc/", 0o755),
		file("etc/passwd", "root:x:0:0", 0o644),
		dir("usr/", 0o755), dir("usr/bin/", 0o755),
		file("usr/bin/su", "su", 0o4755),
		file("usr/bin/wall", "wall", 0o2755).owner(0, 5),
		dir("tmp/", 0o1777),
		file("home/alice/notes", "secret", 0o600).owner(1000, 1001), // parents implicit
		symlink("bin", "usr/bin"),
		symlink("escape", outside),
		symlink("up", "../../../../../../../.."),
		dir("a/", 0o755), file("a/f1", "1", 0o644), file("a/f2", "2", 0o644),
		dir("d/", 0o755), dir("d/sub/", 0o755), file("d/sub/old", "old", 0o644), file("d/keep", "keep", 0o644),
		file("replace/file-to-dir", "f", 0o644),
		dir("replace/dir-to-file/", 0o755), file("replace/dir-to-file/x", "x", 0o644),
		symlink("replace/link-to-file", "/etc/passwd"),
		node(tar.TypeChar, "dev/null2", 0o666, 1, 3),
		node(tar.TypeBlock, "dev/loop9", 0o660, 7, 9).owner(0, 6),
		node(tar.TypeFifo, "run/fifo", 0o640, 0, 0).owner(3, 4),
		file("shared/orig", "same inode", 0o640).owner(1, 2),
	)
	l2 := layerOf(t,
		file("a/.wh.f1", "", 0),
		file("d/sub/new", "new", 0o644), // before the opaque marker: survives it
		file("d/.wh..wh..opq", "", 0),
		file("d/fresh", "fresh", 0o644),
		hardlink("shared/link1", "shared/orig"), // to a lower layer's file
		file("bin/via-symlink", "via", 0o755),
		file("escape/pwned", "pwned", 0o644),
		file("up/pwned2", "pwned2", 0o644),
		dir("replace/file-to-dir/", 0o750),
		file("replace/dir-to-file", "now a file", 0o600),
		file("replace/link-to-file", "not through", 0o644),
		file("late/child", "c", 0o644),
		dir("late/", 0o700).owner(7, 8).at(t2), // after its child
		file("shared/new", "n", 0o644),
		hardlink("shared/link2", "shared/new"), // to this layer's file
	)
	l3 := layerOf(t, file("shared/.wh.orig", "", 0))

	tree := t.TempDir()
	st, err := Unpack(context.Background(), imageOf(t, "linux/amd64", l1, l2, l3), tree, Limits{})
	if err != nil {
		t.Fatal(err)
	}
	if st.Layers != 3 || st.Entries != 43 {
		t.Fatalf("stats %+v", st)
	}

	want := map[string]string{
		"a": "dir 0755 0:0", "a/f2": "file 0644 0:0 2",
		"bin":   "link 0:0 -> usr/bin",
		"d":     "dir 0755 0:0",
		"d/sub": "dir 0755 0:0", "d/sub/new": "file 0644 0:0 new", "d/fresh": "file 0644 0:0 fresh",
		"dev": "dir 0755 0:0", "dev/null2": "char 0666 0:0 1,3", "dev/loop9": "block 0660 0:6 7,9",
		"escape": "link 0:0 -> " + outside,
		"etc":    "dir 0755 0:0", "etc/passwd": "file 0644 0:0 root:x:0:0",
		"home": "dir 0755 0:0", "home/alice": "dir 0755 0:0", "home/alice/notes": "file 0600 1000:1001 secret",
		"late": "dir 0700 7:8", "late/child": "file 0644 0:0 c",
		"pwned2":  "file 0644 0:0 pwned2",
		"replace": "dir 0755 0:0", "replace/file-to-dir": "dir 0750 0:0",
		"replace/dir-to-file":  "file 0600 0:0 now a file",
		"replace/link-to-file": "file 0644 0:0 not through",
		"run":                  "dir 0755 0:0", "run/fifo": "fifo 0640 3:4",
		"shared": "dir 0755 0:0", "shared/link1": "file 0640 1:2 same inode",
		"shared/new": "file 0644 0:0 n", "shared/link2": "file 0644 0:0 n",
		"tmp": "dir 1777 0:0",
		"up":  "link 0:0 -> ../../../../../../../..",
		"usr": "dir 0755 0:0", "usr/bin": "dir 0755 0:0",
		"usr/bin/su": "file 4755 0:0 su", "usr/bin/wall": "file 2755 0:5 wall",
		"usr/bin/via-symlink": "file 0755 0:0 via",
	}
	// The write through the absolute symlink lands inside, chroot-style.
	inside := strings.TrimPrefix(outside, "/")
	for p := filepath.Dir(inside); p != "."; p = filepath.Dir(p) {
		if _, ok := want[p]; !ok {
			want[p] = "dir 0755 0:0"
		}
	}
	want[inside] = "dir 0755 0:0"
	want[filepath.Join(inside, "pwned")] = "file 0644 0:0 pwned"
	diffTrees(t, describe(t, tree), want)

	if ents, _ := os.ReadDir(outside); len(ents) != 0 {
		t.Errorf("wrote outside the tree: %v", ents)
	}
	if b, _ := os.ReadFile("/etc/passwd"); string(b) == "not through" {
		t.Fatal("wrote through a symlink to the host's /etc/passwd")
	}
	var a, b unix.Stat_t
	unix.Lstat(filepath.Join(tree, "shared/link1"), &a)
	if a.Nlink != 1 {
		t.Errorf("shared/link1 has %d links after its twin was whited out, want 1", a.Nlink)
	}
	unix.Lstat(filepath.Join(tree, "shared/new"), &a)
	unix.Lstat(filepath.Join(tree, "shared/link2"), &b)
	if a.Ino != b.Ino || a.Nlink != 2 {
		t.Errorf("shared/link2 is not a hard link of shared/new: ino %d/%d nlink %d", a.Ino, b.Ino, a.Nlink)
	}
	for p, want := range map[string]time.Time{
		".": t1, "etc": t1, "d": t1, "late": t2, "usr/bin/su": t1, "bin": t1, "dev/null2": t1, "run/fifo": t1,
	} {
		if got := mtime(t, filepath.Join(tree, p)); !got.Equal(want) {
			t.Errorf("%s: mtime %v, want %v", p, got, want)
		}
	}
}

func TestUnpackRefusesEscapes(t *testing.T) {
	mustRoot(t)
	outside, err := os.MkdirTemp("", "oci-outside-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(outside) })
	secret := filepath.Join(outside, "secret")
	if err := os.WriteFile(secret, []byte("host"), 0o600); err != nil {
		t.Fatal(err)
	}
	ok := file("ok", "ok", 0o644)
	for _, c := range []struct {
		name string
		ents []ent
	}{
		{"absolute path", []ent{ok, file("/etc/evil", "x", 0o644)}},
		{"dot-dot", []ent{ok, file("../evil", "x", 0o644)}},
		{"dot-dot inside", []ent{ok, file("a/../../evil", "x", 0o644)}},
		{"dot-dot directory", []ent{ok, dir("..", 0o755)}},
		{"hard link dot-dot", []ent{ok, hardlink("x", "../evil")}},
		{"hard link absolute", []ent{ok, hardlink("x", secret)}},
		{"hard link through outward symlink", []ent{symlink("escape", outside), hardlink("stolen", "escape/secret")}},
		{"hard link to missing", []ent{ok, hardlink("x", "nope")}},
		{"whiteout of dot-dot", []ent{ok, file(".wh..", "", 0)}},
		{"symlink loop", []ent{symlink("loop", "loop"), file("loop/x", "x", 0o644)}},
		{"unknown entry type", []ent{{Header: tar.Header{Typeflag: 'Z', Name: "z"}}}},
	} {
		t.Run(c.name, func(t *testing.T) {
			tree := t.TempDir()
			_, err := Unpack(context.Background(), imageOf(t, "", layerOf(t, c.ents...)), tree, Limits{})
			t.Logf("%v", err)
			if !errdefs.IsInvalidArgument(err) {
				t.Fatalf("err %v, want ErrInvalidArgument", err)
			}
			ents, _ := os.ReadDir(outside)
			var st syscall.Stat_t
			syscall.Stat(secret, &st)
			if len(ents) != 1 || st.Nlink != 1 {
				t.Fatalf("outside changed: %v, secret nlink %d", ents, st.Nlink)
			}
			if _, err := os.Lstat(filepath.Join(filepath.Dir(tree), "evil")); err == nil {
				t.Fatal("evil written next to the tree")
			}
		})
	}
}

func TestUnpackLimits(t *testing.T) {
	mustRoot(t)
	img := imageOf(t, "",
		layerOf(t, file("a", strings.Repeat("a", 600), 0o644), file("b", "b", 0o644)),
		layerOf(t, file("c", strings.Repeat("c", 600), 0o644), file("d", "d", 0o644)))
	ctx := context.Background()
	if _, err := Unpack(ctx, img, t.TempDir(), Limits{MaxBytes: 1000}); !errors.Is(err, errdefs.ErrResourceLimit) {
		t.Fatalf("bytes over the limit: %v", err)
	}
	if _, err := Unpack(ctx, img, t.TempDir(), Limits{MaxEntries: 3}); !errors.Is(err, errdefs.ErrResourceLimit) {
		t.Fatalf("entries over the limit: %v", err)
	}
	st, err := Unpack(ctx, img, t.TempDir(), Limits{MaxBytes: 1202, MaxEntries: 4})
	if err != nil || st.Bytes != 1202 || st.Entries != 4 {
		t.Fatalf("at the limits: %+v %v", st, err)
	}
}

// TestUnpackCompressions: gzip, zstd and uncompressed layers make the same
// tree, each checked against its diffID.
func TestUnpackCompressions(t *testing.T) {
	mustRoot(t)
	ents := []ent{dir("etc/", 0o755), file("etc/hostname", "box", 0o644)}
	raw := tarBytes(t, ents...)
	opener := func() (io.ReadCloser, error) { return io.NopCloser(bytes.NewReader(raw)), nil }
	zst, err := tarball.LayerFromOpener(opener, tarball.WithCompression(compression.ZStd))
	if err != nil {
		t.Fatal(err)
	}
	for name, l := range map[string]v1.Layer{
		"gzip":         layerOf(t, ents...),
		"zstd":         zst,
		"uncompressed": static.NewLayer(raw, types.OCIUncompressedLayer),
	} {
		t.Run(name, func(t *testing.T) {
			tree := t.TempDir()
			if _, err := Unpack(context.Background(), imageOf(t, "", l), tree, Limits{}); err != nil {
				t.Fatal(err)
			}
			diffTrees(t, describe(t, tree), map[string]string{"etc": "dir 0755 0:0", "etc/hostname": "file 0644 0:0 box"})
		})
	}
}

// TestUnpackChecksDiffID: a layer whose content does not match the diffID
// in the configuration is ErrDataLoss (the registry cannot catch it: the
// blob matches its own digest).
func TestUnpackChecksDiffID(t *testing.T) {
	mustRoot(t)
	img := imageOf(t, "", layerOf(t, file("a", "a", 0o644)))
	cfg, _ := img.ConfigFile()
	cfg = cfg.DeepCopy()
	cfg.RootFS.DiffIDs[0] = v1.Hash{Algorithm: "sha256", Hex: strings.Repeat("1", 64)}
	lying, err := mutate.ConfigFile(img, cfg)
	if err != nil {
		t.Fatal(err)
	}
	_, err = Unpack(context.Background(), lying, t.TempDir(), Limits{})
	if !errdefs.IsDataLoss(err) {
		t.Fatalf("err %v, want ErrDataLoss", err)
	}
}

func TestUnpackCanceled(t *testing.T) {
	mustRoot(t)
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	img := imageOf(t, "", layerOf(t, file("a", "a", 0o644)))
	if _, err := Unpack(ctx, img, t.TempDir(), Limits{}); !errors.Is(err, context.Canceled) {
		t.Fatalf("err %v, want context.Canceled", err)
	}
}

package rootfs

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/spore-run/spore/internal/errdefs"
)

// imageTree writes a small image-like tree: an account file without
// "user", a setuid binary, a symlink, a hard link, a /tmp that is absent.
func imageTree(t *testing.T, root string) {
	t.Helper()
	must := func(err error) {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
	}
	must(os.MkdirAll(filepath.Join(root, "etc"), 0o755))
	must(os.MkdirAll(filepath.Join(root, "bin"), 0o755))
	must(os.MkdirAll(filepath.Join(root, "srv", "app"), 0o750))
	must(os.WriteFile(filepath.Join(root, "etc", "passwd"), []byte("root:x:0:0:root:/root:/bin/sh\napp:x:1000:1000::/srv/app:/bin/sh\n"), 0o644))
	must(os.WriteFile(filepath.Join(root, "etc", "group"), []byte("root:x:0:\napp:x:1000:\n"), 0o644))
	must(os.WriteFile(filepath.Join(root, "etc", "hosts"), []byte("10.9.9.9 image-host\n"), 0o644))
	must(os.Symlink("../run/resolv.conf", filepath.Join(root, "etc", "resolv.conf")))
	must(os.WriteFile(filepath.Join(root, "bin", "tool"), []byte("#!/bin/sh\n"), 0o755))
	must(os.Chmod(filepath.Join(root, "bin", "tool"), fs.ModeSetuid|0o755))
	must(os.Link(filepath.Join(root, "bin", "tool"), filepath.Join(root, "bin", "tool2")))
	must(os.Symlink("tool", filepath.Join(root, "bin", "alias")))
	must(os.Chown(filepath.Join(root, "srv", "app"), 1000, 1000))
	must(os.Chmod(filepath.Join(root, "srv", "app"), fs.ModeSetgid|0o750))
	old := time.Unix(1e9, 0)
	must(os.Chtimes(filepath.Join(root, "etc"), old, old))
	must(os.Chtimes(filepath.Join(root, "srv", "app"), old, old))
}

// treeDigest hashes every entry's path, type, mode, owner, size, mtime,
// link target and content under root.
func treeDigest(t *testing.T, root string) string {
	t.Helper()
	h := sha256.New()
	err := filepath.WalkDir(root, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		fi, err := d.Info()
		if err != nil {
			return err
		}
		st := fi.Sys().(*syscall.Stat_t)
		rel, _ := filepath.Rel(root, p)
		h.Write([]byte(rel + "\x00" + fi.Mode().String() + "\x00"))
		h.Write([]byte{byte(st.Uid), byte(st.Uid >> 8), byte(st.Gid), byte(st.Gid >> 8)})
		if rel != "." {
			h.Write([]byte(fi.ModTime().UTC().String()))
		}
		switch {
		case fi.Mode()&fs.ModeSymlink != 0:
			l, _ := os.Readlink(p)
			h.Write([]byte(l))
		case fi.Mode().IsRegular():
			b, _ := os.ReadFile(p)
			h.Write(b)
		}
		h.Write([]byte{0})
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return hex.EncodeToString(h.Sum(nil))
}

func TestRegisterImageSharesTreeAndIdentity(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Fatal("needs root (owners, setuid bits, hard links to them)")
	}
	ctx := context.Background()
	base := t.TempDir()
	tree := filepath.Join(base, "tree")
	imageTree(t, tree)
	before := treeDigest(t, tree)
	key := "sha256:" + strings.Repeat("ab", 32)

	dirA, dirB := filepath.Join(base, "nodeA"), filepath.Join(base, "nodeB")
	nameA, stA, created, err := RegisterImage(ctx, dirA, key, tree)
	if err != nil || !created {
		t.Fatalf("register: %v (created %v)", err, created)
	}
	if nameA != "img-abababababababab" || stA.ID != ImageID(key) || stA.Image != key {
		t.Fatalf("name %s stamp %+v", nameA, stA)
	}
	// A second registration is a no-op; another node gets the same identity
	// and a tree identical in every byte, mode, owner and mtime.
	if _, _, created, err := RegisterImage(ctx, dirA, key, tree); err != nil || created {
		t.Fatalf("second register: created %v, %v", created, err)
	}
	nameB, stB, _, err := RegisterImage(ctx, dirB, key, tree)
	if err != nil || nameB != nameA || stB.ID != stA.ID {
		t.Fatalf("node B: %s %+v %v", nameB, stB, err)
	}
	rootA, rootB := Path(dirA, nameA), Path(dirB, nameB)
	if a, b := treeDigest(t, rootA), treeDigest(t, rootB); a != b {
		out, _ := exec.Command("sh", "-c", "cd "+rootA+" && find . -printf '%p %M %U %G %T@ %s\\n' | sort > /tmp/a.txt; cd "+rootB+" && find . -printf '%p %M %U %G %T@ %s\\n' | sort > /tmp/b.txt; diff /tmp/a.txt /tmp/b.txt").CombinedOutput()
		t.Fatalf("the two nodes' trees differ: %s", out)
	}
	if got, err := Lookup(dirA, nameA); err != nil || got.ID != stA.ID {
		t.Fatalf("lookup: %+v %v", got, err)
	}

	// The shared tree did not change, and files are shared, not copied.
	if after := treeDigest(t, tree); after != before {
		t.Fatal("the shared tree was modified")
	}
	var src, dst syscall.Stat_t
	syscall.Stat(filepath.Join(tree, "bin", "tool"), &src)
	syscall.Stat(filepath.Join(rootA, "bin", "tool"), &dst)
	if src.Ino != dst.Ino || dst.Mode&syscall.S_ISUID == 0 {
		t.Fatalf("bin/tool: inode %d vs %d, mode %o", src.Ino, dst.Ino, dst.Mode)
	}
	fi, _ := os.Stat(filepath.Join(rootA, "srv", "app"))
	if fi.Mode() != fs.ModeDir|fs.ModeSetgid|0o750 || fi.ModTime().Unix() != 1e9 || fi.Sys().(*syscall.Stat_t).Uid != 1000 {
		t.Fatalf("srv/app: %v %v %d", fi.Mode(), fi.ModTime(), fi.Sys().(*syscall.Stat_t).Uid)
	}
	if fi, _ := os.Stat(filepath.Join(rootA, "etc")); fi.ModTime().Unix() != 1e9 {
		t.Fatalf("etc mtime changed: %v", fi.ModTime())
	}

	// Spore's additions.
	read := func(p string) string {
		b, err := os.ReadFile(filepath.Join(rootA, p))
		if err != nil {
			t.Fatal(err)
		}
		return string(b)
	}
	if s := read("etc/hosts"); !strings.Contains(s, "localhost") || strings.Contains(s, "image-host") {
		t.Fatalf("etc/hosts: %q", s)
	}
	if fi, err := os.Lstat(filepath.Join(rootA, "etc", "resolv.conf")); err != nil || !fi.Mode().IsRegular() {
		t.Fatalf("etc/resolv.conf is not Spore's file: %v %v", fi, err)
	}
	if s := read("etc/passwd"); !strings.Contains(s, "app:x:1000:1000:") || !strings.Contains(s, "\nuser:x:1001:1001::/home/user:/bin/sh\n") {
		t.Fatalf("etc/passwd: %q", s)
	}
	if s := read("etc/group"); !strings.Contains(s, "\nuser:x:1001:\n") {
		t.Fatalf("etc/group: %q", s)
	}
	for _, d := range []string{"proc", "dev", "sys", "tmp", "opt/spore", "home/user"} {
		if fi, err := os.Stat(filepath.Join(rootA, d)); err != nil || !fi.IsDir() {
			t.Fatalf("/%s: %v", d, err)
		}
	}
	if fi, _ := os.Stat(filepath.Join(rootA, "tmp")); fi.Mode() != fs.ModeDir|fs.ModeSticky|0o777 {
		t.Fatalf("tmp mode %v", fi.Mode())
	}
	if _, err := os.Stat(filepath.Join(rootA, TmpKeepFile)); err != nil {
		t.Fatal(err)
	}

	// Remove unregisters it.
	if err := Remove(dirA, nameA); err != nil {
		t.Fatal(err)
	}
	if _, err := Lookup(dirA, nameA); !errdefs.IsNotFound(err) {
		t.Fatalf("after remove: %v", err)
	}
	if _, err := os.Stat(filepath.Join(tree, "bin", "tool")); err != nil {
		t.Fatalf("remove reached the shared tree: %v", err)
	}
}

func TestRegisterImageNeverWritesOutside(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Fatal("needs root")
	}
	ctx := context.Background()
	base := t.TempDir()
	outside := filepath.Join(base, "outside")
	if err := os.MkdirAll(outside, 0o755); err != nil {
		t.Fatal(err)
	}
	tree := filepath.Join(base, "tree")
	os.MkdirAll(tree, 0o755)
	// etc is a link out of the tree (an absolute one, as images have).
	if err := os.Symlink(outside, filepath.Join(tree, "etc")); err != nil {
		t.Fatal(err)
	}
	dir := filepath.Join(base, "rootfs")
	key := "sha256:" + strings.Repeat("cd", 32)
	_, _, _, err := RegisterImage(ctx, dir, key, tree)
	if err == nil {
		t.Fatal("registered a tree whose /etc leaves it")
	}
	if ents, _ := os.ReadDir(outside); len(ents) != 0 {
		t.Fatalf("wrote outside the tree: %v", ents)
	}
	if ents, _ := filepath.Glob(filepath.Join(dir, "*")); len(ents) != 1 || !strings.HasSuffix(ents[0], ".lock") {
		t.Fatalf("left behind (only the lock file may stay): %v", ents)
	}
	if _, _, _, err := RegisterImage(ctx, dir, "sha256:nothex", tree); !errdefs.IsInvalidArgument(err) {
		t.Fatalf("bad key: %v", err)
	}
}

// Concurrent registrations of one image (two builds of templates from it)
// make it once; all get the same name and identity.
func TestRegisterImageConcurrent(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Fatal("needs root")
	}
	base := t.TempDir()
	tree := filepath.Join(base, "tree")
	imageTree(t, tree)
	dir := filepath.Join(base, "rootfs")
	key := "sha256:" + strings.Repeat("ef", 32)
	type res struct {
		name, id string
		created  bool
		err      error
	}
	out := make(chan res, 8)
	for range 8 {
		go func() {
			name, st, created, err := RegisterImage(context.Background(), dir, key, tree)
			out <- res{name, st.ID, created, err}
		}()
	}
	made := 0
	for range 8 {
		r := <-out
		if r.err != nil || r.name != ImageName(key) || r.id != ImageID(key) {
			t.Fatalf("%+v", r)
		}
		if r.created {
			made++
		}
	}
	if made != 1 {
		t.Fatalf("made %d times", made)
	}
	if ents, _ := filepath.Glob(filepath.Join(dir, ".build-*")); len(ents) != 0 {
		t.Fatalf("staging left: %v", ents)
	}
}

// BenchmarkRegisterImage: registering a tree of 20,000 files in 400
// directories (hard links, no data copied; Debian's base tree has ~12,500
// entries).
func BenchmarkRegisterImage(b *testing.B) {
	if os.Geteuid() != 0 {
		b.Fatal("needs root")
	}
	base := b.TempDir()
	tree := filepath.Join(base, "tree")
	for d := range 400 {
		dir := filepath.Join(tree, "d"+strconv.Itoa(d))
		if err := os.MkdirAll(dir, 0o755); err != nil {
			b.Fatal(err)
		}
		for f := range 50 {
			if err := os.WriteFile(filepath.Join(dir, strconv.Itoa(f)), []byte("x"), 0o644); err != nil {
				b.Fatal(err)
			}
		}
	}
	b.ResetTimer()
	for i := range b.N {
		key := fmt.Sprintf("sha256:%064x", i)
		if _, _, _, err := RegisterImage(context.Background(), filepath.Join(base, "rootfs"), key, tree); err != nil {
			b.Fatal(err)
		}
	}
	b.ReportMetric(20000, "files/op")
}

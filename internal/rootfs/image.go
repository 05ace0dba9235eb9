package rootfs

import (
	"bufio"
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/spore-run/spore/internal/atomicfs"
	"github.com/spore-run/spore/internal/errdefs"
)

// imageRevision is the revision of what addImageFiles adds to an image's
// tree. It is part of the identity: changing the additions changes it.
const imageRevision = 1

// ImageUser is the account Spore adds to an image that has none of that
// name: E2B's default user.
const ImageUser = "user"

// fixedTime is the mtime of everything Spore adds to an image's tree, so
// that two nodes registering the same image make byte- and
// metadata-identical trees (a checkpoint restores over either).
var fixedTime = time.Unix(946684800, 0) // 2000-01-01

// ImageName is the root filesystem name of the image tree with OCI chain
// ID key ("sha256:<hex>").
func ImageName(key string) string {
	return "img-" + imageHex(key)[:16]
}

// ImageID is the build identity of the root filesystem made from the
// image tree key. It is a function of the chain ID (and of the revision
// of Spore's additions) only, so every node that pulls the same layers
// gets the same identity and a snapshot taken over it restores there.
func ImageID(key string) string {
	h := sha256.Sum256([]byte("spore image rootfs\x00" + key + "\x00" + strconv.Itoa(imageRevision)))
	return "img-" + hex.EncodeToString(h[:16])
}

func imageHex(key string) string {
	hexPart, _ := strings.CutPrefix(key, "sha256:")
	return hexPart
}

// RegisterImage makes the unpacked image tree (an oci.Store tree with
// chain ID key) a named root filesystem in dir, ImageName(key), unless it
// is already there, and returns its name and stamp; created says whether
// this call made it.
//
// The shared tree is never modified: the root filesystem is a new
// directory tree whose files are hard links to the tree's (no file data
// is copied; tree must be on dir's filesystem, e.g. in dir/.oci), with
// Spore's additions written as new files beside them (see
// addImageFiles). Hard-linked files are safe to share because a root
// filesystem is only ever the read-only lower layer of a sandbox's
// overlay. The stamp is written last: a crash leaves no name behind.
func RegisterImage(ctx context.Context, dir, key, tree string) (name string, st Stamp, created bool, err error) {
	if h := imageHex(key); len(h) != 64 || strings.Trim(h, "0123456789abcdef") != "" || !strings.HasPrefix(key, "sha256:") {
		return "", Stamp{}, false, errdefs.Invalidf("image key %q is not a sha256 chain ID", key)
	}
	name, id := ImageName(key), ImageID(key)
	if s, err := Lookup(dir, name); err == nil && s.ID == id {
		return name, s, false, nil
	}
	unlock, err := lockName(ctx, dir, name)
	if err != nil {
		return "", Stamp{}, false, err
	}
	defer unlock()
	if s, err := Lookup(dir, name); err == nil && s.ID == id {
		return name, s, false, nil
	}
	staging := filepath.Join(dir, ".build-"+name)
	if err := os.RemoveAll(staging); err != nil {
		return "", Stamp{}, false, fmt.Errorf("%w: %v", errdefs.ErrInternal, err)
	}
	ok := false
	defer func() {
		if !ok {
			os.RemoveAll(staging)
		}
	}()
	if err := linkTree(ctx, tree, staging); err != nil {
		return "", Stamp{}, false, fmt.Errorf("root filesystem %s from %s: %w", name, key, err)
	}
	// A build of another revision of Spore's additions is kept while
	// its snapshots need it (keep.go); a directory without a stamp is a
	// crashed registration's.
	st = Stamp{ID: id, Image: key, Revision: imageRevision, Built: time.Now().UTC()}
	if err := Install(ctx, dir, name, staging, st); err != nil {
		return "", Stamp{}, false, err
	}
	ok = true
	return name, st, true, nil
}

// Remove unregisters the named root filesystem: its stamp first (the name
// is gone from then on), then its tree.
func Remove(dir, name string) error {
	if err := os.Remove(stampPath(dir, name)); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return err
	}
	return os.RemoveAll(Path(dir, name))
}

// lockName serializes the registrations of one name (processes and
// goroutines) with a flock on dir/.<name>.lock.
func lockName(ctx context.Context, dir, name string) (func(), error) {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, fmt.Errorf("%w: %v", errdefs.ErrInternal, err)
	}
	return atomicfs.Lock(ctx, filepath.Join(dir, "."+name+".lock"))
}

// linkTree recreates src at dst: directories and symbolic links anew
// (same mode, owner, mtime), every other entry as a hard link to src's.
// Then Spore's additions, then the directories' metadata (after their
// last entry was added, so their mtimes stay src's).
func linkTree(ctx context.Context, src, dst string) error {
	type dirMeta struct {
		rel string
		fi  fs.FileInfo
	}
	var dirs []dirMeta
	err := filepath.WalkDir(src, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if err := ctx.Err(); err != nil {
			return err
		}
		rel, _ := filepath.Rel(src, p)
		target := filepath.Join(dst, rel)
		fi, err := d.Info()
		if err != nil {
			return err
		}
		switch {
		case fi.IsDir():
			dirs = append(dirs, dirMeta{rel, fi})
			return os.Mkdir(target, 0o700)
		case fi.Mode()&fs.ModeSymlink != 0:
			link, err := os.Readlink(p)
			if err != nil {
				return err
			}
			if err := os.Symlink(link, target); err != nil {
				return err
			}
			sys := fi.Sys().(*syscall.Stat_t)
			if err := os.Lchown(target, int(sys.Uid), int(sys.Gid)); err != nil {
				return err
			}
			ts := []unix.Timespec{unix.NsecToTimespec(fi.ModTime().UnixNano()), unix.NsecToTimespec(fi.ModTime().UnixNano())}
			return unix.UtimesNanoAt(unix.AT_FDCWD, target, ts, unix.AT_SYMLINK_NOFOLLOW)
		default:
			return os.Link(p, target)
		}
	})
	if err != nil {
		return err
	}
	if err := addImageFiles(dst); err != nil {
		return fmt.Errorf("add Spore's files: %w", err)
	}
	for _, d := range slices.Backward(dirs) {
		target := filepath.Join(dst, d.rel)
		sys := d.fi.Sys().(*syscall.Stat_t)
		if err := os.Lchown(target, int(sys.Uid), int(sys.Gid)); err != nil {
			return err
		}
		// Chmod after chown: chown clears setgid.
		if err := os.Chmod(target, d.fi.Mode()&(fs.ModePerm|fs.ModeSetuid|fs.ModeSetgid|fs.ModeSticky)); err != nil {
			return err
		}
		if err := os.Chtimes(target, d.fi.ModTime(), d.fi.ModTime()); err != nil {
			return err
		}
	}
	return nil
}

// addImageFiles adds what a sandbox needs and an arbitrary image may lack,
// always as new files (an entry is removed before it is written, so no
// write ever goes through a hard link into the shared tree, nor through a
// symbolic link: every path is resolved inside an os.Root, which refuses
// links that leave the tree):
//   - the mount points /proc, /dev, /sys, /tmp, /opt/spore (the daemon's
//     directory is bound there);
//   - /etc/hosts, /etc/hostname, /etc/resolv.conf (the sandbox's own, as
//     in every root filesystem: see etcFiles), and the file that keeps
//     /tmp on disk;
//   - the account "user" (E2B's default user) with a home, unless the
//     image has one of that name; root when the image has no /etc/passwd.
//
// Everything added is a function of the tree only (and its mtime is
// fixedTime), so every node makes the same root filesystem.
func addImageFiles(root string) error {
	r, err := os.OpenRoot(root)
	if err != nil {
		return err
	}
	defer r.Close()
	var made []string
	// mkdir makes p and its missing parents (0755, the last one mode),
	// recording each for its mtime.
	mkdir := func(p string, mode fs.FileMode) error {
		parts := strings.Split(p, "/")
		for i := range parts {
			sub := strings.Join(parts[:i+1], "/")
			if _, err := r.Stat(sub); err == nil {
				continue
			}
			m := fs.FileMode(0o755)
			if i == len(parts)-1 {
				m = mode
			}
			if err := r.Mkdir(sub, 0o700); err != nil {
				return err
			}
			made = append(made, sub)
			if err := r.Chmod(sub, m); err != nil {
				return err
			}
		}
		return nil
	}
	for _, d := range []struct {
		p    string
		mode fs.FileMode
	}{{"proc", 0o555}, {"dev", 0o755}, {"sys", 0o555}, {"tmp", 0o777 | fs.ModeSticky}, {"etc", 0o755}, {"opt/spore", 0o755}, {"home", 0o755}} {
		if err := mkdir(d.p, d.mode); err != nil {
			return fmt.Errorf("mount point /%s: %w", d.p, err)
		}
	}
	write := func(p string, data []byte, mode fs.FileMode) error {
		if err := r.Remove(p); err != nil && !errors.Is(err, fs.ErrNotExist) {
			return err
		}
		if err := r.WriteFile(p, data, mode); err != nil {
			return err
		}
		if err := r.Lchown(p, 0, 0); err != nil {
			return err
		}
		if err := r.Chmod(p, mode); err != nil {
			return err
		}
		return r.Chtimes(p, fixedTime, fixedTime)
	}
	for p, content := range etcFiles() {
		if err := write(p, []byte(content), 0o644); err != nil {
			return fmt.Errorf("/%s: %w", p, err)
		}
	}
	passwd, err := r.ReadFile("etc/passwd")
	if err != nil && !errors.Is(err, fs.ErrNotExist) {
		return err
	}
	group, err := r.ReadFile("etc/group")
	if err != nil && !errors.Is(err, fs.ErrNotExist) {
		return err
	}
	if len(passwd) == 0 {
		passwd = []byte("root:x:0:0:root:/root:/bin/sh\n")
		if err := mkdir("root", 0o700); err != nil {
			return err
		}
	}
	if len(group) == 0 {
		group = []byte("root:x:0:\n")
	}
	if _, ok := passwdEntry(passwd, ImageUser); !ok {
		uid := freeID(passwd, 2, 1000)
		gid := uid
		if _, taken := idsOf(group, 2)[gid]; taken {
			gid = freeID(group, 2, uid)
		}
		home := "home/" + ImageUser
		passwd = appendLine(passwd, fmt.Sprintf("%s:x:%d:%d::/%s:/bin/sh", ImageUser, uid, gid, home))
		if _, ok := passwdEntry(group, ImageUser); !ok {
			group = appendLine(group, fmt.Sprintf("%s:x:%d:", ImageUser, gid))
		}
		if err := mkdir(home, 0o755); err != nil {
			return err
		}
		if err := r.Lchown(home, uid, gid); err != nil {
			return err
		}
	}
	if err := write("etc/passwd", passwd, 0o644); err != nil {
		return err
	}
	if err := write("etc/group", group, 0o644); err != nil {
		return err
	}
	// Directories Spore made get the fixed time too (those of the image get
	// theirs back in linkTree).
	for _, p := range made {
		if err := r.Chtimes(p, fixedTime, fixedTime); err != nil {
			return err
		}
	}
	return nil
}

func appendLine(b []byte, line string) []byte {
	out := append([]byte(nil), b...)
	if len(out) > 0 && out[len(out)-1] != '\n' {
		out = append(out, '\n')
	}
	return append(out, line+"\n"...)
}

// passwdEntry returns the fields of name's line in a passwd or group file.
func passwdEntry(b []byte, name string) ([]string, bool) {
	sc := bufio.NewScanner(bytes.NewReader(b))
	for sc.Scan() {
		f := strings.Split(sc.Text(), ":")
		if len(f) >= 3 && f[0] == name {
			return f, true
		}
	}
	return nil, false
}

// idsOf returns the numeric ids in column col of a passwd or group file.
func idsOf(b []byte, col int) map[int]bool {
	out := map[int]bool{}
	sc := bufio.NewScanner(bytes.NewReader(b))
	for sc.Scan() {
		f := strings.Split(sc.Text(), ":")
		if len(f) > col {
			if n, err := strconv.Atoi(f[col]); err == nil {
				out[n] = true
			}
		}
	}
	return out
}

func freeID(b []byte, col, from int) int {
	used := idsOf(b, col)
	for id := from; ; id++ {
		if !used[id] {
			return id
		}
	}
}

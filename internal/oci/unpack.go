package oci

import (
	"archive/tar"
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path"
	"strings"
	"syscall"
	"time"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	"golang.org/x/sys/unix"

	"github.com/spore-run/spore/internal/errdefs"
)

// Limits bound what one Unpack may write, so a hostile image cannot fill
// the disk. Zero fields take the defaults.
type Limits struct {
	// MaxBytes bounds the file data of all layers together (bytes later
	// deleted by a whiteout still count). Default DefaultMaxBytes.
	MaxBytes int64
	// MaxEntries bounds the tar entries of all layers together, whiteouts
	// included. Default DefaultMaxEntries.
	MaxEntries int64
}

// The default limits: well above any real template image (a full Debian
// with build tools is ~2 GiB and ~100,000 entries), well below a disk.
const (
	DefaultMaxBytes   = 32 << 30
	DefaultMaxEntries = 2 << 20
)

func (l Limits) withDefaults() Limits {
	if l.MaxBytes <= 0 {
		l.MaxBytes = DefaultMaxBytes
	}
	if l.MaxEntries <= 0 {
		l.MaxEntries = DefaultMaxEntries
	}
	return l
}

// Stats say what Unpack did.
type Stats struct {
	Layers  int   `json:"layers"`
	Entries int64 `json:"entries"` // tar entries applied, whiteouts included
	Bytes   int64 `json:"bytes"`   // regular-file data written
}

// Unpack applies img's layers in order into dir, which must exist (it is
// normally empty: a layer lands on whatever is there). See the package doc
// for the semantics. On error dir holds a partial tree: callers that need
// all-or-nothing unpack into a staging directory, as Store does.
func Unpack(ctx context.Context, img v1.Image, dir string, lim Limits) (Stats, error) {
	root, err := os.OpenRoot(dir)
	if err != nil {
		return Stats{}, fmt.Errorf("%w: unpack into %s: %v", errdefs.ErrInternal, dir, err)
	}
	defer root.Close()
	layers, err := img.Layers()
	if err != nil {
		return Stats{}, classify(ctx, "image", err)
	}
	cfg, err := img.ConfigFile()
	if err != nil {
		return Stats{}, classify(ctx, "image", err)
	}
	if len(cfg.RootFS.DiffIDs) != len(layers) {
		return Stats{}, errdefs.Invalidf("image has %d layers but its configuration lists %d diffIDs",
			len(layers), len(cfg.RootFS.DiffIDs))
	}
	u := &unpacker{
		ctx:      ctx,
		root:     root,
		lim:      lim.withDefaults(),
		dirTimes: map[string]time.Time{},
		dirs:     map[string]bool{},
		buf:      make([]byte, 1<<20),
		pbuf:     make([]byte, 1<<20),
	}
	defer u.closeDir()
	for i, l := range layers {
		if err := u.layer(i, l, cfg.RootFS.DiffIDs[i]); err != nil {
			return u.st, err
		}
		u.st.Layers++
	}
	return u.st, u.applyDirTimes()
}

type unpacker struct {
	ctx  context.Context
	root *os.Root
	lim  Limits
	st   Stats
	buf  []byte // the consumer's copy buffer
	pbuf []byte // the producer's
	// dirTimes: the mtime of every directory entry, applied after the last
	// layer because creating children changes a directory's mtime.
	dirTimes map[string]time.Time
	// written: physical paths this layer wrote; whiteouts and opaque
	// markers apply to lower layers only.
	written map[string]bool
	// dirs caches physical paths known to be real directories, so that
	// resolving a path costs one Lstat per new directory, not per entry.
	// Cleared on every removal.
	dirs map[string]bool
	// The last parent directory opened (entries come grouped by directory).
	dirPath string
	dirFile *os.File
}

const whiteoutPrefix = ".wh."

// entry applies one tar entry.
func (u *unpacker) entry(hdr *tar.Header, data io.Reader) error {
	if err := u.ctx.Err(); err != nil {
		return err
	}
	u.st.Entries++
	if u.st.Entries > u.lim.MaxEntries {
		return fmt.Errorf("%w: more than %d entries", errdefs.ErrResourceLimit, u.lim.MaxEntries)
	}
	if hdr.Typeflag == tar.TypeXGlobalHeader {
		return nil
	}
	parts, err := cleanName(hdr.Name)
	if err != nil {
		return err
	}
	if len(parts) == 0 { // "./": the root itself
		if hdr.Typeflag != tar.TypeDir {
			return errdefs.Invalidf("the root must be a directory")
		}
		return u.rootDir(hdr)
	}
	dirName, base := strings.Join(parts[:len(parts)-1], "/"), parts[len(parts)-1]
	if strings.HasPrefix(base, whiteoutPrefix) {
		return u.whiteout(dirName, base)
	}
	phys, err := u.resolveDir(dirName, true)
	if err != nil {
		return err
	}
	dir, err := u.openDir(phys)
	if err != nil {
		return err
	}
	fd := int(dir.Fd())
	target := path.Join(phys, base)
	switch hdr.Typeflag {
	case tar.TypeDir:
		err = u.mkdir(fd, target, base, hdr)
	case tar.TypeReg: // the tar reader turns the old TypeRegA into TypeReg
		err = u.regular(fd, target, base, hdr, data)
	case tar.TypeSymlink:
		if err = u.replace(fd, target, base); err == nil {
			err = unix.Symlinkat(hdr.Linkname, fd, base)
		}
		if err == nil {
			err = u.attrs(fd, base, hdr, false)
		}
	case tar.TypeLink:
		err = u.hardlink(fd, target, base, hdr)
	case tar.TypeChar, tar.TypeBlock, tar.TypeFifo:
		err = u.node(fd, target, base, hdr)
	default:
		return errdefs.Invalidf("unsupported tar entry type %q", hdr.Typeflag)
	}
	if err != nil {
		return u.fsError(err)
	}
	u.markWritten(target)
	return nil
}

// markWritten records target and its ancestors as written by this layer:
// an opaque marker keeps a lower directory this layer writes into (and
// empties it of everything else).
func (u *unpacker) markWritten(target string) {
	for p := target; p != "." && p != "" && !u.written[p]; p = path.Dir(p) {
		u.written[p] = true
	}
}

// fsError gives a file-system error its kind: our own verdicts keep theirs,
// a full disk is a resource limit, the rest is the tree's fault as far as
// the caller can tell (an entry that cannot be applied).
func (u *unpacker) fsError(err error) error {
	switch {
	case err == nil:
		return nil
	case errors.As(err, new(*readError)):
		return err // consume reports it as a stream failure
	case errors.Is(err, errdefs.ErrInvalidArgument), errors.Is(err, errdefs.ErrResourceLimit),
		errors.Is(err, errdefs.ErrNotFound), errors.Is(err, errdefs.ErrInternal),
		errors.Is(err, context.Canceled), errors.Is(err, context.DeadlineExceeded):
		return err
	case errors.Is(err, syscall.ENOSPC), errors.Is(err, syscall.EDQUOT):
		return fmt.Errorf("%w: %v", errdefs.ErrResourceLimit, err)
	case errors.Is(err, syscall.EPERM):
		return fmt.Errorf("%w: %v (unpacking needs root)", errdefs.ErrInternal, err)
	default:
		return fmt.Errorf("%w: %v", errdefs.ErrInvalidArgument, err)
	}
}

// cleanName splits an entry name into components, refusing absolute names
// and any "..": real images never need them and lexical cleaning of ".."
// next to a symlink does not mean what it seems.
func cleanName(name string) ([]string, error) {
	if strings.HasPrefix(name, "/") {
		return nil, errdefs.Invalidf("absolute path %q", name)
	}
	var parts []string
	for _, c := range strings.Split(name, "/") {
		switch c {
		case "", ".":
		case "..":
			return nil, errdefs.Invalidf("path %q contains ..", name)
		default:
			parts = append(parts, c)
		}
	}
	return parts, nil
}

// maxSymlinkHops is the kernel's limit (MAXSYMLINKS).
const maxSymlinkHops = 40

// resolveDir returns the physical path (relative to the root, "" for the
// root, no symlinks in it) of directory name, resolving symlinks the way a
// chroot at the tree's root would. Missing directories are created (0755,
// root-owned, like container runtimes do) when create is set, else the
// result is an fs.ErrNotExist error.
func (u *unpacker) resolveDir(name string, create bool) (string, error) {
	pending := strings.Split(name, "/")
	var cur []string
	hops := 0
	for len(pending) > 0 {
		c := pending[0]
		pending = pending[1:]
		switch c {
		case "", ".":
			continue
		case "..":
			if len(cur) > 0 {
				cur = cur[:len(cur)-1]
			}
			continue
		}
		next := path.Join(append(cur, c)...)
		if u.dirs[next] {
			cur = append(cur, c)
			continue
		}
		fi, err := u.root.Lstat(next)
		switch {
		case errors.Is(err, fs.ErrNotExist) && create:
			if err := u.root.Mkdir(next, 0o755); err != nil {
				return "", err
			}
			u.dirs[next] = true
			cur = append(cur, c)
		case err != nil:
			return "", err
		case fi.Mode()&fs.ModeSymlink != 0:
			if hops++; hops > maxSymlinkHops {
				return "", errdefs.Invalidf("%s: too many levels of symbolic links", name)
			}
			target, err := u.root.Readlink(next)
			if err != nil {
				return "", err
			}
			if strings.HasPrefix(target, "/") {
				cur = cur[:0]
			}
			pending = append(strings.Split(target, "/"), pending...)
		case fi.IsDir():
			u.dirs[next] = true
			cur = append(cur, c)
		default:
			return "", fmt.Errorf("%s: %w", next, syscall.ENOTDIR)
		}
	}
	return path.Join(cur...), nil
}

// openDir returns a descriptor of the physical directory phys, opened
// through the os.Root (so it is inside the tree whatever happens).
func (u *unpacker) openDir(phys string) (*os.File, error) {
	if u.dirFile != nil && u.dirPath == phys {
		return u.dirFile, nil
	}
	u.closeDir()
	name := phys
	if name == "" {
		name = "."
	}
	f, err := u.root.OpenFile(name, os.O_RDONLY|syscall.O_DIRECTORY|syscall.O_NOFOLLOW, 0)
	if err != nil {
		return nil, err
	}
	u.dirPath, u.dirFile = phys, f
	return f, nil
}

func (u *unpacker) closeDir() {
	if u.dirFile != nil {
		u.dirFile.Close()
		u.dirFile = nil
	}
}

// forget drops the caches after a removal: a cached directory may be gone.
func (u *unpacker) forget() {
	clear(u.dirs)
	u.closeDir()
}

// replace removes whatever is at base (a directory with its content)
// so a new entry of another kind can take its place.
func (u *unpacker) replace(fd int, target, base string) error {
	var st unix.Stat_t
	err := unix.Fstatat(fd, base, &st, unix.AT_SYMLINK_NOFOLLOW)
	switch {
	case errors.Is(err, unix.ENOENT):
		return nil
	case err != nil:
		return err
	case st.Mode&unix.S_IFMT == unix.S_IFDIR:
		// fd (the parent) stays valid; cached paths below target do not.
		clear(u.dirs)
		return u.root.RemoveAll(target)
	default:
		return unix.Unlinkat(fd, base, 0)
	}
}

func (u *unpacker) mkdir(fd int, target, base string, hdr *tar.Header) error {
	var st unix.Stat_t
	err := unix.Fstatat(fd, base, &st, unix.AT_SYMLINK_NOFOLLOW)
	switch {
	case err == nil && st.Mode&unix.S_IFMT == unix.S_IFDIR:
		// Directories merge with what lower layers (or earlier children of
		// this layer) put there.
	case err == nil:
		if err := unix.Unlinkat(fd, base, 0); err != nil {
			return err
		}
		fallthrough
	case errors.Is(err, unix.ENOENT):
		if err := unix.Mkdirat(fd, base, 0o700); err != nil {
			return err
		}
	default:
		return err
	}
	u.dirs[target] = true
	if err := unix.Fchownat(fd, base, hdr.Uid, hdr.Gid, unix.AT_SYMLINK_NOFOLLOW); err != nil {
		return err
	}
	if err := unix.Fchmodat(fd, base, uint32(hdr.Mode&0o7777), 0); err != nil {
		return err
	}
	u.dirTimes[target] = hdr.ModTime
	return nil
}

func (u *unpacker) rootDir(hdr *tar.Header) error {
	f, err := u.root.Open(".")
	if err != nil {
		return err
	}
	defer f.Close()
	if err := f.Chown(hdr.Uid, hdr.Gid); err != nil {
		return u.fsError(err)
	}
	if err := unix.Fchmod(int(f.Fd()), uint32(hdr.Mode&0o7777)); err != nil {
		return u.fsError(err)
	}
	u.dirTimes[""] = hdr.ModTime
	return nil
}

func (u *unpacker) regular(fd int, target, base string, hdr *tar.Header, data io.Reader) error {
	if hdr.Size < 0 || u.st.Bytes+hdr.Size > u.lim.MaxBytes {
		return fmt.Errorf("%w: file data over %d bytes", errdefs.ErrResourceLimit, u.lim.MaxBytes)
	}
	if err := u.replace(fd, target, base); err != nil {
		return err
	}
	nfd, err := unix.Openat(fd, base, unix.O_WRONLY|unix.O_CREAT|unix.O_EXCL|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0o600)
	if err != nil {
		return err
	}
	f := os.NewFile(uintptr(nfd), base)
	defer f.Close()
	src := &recordingReader{r: io.LimitReader(data, hdr.Size)}
	n, err := io.CopyBuffer(onlyWriter{f}, src, u.buf)
	u.st.Bytes += n
	if src.err != nil {
		return &readError{src.err} // the stream broke, not the file
	}
	if err != nil {
		return err
	}
	if n != hdr.Size {
		return fmt.Errorf("%w: %d of %d bytes", io.ErrUnexpectedEOF, n, hdr.Size)
	}
	// Owner before mode: chown clears setuid and setgid.
	if err := unix.Fchown(nfd, hdr.Uid, hdr.Gid); err != nil {
		return err
	}
	if err := unix.Fchmod(nfd, uint32(hdr.Mode&0o7777)); err != nil {
		return err
	}
	ts := timespecs(hdr)
	if err := unix.UtimesNanoAt(nfd, "", ts, unix.AT_EMPTY_PATH); err != nil {
		return err
	}
	return f.Close()
}

// onlyWriter hides os.File's ReadFrom so io.CopyBuffer uses our buffer
// instead of falling back to a 32 KiB one.
type onlyWriter struct{ w io.Writer }

func (o onlyWriter) Write(p []byte) (int, error) { return o.w.Write(p) }

func (u *unpacker) hardlink(fd int, target, base string, hdr *tar.Header) error {
	parts, err := cleanName(hdr.Linkname)
	if err != nil {
		return fmt.Errorf("hard link target: %w", err)
	}
	if len(parts) == 0 {
		return errdefs.Invalidf("hard link to the root")
	}
	ophys, err := u.resolveDir(strings.Join(parts[:len(parts)-1], "/"), false)
	if errors.Is(err, fs.ErrNotExist) {
		return errdefs.Invalidf("hard link target %q does not exist", hdr.Linkname)
	}
	if err != nil {
		return err
	}
	obase := parts[len(parts)-1]
	if path.Join(ophys, obase) == target {
		return nil // a link to itself: already there
	}
	// A descriptor of its own: openDir's cache serves the new name's side.
	oname := ophys
	if oname == "" {
		oname = "."
	}
	od, err := u.root.OpenFile(oname, os.O_RDONLY|syscall.O_DIRECTORY|syscall.O_NOFOLLOW, 0)
	if err != nil {
		return err
	}
	defer od.Close()
	var st unix.Stat_t
	if err := unix.Fstatat(int(od.Fd()), obase, &st, unix.AT_SYMLINK_NOFOLLOW); err != nil {
		if errors.Is(err, unix.ENOENT) {
			return errdefs.Invalidf("hard link target %q does not exist", hdr.Linkname)
		}
		return err
	}
	if st.Mode&unix.S_IFMT == unix.S_IFDIR {
		return errdefs.Invalidf("hard link target %q is a directory", hdr.Linkname)
	}
	if err := u.replace(fd, target, base); err != nil {
		return err
	}
	// Flags 0: a link to a symlink links the symlink, as link(2) does.
	return unix.Linkat(int(od.Fd()), obase, fd, base, 0)
}

func (u *unpacker) node(fd int, target, base string, hdr *tar.Header) error {
	if err := u.replace(fd, target, base); err != nil {
		return err
	}
	mode := uint32(unix.S_IFIFO)
	switch hdr.Typeflag {
	case tar.TypeChar:
		mode = unix.S_IFCHR
	case tar.TypeBlock:
		mode = unix.S_IFBLK
	}
	dev := int(unix.Mkdev(uint32(hdr.Devmajor), uint32(hdr.Devminor)))
	if err := unix.Mknodat(fd, base, mode|0o600, dev); err != nil {
		return err
	}
	return u.attrs(fd, base, hdr, true)
}

// attrs sets owner, mode (unless symlink) and times of base without
// following it.
func (u *unpacker) attrs(fd int, base string, hdr *tar.Header, chmod bool) error {
	if err := unix.Fchownat(fd, base, hdr.Uid, hdr.Gid, unix.AT_SYMLINK_NOFOLLOW); err != nil {
		return err
	}
	if chmod {
		if err := unix.Fchmodat(fd, base, uint32(hdr.Mode&0o7777), 0); err != nil {
			return err
		}
	}
	return unix.UtimesNanoAt(fd, base, timespecs(hdr), unix.AT_SYMLINK_NOFOLLOW)
}

func timespecs(hdr *tar.Header) []unix.Timespec {
	at := hdr.AccessTime
	if at.IsZero() {
		at = hdr.ModTime
	}
	return []unix.Timespec{unix.NsecToTimespec(at.UnixNano()), unix.NsecToTimespec(hdr.ModTime.UnixNano())}
}

// whiteout applies a .wh. entry in directory dirName.
func (u *unpacker) whiteout(dirName, base string) error {
	phys, err := u.resolveDir(dirName, false)
	if errors.Is(err, fs.ErrNotExist) || errors.Is(err, syscall.ENOTDIR) {
		return nil // nothing below to hide
	}
	if err != nil {
		return u.fsError(err)
	}
	if base == whiteoutPrefix+whiteoutPrefix+".opq" {
		return u.fsError(u.opaque(phys))
	}
	if strings.HasPrefix(base, whiteoutPrefix+whiteoutPrefix) {
		return nil // other AUFS metadata (.wh..wh.plnk, ...): not content
	}
	victim := strings.TrimPrefix(base, whiteoutPrefix)
	if victim == "" || victim == "." || victim == ".." {
		return errdefs.Invalidf("whiteout %q names nothing", base)
	}
	target := path.Join(phys, victim)
	if u.written[target] {
		return nil // whiteouts hide lower layers only
	}
	u.forget()
	return u.fsError(u.root.RemoveAll(target))
}

// opaque empties directory phys of everything lower layers put there,
// keeping what this layer wrote (before or after the marker in the tar).
func (u *unpacker) opaque(phys string) error {
	name := phys
	if name == "" {
		name = "."
	}
	d, err := u.root.OpenFile(name, os.O_RDONLY|syscall.O_DIRECTORY|syscall.O_NOFOLLOW, 0)
	if err != nil {
		return err
	}
	ents, err := d.ReadDir(-1)
	d.Close()
	if err != nil {
		return err
	}
	for _, e := range ents {
		p := path.Join(phys, e.Name())
		switch {
		case !u.written[p]:
			u.forget()
			if err := u.root.RemoveAll(p); err != nil {
				return err
			}
		case e.IsDir():
			if err := u.opaque(p); err != nil {
				return err
			}
		}
	}
	return nil
}

// applyDirTimes sets the directory mtimes recorded during unpacking, once
// nothing will be created in them any more.
func (u *unpacker) applyDirTimes() error {
	for p, mt := range u.dirTimes {
		name := p
		if name == "" {
			name = "."
		}
		fi, err := u.root.Lstat(name)
		if errors.Is(err, fs.ErrNotExist) || (err == nil && !fi.IsDir()) {
			continue // deleted or replaced by a later layer
		}
		if err != nil {
			return u.fsError(err)
		}
		if err := u.root.Chtimes(name, mt, mt); err != nil {
			return u.fsError(err)
		}
	}
	return nil
}

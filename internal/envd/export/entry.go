// Package export describes a sandbox's filesystem as a list of entries and
// writes entries as a tar stream, so that what a sandbox changed over its
// read-only root filesystem can become an OCI layer.
//
// The same code runs on both sides of the comparison: inside the sandbox
// (spore-envd -manifest, -tar: the sandbox's writes live in gVisor's
// in-memory overlay layer, visible only from inside) and on the node over
// the root filesystem directory (the lower layer). It imports nothing
// host-side: the in-sandbox daemon is built from it.
package export

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path"
	"slices"
	"strconv"
	"strings"
	"syscall"

	"golang.org/x/sys/unix"
)

// Entry types.
const (
	TypeFile    = 'f'
	TypeDir     = 'd'
	TypeSymlink = 'l'
	TypeChar    = 'c'
	TypeBlock   = 'b'
	TypeFIFO    = 'p'
	TypeSocket  = 's'
	// TypeMount is a directory another filesystem is mounted on (seen
	// only inside a sandbox): neither it nor anything under it is part of
	// the root overlay.
	TypeMount = 'm'
)

// Entry is one filesystem entry.
type Entry struct {
	Path  string // relative to the root, "/"-separated, no leading "/" ("etc/passwd")
	Type  byte
	Mode  uint32 // permission bits with setuid, setgid, sticky (07777)
	UID   uint32
	GID   uint32
	Size  int64 // regular files only
	Mtime int64 // unix nanoseconds
	Rdev  uint64
	Link  string // symlink target
}

// Same reports whether e and o are the same content as far as an image
// layer is concerned: type, mode, owner, size, mtime, link target, device
// number. Directory sizes are not compared (gVisor's overlay and the host
// disagree on them); changed contents change a directory's mtime.
func (e Entry) Same(o Entry) bool {
	if e.Type != o.Type || e.Mode != o.Mode || e.UID != o.UID || e.GID != o.GID || e.Mtime != o.Mtime || e.Link != o.Link || e.Rdev != o.Rdev {
		return false
	}
	return e.Type == TypeDir || e.Size == o.Size
}

// AppendLine appends e as one line: quoted path, type, octal mode, uid,
// gid, size, mtime, rdev, quoted link. Quoting keeps any byte of a name.
func (e Entry) AppendLine(b []byte) []byte {
	b = strconv.AppendQuote(b, e.Path)
	b = append(b, ' ', e.Type, ' ')
	b = strconv.AppendUint(b, uint64(e.Mode), 8)
	for _, n := range []uint64{uint64(e.UID), uint64(e.GID), uint64(e.Size), uint64(e.Mtime), e.Rdev} {
		b = append(b, ' ')
		b = strconv.AppendUint(b, n, 10)
	}
	b = append(b, ' ')
	b = strconv.AppendQuote(b, e.Link)
	return append(b, '\n')
}

// ParseLine parses a line AppendLine wrote (without its newline).
func ParseLine(line string) (Entry, error) {
	var e Entry
	bad := func(why string) (Entry, error) {
		return Entry{}, fmt.Errorf("manifest line %.80q: %s", line, why)
	}
	q, err := strconv.QuotedPrefix(line)
	if err != nil {
		return bad("path not quoted")
	}
	if e.Path, err = strconv.Unquote(q); err != nil {
		return bad("path not quoted")
	}
	rest := line[len(q):]
	fields := strings.SplitN(strings.TrimPrefix(rest, " "), " ", 8)
	if len(fields) != 8 || len(fields[0]) != 1 {
		return bad("want 9 fields")
	}
	e.Type = fields[0][0]
	if !strings.ContainsRune("fdlcbpsm", rune(e.Type)) {
		return bad("unknown type")
	}
	mode, err := strconv.ParseUint(fields[1], 8, 32)
	if err != nil || mode > 0o7777 {
		return bad("mode")
	}
	e.Mode = uint32(mode)
	var nums [5]uint64
	for i := range nums {
		if nums[i], err = strconv.ParseUint(fields[2+i], 10, 64); err != nil {
			return bad("number")
		}
	}
	if nums[0] > 1<<32-1 || nums[1] > 1<<32-1 || nums[2] > 1<<62 || nums[3] > 1<<63-1 {
		return bad("number out of range")
	}
	e.UID, e.GID, e.Size, e.Mtime, e.Rdev = uint32(nums[0]), uint32(nums[1]), int64(nums[2]), int64(nums[3]), nums[4]
	if e.Link, err = strconv.Unquote(fields[7]); err != nil {
		return bad("link not quoted")
	}
	if err := CheckPath(e.Path); err != nil {
		return bad(err.Error())
	}
	return e, nil
}

// CheckPath refuses a path that is not a clean relative one.
func CheckPath(p string) error {
	if p == "" || p == "." || path.IsAbs(p) || path.Clean(p) != p || p == ".." || strings.HasPrefix(p, "../") || strings.ContainsRune(p, 0) {
		return fmt.Errorf("path %q is not clean and relative", p)
	}
	return nil
}

// ReadManifest reads the lines of a manifest.
func ReadManifest(r io.Reader, fn func(Entry) error) error {
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for sc.Scan() {
		e, err := ParseLine(sc.Text())
		if err != nil {
			return err
		}
		if err := fn(e); err != nil {
			return err
		}
	}
	return sc.Err()
}

// Excluded reports whether a path is never part of an exported image:
// the files Spore writes per sandbox into every root filesystem (the
// name-service files, the file that keeps /tmp on disk: container
// runtimes provide or do not need them), and what lives under the
// sandbox's mount points (/proc, /sys, /dev, the daemon at /opt/spore).
// The mount points themselves stay, as empty directories.
func Excluded(p string) bool {
	switch p {
	case "etc/hosts", "etc/hostname", "etc/resolv.conf":
		return true
	}
	if strings.HasPrefix(p, "tmp/.spore-") {
		return true
	}
	for _, d := range []string{"proc/", "sys/", "dev/", "opt/spore/"} {
		if strings.HasPrefix(p, d) {
			return true
		}
	}
	return false
}

// Walk visits every entry under the directory dir (not dir itself) in
// lexical order, parents before children, without following symbolic
// links, skipping Excluded paths. mounts: report directories on another
// device than dir as TypeMount and do not enter them (inside a sandbox;
// gVisor's overlay gives its directories the root's device, while its
// files carry their layer's, so only directories are compared).
//
// It works on directory descriptors (fstatat, readlinkat, openat with
// O_NOFOLLOW): no path is resolved twice, which matters inside gVisor,
// where each resolution is a round trip to the filesystem server.
func Walk(dir string, mounts bool, fn func(Entry) error) error {
	fd, err := unix.Open(dir, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return &fs.PathError{Op: "open", Path: dir, Err: err}
	}
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil {
		unix.Close(fd)
		return err
	}
	return walkFd(fd, "", st.Dev, mounts, fn)
}

// walkFd walks the directory open as fd (closed on return), whose path
// is rel ("" for the top).
func walkFd(fd int, rel string, rootDev uint64, mounts bool, fn func(Entry) error) error {
	f := os.NewFile(uintptr(fd), rel)
	defer f.Close()
	names, err := f.Readdirnames(-1)
	if err != nil {
		return err
	}
	slices.Sort(names)
	for _, name := range names {
		p := name
		if rel != "" {
			p = rel + "/" + name
		}
		if Excluded(p) {
			continue
		}
		var st unix.Stat_t
		if err := unix.Fstatat(fd, name, &st, unix.AT_SYMLINK_NOFOLLOW); err != nil {
			if errors.Is(err, unix.ENOENT) {
				continue // removed meanwhile
			}
			return &fs.PathError{Op: "lstat", Path: p, Err: err}
		}
		e, err := entryOfStat(p, &st, func() (string, error) { return readlinkat(fd, name) })
		if err != nil {
			return err
		}
		if mounts && e.Type == TypeDir && st.Dev != rootDev {
			e = Entry{Path: p, Type: TypeMount}
		}
		if err := fn(e); err != nil {
			return err
		}
		if e.Type != TypeDir {
			continue
		}
		sub, err := unix.Openat(fd, name, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
		if errors.Is(err, unix.ENOENT) {
			continue
		}
		if err != nil {
			return &fs.PathError{Op: "open", Path: p, Err: err}
		}
		if err := walkFd(sub, p, rootDev, mounts, fn); err != nil {
			return err
		}
	}
	return nil
}

func readlinkat(fd int, name string) (string, error) {
	for size := 256; ; size *= 2 {
		b := make([]byte, size)
		n, err := unix.Readlinkat(fd, name, b)
		if err != nil {
			return "", &fs.PathError{Op: "readlink", Path: name, Err: err}
		}
		if n < size {
			return string(b[:n]), nil
		}
	}
}

// Stat returns the entry of path p under root.
func Stat(root *os.Root, p string) (Entry, error) {
	fi, err := root.Lstat(p)
	if err != nil {
		return Entry{}, err
	}
	return entryOf(root, p, fi)
}

func entryOf(root *os.Root, p string, fi fs.FileInfo) (Entry, error) {
	st := fi.Sys().(*syscall.Stat_t)
	u := unix.Stat_t{Dev: st.Dev, Ino: st.Ino, Mode: st.Mode, Uid: st.Uid, Gid: st.Gid, Rdev: st.Rdev, Size: st.Size,
		Mtim: unix.Timespec{Sec: st.Mtim.Sec, Nsec: st.Mtim.Nsec}}
	return entryOfStat(p, &u, func() (string, error) { return root.Readlink(p) })
}

func entryOfStat(p string, st *unix.Stat_t, readlink func() (string, error)) (Entry, error) {
	e := Entry{Path: p, Mode: st.Mode & 0o7777, UID: st.Uid, GID: st.Gid, Mtime: st.Mtim.Nano()}
	switch st.Mode & unix.S_IFMT {
	case unix.S_IFREG:
		e.Type, e.Size = TypeFile, st.Size
	case unix.S_IFDIR:
		e.Type = TypeDir
	case unix.S_IFLNK:
		e.Type = TypeSymlink
		link, err := readlink()
		if err != nil {
			return Entry{}, err
		}
		e.Link = link
	case unix.S_IFCHR:
		e.Type, e.Rdev = TypeChar, st.Rdev
	case unix.S_IFBLK:
		e.Type, e.Rdev = TypeBlock, st.Rdev
	case unix.S_IFIFO:
		e.Type = TypeFIFO
	case unix.S_IFSOCK:
		e.Type = TypeSocket
	default:
		return Entry{}, fmt.Errorf("%s: unknown file type %o", p, st.Mode&unix.S_IFMT)
	}
	return e, nil
}

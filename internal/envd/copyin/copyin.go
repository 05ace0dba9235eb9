// Package copyin unpacks a template build's COPY step inside the sandbox:
// a tar (maybe gzipped) of build-context paths, copied to a destination
// with Docker's COPY semantics, owned by a user of the sandbox. It is the
// daemon's job ("spore-envd -copy") because images may have no tar.
//
// It runs as root in the sandbox, whose / is the sandbox's own, so
// symlinks the image has on the way to the destination (/bin -> usr/bin)
// are followed as Docker follows them; what the archive itself plants is
// never written through, and archive names that are absolute or climb
// out with ".." are refused.
package copyin

import (
	"archive/tar"
	"bufio"
	"bytes"
	"compress/gzip"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path"
	"strconv"
	"strings"

	"golang.org/x/sys/unix"

	"github.com/spore-run/spore/internal/errdefs"
)

// Options are one COPY step.
type Options struct {
	// Root is the filesystem copied into: "/" in the sandbox, a temp dir
	// in tests. Dest, Workdir and the user files are resolved in it.
	Root string
	// Archive is the tar (gzip detected by its magic bytes), a path as
	// is (not under Root).
	Archive string
	// Src is a path (or a glob) relative to the build context, as the
	// archive names it; "." is all of it.
	Src string
	// Dest: a directory src's contents go into it; a file src goes to
	// Dest/<base> when Dest ends with / or is a directory, else to Dest.
	// Relative to Workdir (default /).
	Dest, Workdir string
	// User owns everything created: "name", "name:group", "uid:gid"
	// ("" = root), resolved in Root's /etc/passwd and /etc/group.
	User string
	// Mode (octal, "" = as archived) is set on every file written.
	Mode string
}

type entry struct {
	hdr  *tar.Header
	name string // cleaned, relative
}

// Copy performs one COPY step. Errors of kind ErrInvalidArgument are the
// caller's (bad archive names, unknown user, nothing matched).
func Copy(ctx context.Context, o Options) error {
	if o.Root == "" {
		o.Root = "/"
	}
	src, err := cleanRel(o.Src)
	if err != nil {
		return errdefs.Invalidf("source: %v", err)
	}
	var mode *os.FileMode
	if o.Mode != "" {
		m, err := strconv.ParseUint(o.Mode, 8, 32)
		if err != nil || m > 0o7777 {
			return errdefs.Invalidf("mode %q is not octal", o.Mode)
		}
		fm := unixMode(uint32(m))
		mode = &fm
	}
	uid, gid, err := lookupOwner(o.Root, o.User)
	if err != nil {
		return err
	}
	// First pass: the names, all checked before anything is written.
	var entries []entry
	if err := readArchive(o.Archive, func(h *tar.Header, _ io.Reader) error {
		if err := ctx.Err(); err != nil {
			return err
		}
		e, err := checkEntry(h)
		if err != nil {
			return err
		}
		entries = append(entries, e)
		return nil
	}); err != nil {
		return err
	}
	w := &writer{root: o.Root, uid: uid, gid: gid, mode: mode, planted: map[inode]bool{}, created: map[string]bool{}, written: map[string]string{}}
	plan, err := planTargets(o, src, entries, w.isDir)
	if err != nil {
		return err
	}
	for _, d := range plan.dirs {
		if _, err := w.mkdirAll(d, 0o755); err != nil {
			return err
		}
	}
	return readArchive(o.Archive, func(h *tar.Header, r io.Reader) error {
		if err := ctx.Err(); err != nil {
			return err
		}
		e, err := checkEntry(h) // the archive is read again: check again
		if err != nil {
			return err
		}
		name := e.name
		target, ok := plan.targets[name]
		if !ok {
			return nil
		}
		return w.write(h, name, target, r)
	})
}

// unixMode turns permission bits (with setuid/setgid/sticky) into an
// os.FileMode.
func unixMode(m uint32) os.FileMode {
	fm := os.FileMode(m & 0o777)
	if m&unix.S_ISUID != 0 {
		fm |= os.ModeSetuid
	}
	if m&unix.S_ISGID != 0 {
		fm |= os.ModeSetgid
	}
	if m&unix.S_ISVTX != 0 {
		fm |= os.ModeSticky
	}
	return fm
}

func readArchive(p string, each func(*tar.Header, io.Reader) error) error {
	f, err := os.Open(p)
	if err != nil {
		return fmt.Errorf("archive: %w", err)
	}
	defer f.Close()
	br := bufio.NewReader(f)
	var r io.Reader = br
	if magic, _ := br.Peek(2); bytes.Equal(magic, []byte{0x1f, 0x8b}) {
		zr, err := gzip.NewReader(br)
		if err != nil {
			return errdefs.Invalidf("archive: %v", err)
		}
		defer zr.Close()
		r = zr
	}
	tr := tar.NewReader(r)
	for {
		h, err := tr.Next()
		if err == io.EOF {
			return nil
		}
		if err != nil {
			return errdefs.Invalidf("archive: %v", err)
		}
		if err := each(h, tr); err != nil {
			return err
		}
	}
}

func cleanName(n string) string {
	return path.Clean(strings.TrimPrefix(n, "./"))
}

func cleanRel(p string) (string, error) {
	if p == "" {
		return "", errors.New("empty path")
	}
	if path.IsAbs(p) {
		return "", fmt.Errorf("%q is absolute", p)
	}
	c := path.Clean(p)
	if c == ".." || strings.HasPrefix(c, "../") {
		return "", fmt.Errorf("%q leaves the build context", p)
	}
	return c, nil
}

func checkEntry(h *tar.Header) (entry, error) {
	name := h.Name
	if path.IsAbs(name) {
		return entry{}, errdefs.Invalidf("archive entry %q has an absolute name", name)
	}
	for _, part := range strings.Split(name, "/") {
		if part == ".." {
			return entry{}, errdefs.Invalidf("archive entry %q climbs out with ..", name)
		}
	}
	c := cleanName(name)
	if c == "." && h.Typeflag != tar.TypeDir {
		return entry{}, errdefs.Invalidf("archive entry %q has no name", name)
	}
	switch h.Typeflag {
	case tar.TypeReg, tar.TypeDir, tar.TypeSymlink:
	case tar.TypeLink:
		if _, err := cleanRel(h.Linkname); err != nil {
			return entry{}, errdefs.Invalidf("archive hard link %q: %v", name, err)
		}
	default:
		return entry{}, errdefs.Invalidf("archive entry %q: type %q not supported (files, directories and links only)", name, h.Typeflag)
	}
	return entry{hdr: h, name: c}, nil
}

// plan maps each archive name copied to its absolute target path
// (inside Root's namespace: "/a/b").
type plan struct {
	targets map[string]string
	dirs    []string // created first (dest directories), with parents
}

func planTargets(o Options, src string, entries []entry, isDir func(string) bool) (*plan, error) {
	workdir := o.Workdir
	if workdir == "" {
		workdir = "/"
	}
	dest := o.Dest
	if dest == "" {
		return nil, errdefs.Invalidf("empty destination")
	}
	destDir := strings.HasSuffix(dest, "/") || strings.HasSuffix(dest, "/.") || dest == "."
	if !path.IsAbs(dest) {
		dest = path.Join(workdir, dest)
	}
	dest = path.Clean(dest)
	if isDir(dest) {
		destDir = true
	}
	// The matches: the archive paths src names (a glob matches the
	// first components of names).
	glob := strings.ContainsAny(src, "*?[")
	depth := len(strings.Split(src, "/"))
	matchOf := func(name string) (string, bool) {
		if src == "." {
			return ".", true
		}
		if !glob {
			return src, name == src || strings.HasPrefix(name, src+"/")
		}
		parts := strings.Split(name, "/")
		if len(parts) < depth {
			return "", false
		}
		m := strings.Join(parts[:depth], "/")
		ok, _ := path.Match(src, m)
		return m, ok
	}
	dirMatch := map[string]bool{} // match -> a directory
	var order []string
	for _, e := range entries {
		m, ok := matchOf(e.name)
		if !ok {
			continue
		}
		if _, seen := dirMatch[m]; !seen {
			order = append(order, m)
			dirMatch[m] = false
		}
		if e.name != m || e.hdr.Typeflag == tar.TypeDir {
			dirMatch[m] = true
		}
	}
	if len(order) == 0 {
		return nil, errdefs.Invalidf("source %q: not in the archive", o.Src)
	}
	if len(order) > 1 && !destDir {
		return nil, errdefs.Invalidf("source %q matches %d paths: the destination %q must be a directory (end it with /)", o.Src, len(order), o.Dest)
	}
	p := &plan{targets: map[string]string{}}
	for _, m := range order {
		if dirMatch[m] {
			p.dirs = append(p.dirs, dest)
		} else if destDir {
			p.dirs = append(p.dirs, dest)
		} else {
			p.dirs = append(p.dirs, path.Dir(dest))
		}
	}
	for _, e := range entries {
		m, ok := matchOf(e.name)
		if !ok {
			continue
		}
		var t string
		switch {
		case dirMatch[m] && m == ".":
			t = path.Join(dest, e.name)
		case dirMatch[m]:
			t = path.Join(dest, strings.TrimPrefix(strings.TrimPrefix(e.name, m), "/"))
		case destDir:
			t = path.Join(dest, path.Base(m))
		default:
			t = dest
		}
		p.targets[e.name] = t
	}
	return p, nil
}

package copyin

import (
	"archive/tar"
	"bufio"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/spore-run/spore/internal/errdefs"
)

type inode struct{ dev, ino uint64 }

type writer struct {
	root     string
	uid, gid int
	mode     *os.FileMode
	// planted are the symlinks this copy created (by inode, so no alias
	// of their path reaches through them); created the directories it
	// made (real paths); written the regular files, by archive name, for
	// hard links.
	planted map[inode]bool
	created map[string]bool
	written map[string]string
}

// resolve walks p (absolute, inside Root) component by component,
// following the symlinks that were there before (chroot-style: an
// absolute target restarts at Root, ".." stops at Root) and refusing the
// ones this copy planted. It returns the real path of the longest prefix
// that exists and the components after it that do not. The last
// component is not followed when it is a symlink and !followLast.
func (w *writer) resolve(p string, followLast bool) (string, []string, error) {
	todo := splitPath(p)
	var done []string // resolved components under Root
	for links := 0; len(todo) > 0; {
		comp := todo[0]
		todo = todo[1:]
		switch comp {
		case ".":
			continue
		case "..":
			if len(done) > 0 {
				done = done[:len(done)-1]
			}
			continue
		}
		real := filepath.Join(w.root, filepath.Join(append(done, comp)...))
		fi, err := os.Lstat(real)
		if errors.Is(err, fs.ErrNotExist) {
			return filepath.Join(w.root, filepath.Join(done...)), append([]string{comp}, todo...), nil
		}
		if err != nil {
			return "", nil, err
		}
		if fi.Mode()&fs.ModeSymlink == 0 || (len(todo) == 0 && !followLast) {
			done = append(done, comp)
			continue
		}
		if w.planted[inodeOf(fi)] {
			return "", nil, errdefs.Invalidf("%s: would write through a symlink the archive created", p)
		}
		if links++; links > 255 {
			return "", nil, fmt.Errorf("%s: too many levels of symbolic links", p)
		}
		target, err := os.Readlink(real)
		if err != nil {
			return "", nil, err
		}
		if path.IsAbs(target) {
			done = nil
		}
		todo = append(splitPath(target), todo...)
	}
	return filepath.Join(w.root, filepath.Join(done...)), nil, nil
}

func splitPath(p string) []string {
	var out []string
	for _, c := range strings.Split(p, "/") {
		if c != "" {
			out = append(out, c)
		}
	}
	return out
}

func inodeOf(fi fs.FileInfo) inode {
	st := fi.Sys().(*syscall.Stat_t)
	return inode{uint64(st.Dev), st.Ino}
}

// isDir reports whether p (inside Root) is an existing directory.
func (w *writer) isDir(p string) bool {
	real, missing, err := w.resolve(p, true)
	if err != nil || len(missing) > 0 {
		return false
	}
	fi, err := os.Stat(real)
	return err == nil && fi.IsDir()
}

// mkdirAll makes directory p with its missing parents (mode 0755, owned
// by the copy's user, as Docker's --chown does) and returns its real
// path.
func (w *writer) mkdirAll(p string, mode os.FileMode) (string, error) {
	real, missing, err := w.resolve(p, true)
	if err != nil {
		return "", err
	}
	if fi, err := os.Stat(real); err != nil {
		return "", err
	} else if !fi.IsDir() {
		return "", fmt.Errorf("%s: %s is not a directory", p, real)
	}
	for _, comp := range missing {
		real = filepath.Join(real, comp)
		if err := os.Mkdir(real, mode); err != nil {
			return "", err
		}
		if err := os.Lchown(real, w.uid, w.gid); err != nil {
			return "", err
		}
		if err := os.Chmod(real, mode); err != nil { // not the umask's
			return "", err
		}
		w.created[real] = true
	}
	return real, nil
}

// place prepares the real path for a non-directory at p: its parent
// made, whatever non-directory was there removed (replacing a symlink is
// not writing through it).
func (w *writer) place(p string) (string, error) {
	parent, err := w.mkdirAll(path.Dir(p), 0o755)
	if err != nil {
		return "", err
	}
	real := filepath.Join(parent, path.Base(p))
	fi, err := os.Lstat(real)
	switch {
	case errors.Is(err, fs.ErrNotExist):
		return real, nil
	case err != nil:
		return "", err
	case fi.IsDir():
		return "", fmt.Errorf("%s: cannot replace a directory with a file", p)
	}
	return real, os.Remove(real)
}

func (w *writer) write(h *tar.Header, name, target string, r io.Reader) error {
	switch h.Typeflag {
	case tar.TypeDir:
		real, err := w.mkdirAll(target, 0o755)
		if err != nil {
			return err
		}
		if w.created[real] {
			return os.Chmod(real, unixMode(uint32(h.Mode)))
		}
		return nil
	case tar.TypeSymlink:
		real, err := w.place(target)
		if err != nil {
			return err
		}
		if err := os.Symlink(h.Linkname, real); err != nil {
			return err
		}
		if err := os.Lchown(real, w.uid, w.gid); err != nil {
			return err
		}
		fi, err := os.Lstat(real)
		if err != nil {
			return err
		}
		w.planted[inodeOf(fi)] = true
		return nil
	case tar.TypeLink:
		from, ok := w.written[cleanName(h.Linkname)]
		if !ok {
			return errdefs.Invalidf("archive hard link %q: its target %q is not a file this copy wrote", h.Name, h.Linkname)
		}
		real, err := w.place(target)
		if err != nil {
			return err
		}
		return os.Link(from, real)
	case tar.TypeReg:
		real, err := w.place(target)
		if err != nil {
			return err
		}
		if err := w.writeFile(real, h, r); err != nil {
			return fmt.Errorf("%s: %w", target, err)
		}
		w.written[name] = real
		return nil
	}
	return errdefs.Invalidf("archive entry %q: type %q not supported", h.Name, h.Typeflag)
}

func (w *writer) writeFile(real string, h *tar.Header, r io.Reader) error {
	f, err := os.OpenFile(real, os.O_WRONLY|os.O_CREATE|os.O_EXCL|syscall.O_NOFOLLOW, 0o600)
	if err != nil {
		return err
	}
	if _, err := io.Copy(f, r); err != nil {
		f.Close()
		return err
	}
	mode := unixMode(uint32(h.Mode))
	if w.mode != nil {
		mode = *w.mode
	}
	// chown before chmod: chown clears setuid/setgid.
	if err := f.Chown(w.uid, w.gid); err != nil {
		f.Close()
		return err
	}
	if err := f.Chmod(mode); err != nil {
		f.Close()
		return err
	}
	if err := f.Close(); err != nil {
		return err
	}
	if !h.ModTime.IsZero() {
		return os.Chtimes(real, time.Time{}, h.ModTime)
	}
	return nil
}

// lookupOwner resolves "name", "name:group", "uid[:gid]" against Root's
// /etc/passwd and /etc/group; without a group the gid is the uid, as
// Docker's --chown documents. "" is root.
func lookupOwner(root, spec string) (int, int, error) {
	if spec == "" {
		return 0, 0, nil
	}
	u, g, hasGroup := strings.Cut(spec, ":")
	uid, err := lookupID(filepath.Join(root, "etc/passwd"), u)
	if err != nil {
		return 0, 0, err
	}
	if !hasGroup {
		return uid, uid, nil
	}
	gid, err := lookupID(filepath.Join(root, "etc/group"), g)
	if err != nil {
		return 0, 0, err
	}
	return uid, gid, nil
}

// lookupID is the id of name (or name itself, if numeric) in a
// passwd/group file (name:x:id:...).
func lookupID(file, name string) (int, error) {
	if id, err := strconv.ParseUint(name, 10, 31); err == nil {
		return int(id), nil
	}
	f, err := os.Open(file)
	if err != nil {
		return 0, errdefs.Invalidf("unknown user or group %q: %v", name, err)
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		fields := strings.Split(sc.Text(), ":")
		if len(fields) >= 3 && fields[0] == name {
			id, err := strconv.ParseUint(fields[2], 10, 31)
			if err != nil {
				return 0, fmt.Errorf("%s: bad id for %q", file, name)
			}
			return int(id), nil
		}
	}
	if err := sc.Err(); err != nil {
		return 0, err
	}
	return 0, errdefs.Invalidf("unknown user or group %q (not in %s)", name, file)
}

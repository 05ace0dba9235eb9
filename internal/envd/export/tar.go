package export

import (
	"archive/tar"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
)

// TarWriter writes entries of a root as tar headers with their exact
// mode, owner, mtime (to the second), link target and device numbers.
// A regular file with several links is written in full once; its other
// names in the same stream become hard links to the first.
type TarWriter struct {
	Root  *os.Root
	TW    *tar.Writer
	links map[[2]uint64]string
}

// Write writes the entry at p as it is now; a path gone meanwhile is
// skipped (false). Sockets are skipped too: a tar cannot hold them.
func (w *TarWriter) Write(p string) (bool, error) {
	if err := CheckPath(p); err != nil {
		return false, err
	}
	fi, err := w.Root.Lstat(p)
	if errors.Is(err, fs.ErrNotExist) {
		return false, nil
	}
	if err != nil {
		return false, err
	}
	e, err := entryOf(w.Root, p, fi)
	if err != nil {
		return false, err
	}
	if e.Type == TypeSocket {
		return false, nil
	}
	h := Header(e)
	st := fi.Sys().(*syscall.Stat_t)
	if e.Type == TypeFile && st.Nlink > 1 {
		key := [2]uint64{st.Dev, st.Ino}
		if first, ok := w.links[key]; ok {
			h.Typeflag, h.Linkname, h.Size = tar.TypeLink, first, 0
			return true, w.TW.WriteHeader(h)
		}
		if w.links == nil {
			w.links = map[[2]uint64]string{}
		}
		w.links[key] = p
	}
	if e.Type != TypeFile {
		return true, w.TW.WriteHeader(h)
	}
	f, err := w.Root.OpenFile(p, os.O_RDONLY|syscall.O_NOFOLLOW, 0)
	if err != nil {
		return false, err
	}
	defer f.Close()
	if err := w.TW.WriteHeader(h); err != nil {
		return false, err
	}
	// Exactly the size in the header: a file that grew is cut there, one
	// that shrank is padded (it is being written while exported).
	n, err := io.CopyN(w.TW, f, h.Size)
	if err != nil && !errors.Is(err, io.EOF) {
		return false, fmt.Errorf("%s: %w", p, err)
	}
	if n < h.Size {
		if _, err := io.CopyN(w.TW, zeros{}, h.Size-n); err != nil {
			return false, err
		}
	}
	return true, nil
}

// Header is the tar header of e (no content).
func Header(e Entry) *tar.Header {
	h := &tar.Header{Name: e.Path, Mode: int64(e.Mode), Uid: int(e.UID), Gid: int(e.GID), ModTime: time.Unix(0, e.Mtime)}
	switch e.Type {
	case TypeFile:
		h.Typeflag, h.Size = tar.TypeReg, e.Size
	case TypeDir:
		h.Typeflag, h.Name = tar.TypeDir, e.Path+"/"
	case TypeSymlink:
		h.Typeflag, h.Linkname = tar.TypeSymlink, e.Link
	case TypeChar, TypeBlock:
		h.Typeflag = tar.TypeChar
		if e.Type == TypeBlock {
			h.Typeflag = tar.TypeBlock
		}
		h.Devmajor, h.Devminor = int64(unix.Major(e.Rdev)), int64(unix.Minor(e.Rdev))
	case TypeFIFO:
		h.Typeflag = tar.TypeFifo
	}
	return h
}

// Whiteout is the OCI whiteout entry that deletes p from lower layers.
func Whiteout(p string) *tar.Header {
	dir, name := path.Split(p)
	return &tar.Header{Name: dir + ".wh." + name, Typeflag: tar.TypeReg, Mode: 0o600, ModTime: time.Unix(0, 0)}
}

type zeros struct{}

func (zeros) Read(b []byte) (int, error) {
	clear(b)
	return len(b), nil
}

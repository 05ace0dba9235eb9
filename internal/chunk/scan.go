package chunk

import (
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"syscall"

	"golang.org/x/sys/unix"

	"github.com/spore-run/spore/internal/errdefs"
)

// loc is where a chunk's bytes are in the tree being packed.
type loc struct {
	path   string // absolute
	offset int64
	size   int64
}

// scanned is the first pass of Pack: the tree's entries with their chunks
// cut and hashed (Stored not known yet), and where each chunk is.
type scanned struct {
	entries []Entry
	order   []ID // distinct chunks, first appearance first
	where   map[ID]loc
}

// scan walks dir in lexical order and cuts every regular file.
func scan(ctx context.Context, dir string) (*scanned, error) {
	s := &scanned{where: map[ID]loc{}}
	buf := make([]byte, MaxChunk)
	err := filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if err := ctx.Err(); err != nil {
			return err
		}
		if p == dir {
			return nil
		}
		rel, err := filepath.Rel(dir, p)
		if err != nil {
			return err
		}
		fi, err := d.Info()
		if err != nil {
			return err
		}
		e := Entry{Path: filepath.ToSlash(rel), Mode: uint32(fi.Mode().Perm())}
		if st, ok := fi.Sys().(*syscall.Stat_t); ok {
			e.Mode = st.Mode & 0o7777
			e.UID, e.GID = int(st.Uid), int(st.Gid)
			e.Rdev = st.Rdev
		}
		switch t := fi.Mode().Type(); {
		case t == 0:
			e.Type, e.Rdev = TypeFile, 0
			if err := s.cut(ctx, p, &e, buf); err != nil {
				return err
			}
		case t == fs.ModeDir:
			e.Type, e.Rdev = TypeDir, 0
		case t == fs.ModeSymlink:
			e.Type, e.Rdev = TypeSymlink, 0
			if e.Target, err = os.Readlink(p); err != nil {
				return err
			}
		case t&fs.ModeDevice != 0 && t&fs.ModeCharDevice != 0:
			e.Type = TypeChar
		case t&fs.ModeDevice != 0:
			e.Type = TypeBlock
		case t == fs.ModeNamedPipe:
			e.Type, e.Rdev = TypeFIFO, 0
		default:
			// Sockets and the like are runtime state, not content.
			return errdefs.Invalidf("pack %s: %s is a %v, which a tree cannot hold", dir, rel, t)
		}
		s.entries = append(s.entries, e)
		return nil
	})
	if err != nil {
		if errors.Is(err, fs.ErrNotExist) {
			return nil, fmt.Errorf("%w: pack %s: %v", errdefs.ErrNotFound, dir, err)
		}
		return nil, fmt.Errorf("pack %s: %w", dir, err)
	}
	return s, nil
}

// MinHole is the shortest hole (a range the file system stores no data
// for, found with SEEK_HOLE) that cut skips without reading. A file of
// mostly holes (a volume's image, a memory image's free pages) then costs
// its data, not its size. Shorter holes are read as zeros: cutting around
// each would make chunks far under MinChunk.
const MinHole = MaxChunk

// cut chunks and hashes one file: its data through the content-defined
// chunker, each hole of MinHole or more as zero chunks of MinChunk (what
// the chunker cuts a run of zeros into), never read. A file system
// without SEEK_DATA is read whole.
func (s *scanned) cut(ctx context.Context, p string, e *Entry, buf []byte) error {
	f, err := os.Open(p)
	if err != nil {
		return err
	}
	defer f.Close()
	fi, err := f.Stat()
	if err != nil {
		return err
	}
	size := fi.Size()
	var off int64
	add := func(id ID, n int64) {
		e.Chunks = append(e.Chunks, Ref{ID: id, Size: n})
		if _, seen := s.where[id]; !seen {
			s.where[id] = loc{path: p, offset: off, size: n}
			s.order = append(s.order, id)
		}
		off += n
	}
	for off < size {
		start, end := off, size // the next stretch to read, [start, end)
		if hs, he, ok := nextHole(f, off, size); ok && hs == off {
			// A hole here: zero chunks, unread.
			for off < he {
				n := min(int64(MinChunk), he-off)
				add(zeroID(n), n)
			}
			continue
		} else if ok {
			end = hs
		}
		c := newChunker(io.NewSectionReader(f, start, end-start))
		for {
			if err := ctx.Err(); err != nil {
				return err
			}
			ch, err := c.Next(buf)
			if err == io.EOF {
				break
			}
			if err != nil {
				return err
			}
			add(Sum(ch.Data), int64(ch.Length))
		}
		if off != end {
			return errdefs.Conflictf("%s changed while it was being packed", p)
		}
	}
	e.Size = off
	return nil
}

// nextHole finds the first hole of MinHole bytes or more at or after off
// (before size): its start and end. ok is false when there is none, or
// the file system cannot tell.
func nextHole(f *os.File, off, size int64) (start, end int64, ok bool) {
	fd := int(f.Fd())
	for off < size {
		hs, err := unix.Seek(fd, off, unix.SEEK_HOLE)
		if err != nil || hs >= size {
			return 0, 0, false
		}
		he, err := unix.Seek(fd, hs, unix.SEEK_DATA)
		if errors.Is(err, unix.ENXIO) {
			he = size // a hole to the end
		} else if err != nil {
			return 0, 0, false
		}
		if he-hs >= MinHole {
			return hs, he, true
		}
		off = he
	}
	return 0, 0, false
}

// read returns the chunk's raw bytes from the tree, checked against its
// hash: a file that changed since the scan must not be stored under the
// old name.
func (l loc) read(id ID) ([]byte, error) {
	f, err := os.Open(l.path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	raw := make([]byte, l.size)
	if _, err := f.ReadAt(raw, l.offset); err != nil {
		return nil, fmt.Errorf("read %s at %d: %w", l.path, l.offset, err)
	}
	if Sum(raw) != id {
		return nil, errdefs.Conflictf("%s changed while it was being packed", l.path)
	}
	return raw, nil
}

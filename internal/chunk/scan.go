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

// cut chunks and hashes one file.
func (s *scanned) cut(ctx context.Context, p string, e *Entry, buf []byte) error {
	f, err := os.Open(p)
	if err != nil {
		return err
	}
	defer f.Close()
	c := newChunker(f)
	var off int64
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
		id := Sum(ch.Data)
		n := int64(ch.Length)
		e.Chunks = append(e.Chunks, Ref{ID: id, Size: n})
		if _, seen := s.where[id]; !seen {
			s.where[id] = loc{path: p, offset: off, size: n}
			s.order = append(s.order, id)
		}
		off += n
	}
	e.Size = off
	return nil
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

package chunk

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"sync"

	"golang.org/x/sys/unix"

	"github.com/spore-run/spore/internal/atomicfs"
	"github.com/spore-run/spore/internal/errdefs"
)

// UnpackOptions configure Unpack.
type UnpackOptions struct {
	// Concurrency bounds the chunks fetched at once (default 4).
	Concurrency int
}

// UnpackStats describe one Unpack.
type UnpackStats struct {
	Bytes int64 // raw bytes of the files
	Fetch FetchStats
}

// Unpack writes the tree m describes at dir, which must not exist: it is
// built in a sibling temporary directory, synced, and renamed into place,
// so dir appears complete or not at all. The manifest's chunks are pinned
// in the node cache while it runs. All-zero chunks are left as holes.
//
// Owners are applied when running as root (otherwise the files are the
// caller's); devices need root. The root directory gets mode 0700.
func Unpack(ctx context.Context, m *Manifest, dir string, src *Tiered, opts UnpackOptions) (UnpackStats, error) {
	var st UnpackStats
	if err := m.Validate(); err != nil {
		return st, err
	}
	if opts.Concurrency <= 0 {
		opts.Concurrency = 4
	}
	if _, err := os.Lstat(dir); err == nil {
		return st, fmt.Errorf("%w: unpack %s: %s exists", errdefs.ErrAlreadyExists, m.ID, dir)
	} else if !errors.Is(err, fs.ErrNotExist) {
		return st, fmt.Errorf("unpack %s: %w", m.ID, err)
	}
	parent := filepath.Dir(dir)
	tmp, err := os.MkdirTemp(parent, "."+filepath.Base(dir)+".unpack-*")
	if err != nil {
		return st, fmt.Errorf("unpack %s: %w", m.ID, err)
	}
	done := false
	defer func() {
		if !done {
			os.RemoveAll(tmp)
		}
	}()
	ids := make([]ID, 0, len(m.Entries))
	for id := range m.ChunkIDs() {
		ids = append(ids, id)
	}
	defer src.Pin(ids)()

	var counters fetchCounters
	if err := create(tmp, m); err != nil {
		return st, fmt.Errorf("unpack %s: %w", m.ID, err)
	}
	if err := fill(ctx, tmp, m, src, opts.Concurrency, &counters); err != nil {
		return st, fmt.Errorf("unpack %s: %w", m.ID, err)
	}
	// Synced while every file is still ours to open (modes come next);
	// the metadata after it is made durable with the rename's directory
	// sync (one journal on ext4/xfs).
	if err := syncTree(ctx, tmp, m, opts.Concurrency); err != nil {
		return st, fmt.Errorf("unpack %s: sync: %w", m.ID, err)
	}
	if err := finish(tmp, m); err != nil {
		return st, fmt.Errorf("unpack %s: %w", m.ID, err)
	}
	if err := os.Rename(tmp, dir); err != nil {
		return st, fmt.Errorf("unpack %s: %w", m.ID, err)
	}
	done = true
	if err := atomicfs.SyncDir(parent); err != nil {
		return st, fmt.Errorf("unpack %s: %w", m.ID, err)
	}
	st.Bytes = m.TotalBytes()
	st.Fetch = counters.snapshot()
	return st, nil
}

// create makes the directories and the (sparse, full-length) files. Every
// path's parent is a directory made here before it (Validate), so nothing
// is created through a symlink; O_NOFOLLOW and O_EXCL hold that anyway.
func create(root string, m *Manifest) error {
	for _, e := range m.Entries {
		p := filepath.Join(root, filepath.FromSlash(e.Path))
		switch e.Type {
		case TypeDir:
			if err := os.Mkdir(p, 0o700); err != nil {
				return err
			}
		case TypeFile:
			f, err := os.OpenFile(p, os.O_WRONLY|os.O_CREATE|os.O_EXCL|unix.O_NOFOLLOW, 0o600)
			if err != nil {
				return err
			}
			err = f.Truncate(e.Size)
			if cerr := f.Close(); err == nil {
				err = cerr
			}
			if err != nil {
				return err
			}
		}
	}
	return nil
}

type piece struct {
	path   string
	offset int64
	ref    Ref
}

// fill fetches every chunk and writes it in place, a bounded number at a
// time, in manifest order.
func fill(ctx context.Context, root string, m *Manifest, src *Tiered, workers int, c *fetchCounters) error {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	work := make(chan piece)
	var once sync.Once
	var firstErr error
	fail := func(err error) {
		once.Do(func() { firstErr = err })
		cancel()
	}
	var wg sync.WaitGroup
	for range workers {
		wg.Go(func() {
			for pc := range work {
				if err := writePiece(ctx, pc, src, c); err != nil {
					fail(err)
					return
				}
			}
		})
	}
feed:
	for _, e := range m.Entries {
		var off int64
		for _, r := range e.Chunks {
			pc := piece{filepath.Join(root, filepath.FromSlash(e.Path)), off, r}
			off += r.Size
			if isZeroChunk(r) {
				c.zero.Add(1)
				src.total.zero.Add(1)
				continue
			}
			select {
			case work <- pc:
			case <-ctx.Done():
				break feed
			}
		}
	}
	close(work)
	wg.Wait()
	if firstErr != nil {
		return firstErr
	}
	return ctx.Err()
}

func writePiece(ctx context.Context, pc piece, src *Tiered, c *fetchCounters) error {
	raw, err := src.read(ctx, pc.ref, c)
	if err != nil {
		return err
	}
	f, err := os.OpenFile(pc.path, os.O_WRONLY|unix.O_NOFOLLOW, 0)
	if err != nil {
		return err
	}
	_, err = f.WriteAt(raw, pc.offset)
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	return err
}

// finish makes the symlinks and special files and applies owners and modes
// (directories last, deepest first, so a read-only one is filled before).
func finish(root string, m *Manifest) error {
	asRoot := os.Geteuid() == 0
	for _, e := range m.Entries {
		p := filepath.Join(root, filepath.FromSlash(e.Path))
		var err error
		switch e.Type {
		case TypeSymlink:
			err = os.Symlink(e.Target, p)
		case TypeChar:
			err = unix.Mknod(p, unix.S_IFCHR|0o600, int(e.Rdev))
		case TypeBlock:
			err = unix.Mknod(p, unix.S_IFBLK|0o600, int(e.Rdev))
		case TypeFIFO:
			err = unix.Mkfifo(p, 0o600)
		}
		if err != nil {
			if errors.Is(err, unix.EPERM) {
				return fmt.Errorf("%w: %s: a %s needs root: %v", errdefs.ErrUnavailable, e.Path, e.Type, err)
			}
			return err
		}
		if asRoot {
			if err := os.Lchown(p, e.UID, e.GID); err != nil {
				return err
			}
		}
		// After chown, which clears setuid and setgid.
		if e.Type != TypeSymlink && e.Type != TypeDir {
			if err := unix.Fchmodat(unix.AT_FDCWD, p, e.Mode, 0); err != nil {
				return err
			}
		}
	}
	for i := len(m.Entries) - 1; i >= 0; i-- {
		if e := m.Entries[i]; e.Type == TypeDir {
			if err := unix.Fchmodat(unix.AT_FDCWD, filepath.Join(root, filepath.FromSlash(e.Path)), e.Mode, 0); err != nil {
				return err
			}
		}
	}
	return nil
}

// syncTree fsyncs every file and directory of the tree, a few at a time
// (not syncfs: that would also flush everything else dirty on the file
// system, which made restores' time depend on their neighbours).
func syncTree(ctx context.Context, root string, m *Manifest, workers int) error {
	paths := make(chan string)
	var once sync.Once
	var firstErr error
	var wg sync.WaitGroup
	for range workers {
		wg.Go(func() {
			for p := range paths {
				if err := fsync(p); err != nil {
					once.Do(func() { firstErr = err })
				}
			}
		})
	}
	for _, e := range m.Entries {
		if e.Type == TypeFile || e.Type == TypeDir {
			if ctx.Err() != nil {
				break
			}
			paths <- filepath.Join(root, filepath.FromSlash(e.Path))
		}
	}
	paths <- root
	close(paths)
	wg.Wait()
	if firstErr != nil {
		return firstErr
	}
	return ctx.Err()
}

func fsync(p string) error {
	// O_RDONLY works for files whose mode denies writing, and for dirs.
	f, err := os.OpenFile(p, os.O_RDONLY|unix.O_NOFOLLOW, 0)
	if err != nil {
		return err
	}
	err = f.Sync()
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	return err
}

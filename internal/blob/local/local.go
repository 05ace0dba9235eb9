// Package local is a blob.Store in a directory: the embedded default of
// `spore up`, and a node's view of a shared file system.
//
// Layout under the root directory:
//
//	objects/<key>           one regular file per object; the key's
//	                        elements are directories and the file name
//	staging/<id>/           a Put's temporary file, one directory per open
//	                        Store, locked (flock) while the Store is open
//
// A Put writes a temporary file in its staging directory, fsyncs it,
// renames it over objects/<key> and fsyncs the directory: readers see the
// old file or the whole new one, also after a crash. Open removes the
// staging directories no open Store holds (those of crashed processes),
// so a dead writer leaves nothing behind and a live one on the same file
// system keeps its temporary files. Every path is resolved through an
// os.Root, so no key (validated anyway) and no symbolic link planted in
// the directory reaches outside it.
//
// Keys are paths: an object "a" and an object "a/b" cannot both exist (the
// second Put is ErrConflict), as with versitygw's posix backend.
package local

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path"
	"slices"
	"strings"
	"syscall"

	"github.com/spore-run/spore/internal/blob"
	"github.com/spore-run/spore/internal/errdefs"
)

const (
	objectsDir = "objects"
	stagingDir = "staging"
)

// Store is a blob.Store in a directory. It is safe for concurrent use, also
// by several processes sharing the directory.
type Store struct {
	dir     string
	root    *os.Root
	staging string   // staging/<id>, relative to root
	lock    *os.File // staging/<id>, flocked while open
}

var _ blob.Store = (*Store)(nil)

// Open opens (creating it if needed) the store in dir.
func Open(dir string) (*Store, error) {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, fmt.Errorf("blob store %s: %w", dir, err)
	}
	root, err := os.OpenRoot(dir)
	if err != nil {
		return nil, fmt.Errorf("blob store %s: %w", dir, err)
	}
	s := &Store{dir: dir, root: root}
	if err := s.init(); err != nil {
		root.Close()
		return nil, fmt.Errorf("blob store %s: %w", dir, err)
	}
	return s, nil
}

func (s *Store) init() error {
	for _, d := range []string{objectsDir, stagingDir} {
		if err := s.root.MkdirAll(d, 0o755); err != nil {
			return err
		}
	}
	// The staging lock serializes the clean-up below with the creation and
	// locking of our own staging directory: without it another process's
	// Open could see our directory in the instant between its mkdir and its
	// flock and remove it.
	all, err := s.root.OpenFile(stagingDir, os.O_RDONLY, 0)
	if err != nil {
		return err
	}
	defer all.Close()
	if err := flock(all, syscall.LOCK_EX); err != nil {
		return err
	}
	defer flock(all, syscall.LOCK_UN)
	names, err := all.Readdirnames(-1)
	if err != nil {
		return err
	}
	for _, name := range names {
		p := path.Join(stagingDir, name)
		d, err := s.root.Open(p)
		if err != nil {
			continue
		}
		// Held by an open Store (here or in another process): keep it.
		if flock(d, syscall.LOCK_EX|syscall.LOCK_NB) == nil {
			s.root.RemoveAll(p)
		}
		d.Close()
	}
	var id [8]byte
	rand.Read(id[:])
	s.staging = path.Join(stagingDir, hex.EncodeToString(id[:]))
	if err := s.root.Mkdir(s.staging, 0o755); err != nil {
		return err
	}
	if s.lock, err = s.root.Open(s.staging); err != nil {
		return err
	}
	return flock(s.lock, syscall.LOCK_EX)
}

// Close removes the store's staging directory and releases the directory.
// Operations after Close fail.
func (s *Store) Close() error {
	err := s.root.RemoveAll(s.staging)
	if cerr := s.lock.Close(); err == nil {
		err = cerr
	}
	if cerr := s.root.Close(); err == nil {
		err = cerr
	}
	return err
}

// Path returns the file holding key's object (for tests and operators: a
// file changed behind the store's back is returned as it is).
func (s *Store) Path(key string) (string, error) {
	if err := blob.CheckKey(key); err != nil {
		return "", err
	}
	return path.Join(s.dir, objectsDir, key), nil
}

func objPath(key string) string { return objectsDir + "/" + key }

// Put implements blob.Store.
func (s *Store) Put(ctx context.Context, key string, r io.Reader, size int64) (err error) {
	if err := blob.CheckKey(key); err != nil {
		return err
	}
	if size < 0 {
		return errdefs.Invalidf("blob %s: negative size %d", key, size)
	}
	if err := ctx.Err(); err != nil {
		return fmt.Errorf("blob put %s: %w", key, err)
	}
	var id [8]byte
	rand.Read(id[:])
	tmp := path.Join(s.staging, hex.EncodeToString(id[:]))
	f, err := s.root.OpenFile(tmp, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o644)
	if err != nil {
		return fmt.Errorf("blob put %s: %w", key, err)
	}
	defer func() {
		if f != nil {
			f.Close()
		}
		if err != nil {
			s.root.Remove(tmp)
		}
	}()
	if _, err := io.Copy(f, blob.ExactReader(ctx, r, size)); err != nil {
		return fmt.Errorf("blob put %s: %w", key, err)
	}
	if err := f.Sync(); err != nil {
		return fmt.Errorf("blob put %s: %w", key, err)
	}
	if err := f.Close(); err != nil {
		f = nil
		return fmt.Errorf("blob put %s: %w", key, err)
	}
	f = nil
	if err := ctx.Err(); err != nil {
		return fmt.Errorf("blob put %s: %w", key, err)
	}
	dst := objPath(key)
	if err := s.rename(tmp, dst); err != nil {
		return fmt.Errorf("blob put %s: %w", key, err)
	}
	// The rename is durable once its directory is.
	if err := s.syncDir(path.Dir(dst)); err != nil {
		return fmt.Errorf("blob put %s: %w", key, err)
	}
	return nil
}

// rename moves tmp to dst, making dst's directories. A concurrent Delete
// may remove an emptied directory between the two steps, hence the retry.
func (s *Store) rename(tmp, dst string) error {
	var err error
	for range 10 {
		if err = s.root.MkdirAll(path.Dir(dst), 0o755); err != nil {
			if errors.Is(err, syscall.ENOTDIR) || errors.Is(err, fs.ErrExist) {
				return fmt.Errorf("%w: a prefix of the key is an object", errdefs.ErrConflict)
			}
			return err
		}
		err = s.root.Rename(tmp, dst)
		switch {
		case err == nil:
			return nil
		case errors.Is(err, fs.ErrNotExist):
			continue
		case errors.Is(err, syscall.EISDIR) || errors.Is(err, syscall.ENOTEMPTY) || errors.Is(err, fs.ErrExist):
			return fmt.Errorf("%w: the key is a prefix of other objects' keys", errdefs.ErrConflict)
		case errors.Is(err, syscall.ENOTDIR):
			return fmt.Errorf("%w: a prefix of the key is an object", errdefs.ErrConflict)
		default:
			return err
		}
	}
	return err
}

func (s *Store) syncDir(dir string) error {
	d, err := s.root.Open(dir)
	if err != nil {
		return err
	}
	defer d.Close()
	return d.Sync()
}

// open opens key's object file, which must be a regular file.
func (s *Store) open(ctx context.Context, op, key string) (*os.File, os.FileInfo, error) {
	if err := blob.CheckKey(key); err != nil {
		return nil, nil, err
	}
	if err := ctx.Err(); err != nil {
		return nil, nil, fmt.Errorf("blob %s %s: %w", op, key, err)
	}
	f, err := s.root.Open(objPath(key))
	if err != nil {
		return nil, nil, fmt.Errorf("blob %s %s: %w", op, key, fsErr(err))
	}
	fi, err := f.Stat()
	if err == nil && !fi.Mode().IsRegular() {
		err = fs.ErrNotExist
	}
	if err != nil {
		f.Close()
		return nil, nil, fmt.Errorf("blob %s %s: %w", op, key, fsErr(err))
	}
	return f, fi, nil
}

// Get implements blob.Store.
func (s *Store) Get(ctx context.Context, key string) (io.ReadCloser, error) {
	f, _, err := s.open(ctx, "get", key)
	if err != nil {
		return nil, err
	}
	return &ctxReader{ctx: ctx, r: f, c: f}, nil
}

// GetRange implements blob.Store.
func (s *Store) GetRange(ctx context.Context, key string, offset, length int64) (io.ReadCloser, error) {
	f, fi, err := s.open(ctx, "get", key)
	if err != nil {
		return nil, err
	}
	if err := blob.CheckRange(key, offset, length, fi.Size()); err != nil {
		f.Close()
		return nil, err
	}
	if length < 0 {
		length = fi.Size() - offset
	}
	return &ctxReader{ctx: ctx, r: io.NewSectionReader(f, offset, length), c: f}, nil
}

// Stat implements blob.Store.
func (s *Store) Stat(ctx context.Context, key string) (blob.Info, error) {
	if err := blob.CheckKey(key); err != nil {
		return blob.Info{}, err
	}
	if err := ctx.Err(); err != nil {
		return blob.Info{}, fmt.Errorf("blob stat %s: %w", key, err)
	}
	fi, err := s.root.Stat(objPath(key))
	if err == nil && !fi.Mode().IsRegular() {
		err = fs.ErrNotExist
	}
	if err != nil {
		return blob.Info{}, fmt.Errorf("blob stat %s: %w", key, fsErr(err))
	}
	return blob.Info{Key: key, Size: fi.Size(), Modified: fi.ModTime()}, nil
}

// Delete implements blob.Store.
func (s *Store) Delete(ctx context.Context, key string) error {
	if err := blob.CheckKey(key); err != nil {
		return err
	}
	if err := ctx.Err(); err != nil {
		return fmt.Errorf("blob delete %s: %w", key, err)
	}
	p := objPath(key)
	fi, err := s.root.Lstat(p)
	if errors.Is(err, fs.ErrNotExist) || errors.Is(err, syscall.ENOTDIR) || err == nil && fi.IsDir() {
		return nil
	}
	if err != nil {
		return fmt.Errorf("blob delete %s: %w", key, err)
	}
	if err := s.root.Remove(p); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return fmt.Errorf("blob delete %s: %w", key, err)
	}
	if err := s.syncDir(path.Dir(p)); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return fmt.Errorf("blob delete %s: %w", key, err)
	}
	// Prune the directories the delete emptied (Remove refuses a non-empty
	// one, so a concurrent Put into it wins; Put retries if it loses).
	for d := path.Dir(p); d != objectsDir; d = path.Dir(d) {
		if s.root.Remove(d) != nil {
			break
		}
	}
	return nil
}

// List implements blob.Store. It walks objects/ depth first, each
// directory's entries in key order (a directory "x" sorts as "x/", the
// position its keys take among its siblings), and descends only into
// directories that can hold keys with the prefix.
func (s *Store) List(ctx context.Context, prefix string, fn func(blob.Info) error) error {
	if err := blob.CheckPrefix(prefix); err != nil {
		return err
	}
	return s.walk(ctx, objectsDir, "", prefix, fn)
}

func (s *Store) walk(ctx context.Context, dir, keyDir, prefix string, fn func(blob.Info) error) error {
	if err := ctx.Err(); err != nil {
		return fmt.Errorf("blob list %q: %w", prefix, err)
	}
	d, err := s.root.Open(dir)
	if errors.Is(err, fs.ErrNotExist) && dir != objectsDir {
		return nil // removed by a concurrent Delete
	}
	if err != nil {
		return fmt.Errorf("blob list %q: %w", prefix, err)
	}
	entries, err := d.ReadDir(-1)
	d.Close()
	if errors.Is(err, fs.ErrNotExist) && dir != objectsDir {
		return nil // removed by a concurrent Delete after the Open (readdir of a removed directory)
	}
	if err != nil {
		return fmt.Errorf("blob list %q: %w", prefix, err)
	}
	sortName := func(e fs.DirEntry) string {
		if e.IsDir() {
			return e.Name() + "/"
		}
		return e.Name()
	}
	slices.SortFunc(entries, func(a, b fs.DirEntry) int { return strings.Compare(sortName(a), sortName(b)) })
	for _, e := range entries {
		key := keyDir + e.Name()
		switch {
		case e.IsDir():
			sub := key + "/"
			if strings.HasPrefix(sub, prefix) || strings.HasPrefix(prefix, sub) {
				if err := s.walk(ctx, dir+"/"+e.Name(), sub, prefix, fn); err != nil {
					return err
				}
			}
		case e.Type().IsRegular() && strings.HasPrefix(key, prefix) && blob.CheckKey(key) == nil:
			fi, err := e.Info()
			if errors.Is(err, fs.ErrNotExist) {
				continue // deleted since ReadDir
			}
			if err != nil {
				return fmt.Errorf("blob list %q: %w", prefix, err)
			}
			if err := fn(blob.Info{Key: key, Size: fi.Size(), Modified: fi.ModTime()}); err != nil {
				return err
			}
		}
	}
	return nil
}

// fsErr gives file system errors their kind.
func fsErr(err error) error {
	if errors.Is(err, fs.ErrNotExist) || errors.Is(err, syscall.ENOTDIR) {
		return fmt.Errorf("%w: %w", errdefs.ErrNotFound, err)
	}
	return err
}

func flock(f *os.File, how int) error {
	for {
		err := syscall.Flock(int(f.Fd()), how)
		if err != syscall.EINTR {
			return err
		}
	}
}

// ctxReader stops reading once ctx ends, as an S3 body does.
type ctxReader struct {
	ctx context.Context
	r   io.Reader
	c   io.Closer
}

func (r *ctxReader) Read(p []byte) (int, error) {
	if err := r.ctx.Err(); err != nil {
		return 0, err
	}
	return r.r.Read(p)
}

func (r *ctxReader) Close() error { return r.c.Close() }

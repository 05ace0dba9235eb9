// Package pool is a node's volume storage: one XFS file system with
// reflinks, in a sparse image under the data directory, loop-mounted,
// holding one ext4 image per volume (docs/volumes.md, "Storage").
//
// An image's size is its volume's quota (a full volume is ENOSPC inside
// and nothing else); a capture is a freeze of the mounted volume, one
// reflink of its image and a thaw: milliseconds, whatever the number of
// files; a copy (a fork child's, a rollback's) is one more reflink.
// Without mkfs.xfs the pool is a plain directory whose copies cost the
// image's written data (OpenPlain).
package pool

import (
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"time"

	"golang.org/x/sys/unix"

	"github.com/spore-run/spore/internal/errdefs"
	"github.com/spore-run/spore/internal/ids"
)

// Kernel ioctls golang.org/x/sys does not name: _IOWR('X', 119, int) and
// _IOWR('X', 120, int) (linux/fs.h).
const (
	fifreeze = 0xC0045877
	fithaw   = 0xC0045878
)

// MinPool is the smallest pool image mkfs.xfs accepts (300 MiB), rounded up.
const MinPool = 512 << 20

// MinImage is the smallest volume image: an ext4 file system with a
// journal needs a few MiB.
const MinImage = 16 << 20

// Pool is a node's volume pool. Its methods are safe to call concurrently;
// operations on one image are serialized.
type Pool struct {
	dir string // <data>/volumes: pool.img, pool/ (the XFS), mounts/<name>
	log *slog.Logger
	// plain: the images are in a directory of the data directory's own
	// file system, not in an XFS pool: a capture or copy that cannot
	// reflink copies the image's data (OpenPlain; docs/volumes.md,
	// "Fallback").
	plain bool

	mu      sync.Mutex
	mounted map[string]string // image name -> its mount point
	locks   map[string]*sync.Mutex
}

func (p *Pool) img() string           { return filepath.Join(p.dir, "pool.img") }
func (p *Pool) plainMark() string     { return filepath.Join(p.dir, "plain") }
func (p *Pool) fsDir() string         { return filepath.Join(p.dir, "pool") }
func (p *Pool) image(n string) string { return filepath.Join(p.fsDir(), n+".img") }

// MountPoint is where Mount mounts the image name.
func (p *Pool) MountPoint(name string) string { return filepath.Join(p.dir, "mounts", name) }

// Open makes (the first time: a sparse image of size bytes, formatted XFS
// with reflinks) and mounts the pool in dir. It needs root, loop devices
// and mkfs.xfs (xfsprogs); their absence is ErrUnavailable, saying which.
// Without mkfs.xfs, a pool made for the first time is a plain one
// (OpenPlain), logged as such; one made plain stays plain.
func Open(ctx context.Context, dir string, size int64, log *slog.Logger) (*Pool, error) {
	if size < MinPool {
		return nil, errdefs.Invalidf("volume pool size %d: at least %d bytes", size, MinPool)
	}
	return open(ctx, dir, size, false, log)
}

// OpenPlain opens the pool in dir as a plain one (made so the first time):
// its images are files in a directory of dir's own file system, with no
// XFS pool and its loop device; a capture or a copy reflinks the image
// where that file system can, and otherwise copies its data (sparse: the
// holes stay holes), which costs the image's written bytes each time.
// Each image still needs a loop device to be mounted. A dir holding an
// XFS pool is ErrConflict.
func OpenPlain(ctx context.Context, dir string, log *slog.Logger) (*Pool, error) {
	return open(ctx, dir, 0, true, log)
}

// Made reports whether dir holds a pool (made by a first volume).
func Made(dir string) bool {
	for _, f := range []string{"pool.img", "plain"} {
		if _, err := os.Stat(filepath.Join(dir, f)); err == nil {
			return true
		}
	}
	return false
}

func open(ctx context.Context, dir string, size int64, plain bool, log *slog.Logger) (*Pool, error) {
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	if err := os.MkdirAll(filepath.Join(dir, "mounts"), 0o700); err != nil {
		return nil, fmt.Errorf("volume pool: %w", err)
	}
	// The kernel names a loop device's backing file by its resolved path
	// (loopReleased compares them).
	dir, err := filepath.Abs(dir)
	if err == nil {
		dir, err = filepath.EvalSymlinks(dir)
	}
	if err != nil {
		return nil, fmt.Errorf("volume pool: %w", err)
	}
	p := &Pool{dir: dir, log: log, mounted: map[string]string{}, locks: map[string]*sync.Mutex{}}
	if err := os.MkdirAll(p.fsDir(), 0o700); err != nil {
		return nil, fmt.Errorf("volume pool: %w", err)
	}
	_, markErr := os.Stat(p.plainMark())
	_, imgErr := os.Stat(p.img())
	switch {
	case markErr == nil:
		p.plain = true
		return p, nil
	case plain && imgErr == nil:
		return nil, errdefs.Conflictf("volume pool %s is an XFS pool: it cannot be opened as a plain one", dir)
	case !plain && errors.Is(imgErr, fs.ErrNotExist):
		if _, err := exec.LookPath("mkfs.xfs"); err != nil {
			log.Warn("volumes without reflinks: no mkfs.xfs (apt-get install xfsprogs; `spore setup` installs it); each capture and copy of a volume copies its data (docs/volumes.md, \"Fallback\")", "dir", dir)
			plain = true
		}
	}
	if plain {
		if err := os.WriteFile(p.plainMark(), []byte("images in pool/, copied where they cannot be reflinked\n"), 0o600); err != nil {
			return nil, fmt.Errorf("volume pool: %w", err)
		}
		p.plain = true
		return p, nil
	}
	if isMountPoint(p.fsDir()) {
		return p, nil // mounted by a previous run of the node
	}
	if errors.Is(imgErr, fs.ErrNotExist) {
		if err := p.format(ctx, size); err != nil {
			return nil, err
		}
	}
	if err := run(ctx, "mount", "-o", "loop", p.img(), p.fsDir()); err != nil {
		return nil, fmt.Errorf("%w: mount the volume pool: %v", errdefs.ErrUnavailable, err)
	}
	return p, nil
}

// format makes the pool image: written to a temporary name and renamed,
// so a crash leaves no half-made pool.
func (p *Pool) format(ctx context.Context, size int64) error {
	if _, err := exec.LookPath("mkfs.xfs"); err != nil {
		return fmt.Errorf("%w: volumes need mkfs.xfs (apt-get install xfsprogs; `spore setup` installs it)", errdefs.ErrUnavailable)
	}
	tmp := p.img() + ".new"
	os.Remove(tmp)
	if err := truncate(tmp, size); err != nil {
		return fmt.Errorf("volume pool: %w", err)
	}
	if err := run(ctx, "mkfs.xfs", "-q", "-m", "reflink=1", tmp); err != nil {
		os.Remove(tmp)
		return fmt.Errorf("volume pool: format: %w", err)
	}
	return os.Rename(tmp, p.img())
}

// Close unmounts every volume this pool mounted, then the pool.
func (p *Pool) Close() error {
	// Every image mounted, also by an earlier run of the node.
	ents, _ := os.ReadDir(filepath.Join(p.dir, "mounts"))
	var names []string
	for _, e := range ents {
		if n, view := strings.CutSuffix(e.Name(), ".ro"); !view {
			names = append(names, n)
		}
	}
	var errs []error
	for _, n := range names {
		if err := p.Unmount(context.Background(), n); err != nil {
			errs = append(errs, err)
		}
	}
	// The images' loop devices go with the last sandbox that held a copy
	// of their mounts (Unmount).
	if len(errs) == 0 {
		if err := loopReleased(context.Background(), p.fsDir()+"/"); err != nil {
			errs = append(errs, err)
		}
	}
	if isMountPoint(p.fsDir()) {
		if err := run(context.Background(), "umount", p.fsDir()); err != nil {
			errs = append(errs, fmt.Errorf("unmount the volume pool: %w", err))
		} else if err := loopReleased(context.Background(), p.img()); err != nil {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

// loopReleased waits until no loop device is backed by file (or, file
// ending in "/", by a file under that directory): the kernel detaches an
// unmounted loop device (autoclear) after umount returns, and the pool
// can be unmounted, or a test end, only once its images' devices are
// gone.
func loopReleased(ctx context.Context, file string) error {
	ctx, cancel := context.WithTimeout(ctx, 2*time.Minute) // writing back a busy device can take seconds
	defer cancel()
	for {
		held := ""
		backs, _ := filepath.Glob("/sys/block/loop*/loop/backing_file")
		for _, b := range backs {
			got, err := os.ReadFile(b)
			back := strings.TrimSpace(string(got))
			if err == nil && (back == file || strings.HasSuffix(file, "/") && strings.HasPrefix(back, file)) {
				held = filepath.Base(filepath.Dir(filepath.Dir(b)))
			}
		}
		if held == "" {
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("%s still holds %s after its unmount", held, file)
		case <-time.After(5 * time.Millisecond):
		}
	}
}

// lock serializes the operations on one image.
func (p *Pool) lock(name string) func() {
	p.mu.Lock()
	l, ok := p.locks[name]
	if !ok {
		l = &sync.Mutex{}
		p.locks[name] = l
	}
	p.mu.Unlock()
	l.Lock()
	return l.Unlock
}

func checkName(name string) error { return ids.Validate("volume image", name) }

// Create makes the image name: size bytes (the quota), formatted ext4 with
// no reserved blocks, its root directory owned by uid:gid. An image that
// exists is ErrAlreadyExists.
func (p *Pool) Create(ctx context.Context, name string, size int64, uid, gid int) error {
	if err := checkName(name); err != nil {
		return err
	}
	if size < MinImage {
		return errdefs.Invalidf("volume image %s: %d bytes, under %d", name, size, MinImage)
	}
	defer p.lock(name)()
	if _, err := os.Stat(p.image(name)); err == nil {
		return fmt.Errorf("volume image %s: %w", name, errdefs.ErrAlreadyExists)
	}
	tmp := p.image(name) + ".new"
	os.Remove(tmp)
	if err := truncate(tmp, size); err != nil {
		return fmt.Errorf("volume image %s: %w", name, err)
	}
	if err := run(ctx, "mkfs.ext4", "-q", "-F", "-m", "0", "-E", fmt.Sprintf("root_owner=%d:%d,nodiscard", uid, gid), tmp); err != nil {
		os.Remove(tmp)
		return fmt.Errorf("volume image %s: format: %w", name, err)
	}
	return os.Rename(tmp, p.image(name))
}

// MountAll mounts every image in the pool that want accepts (nil: all),
// with its read-only view: at a node's start, so the sandboxes that
// mount them restore.
func (p *Pool) MountAll(ctx context.Context, want func(name string) bool) error {
	names, err := p.Images()
	if err != nil {
		return err
	}
	var errs []error
	for _, name := range names {
		if want != nil && !want(name) {
			continue
		}
		if _, err := p.View(ctx, name); err != nil {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

// Exists reports whether the image name is in the pool.
func (p *Pool) Exists(name string) bool {
	if checkName(name) != nil {
		return false
	}
	_, err := os.Stat(p.image(name))
	return err == nil
}

// Mount mounts the image name at MountPoint(name) (read-only if ro) and
// returns that path. A mounted image is returned as is.
func (p *Pool) Mount(ctx context.Context, name string, ro bool) (string, error) {
	if err := checkName(name); err != nil {
		return "", err
	}
	defer p.lock(name)()
	mp := p.MountPoint(name)
	p.mu.Lock()
	_, ok := p.mounted[name]
	p.mu.Unlock()
	if ok {
		return mp, nil
	}
	if _, err := os.Stat(p.image(name)); err != nil {
		return "", fmt.Errorf("volume image %s: %w", name, errdefs.ErrNotFound)
	}
	if isMountPoint(mp) { // mounted by a previous run of the node
		p.mu.Lock()
		p.mounted[name] = mp
		p.mu.Unlock()
		return mp, nil
	}
	if err := os.MkdirAll(mp, 0o700); err != nil {
		return "", fmt.Errorf("volume image %s: %w", name, err)
	}
	// mount(8) reuses a loop device that still backs the image's file (a
	// copy of an earlier mount lives on in a sandbox's runsc processes,
	// see Unmount): one file system instance per image, never two
	// (TestMountWhileACopyHoldsTheImage).
	opts := "loop"
	if ro {
		opts += ",ro"
	}
	if err := run(ctx, "mount", "-t", "ext4", "-o", opts, p.image(name), mp); err != nil {
		return "", fmt.Errorf("%w: mount volume image %s: %v", errdefs.ErrUnavailable, name, err)
	}
	p.mu.Lock()
	p.mounted[name] = mp
	p.mu.Unlock()
	return mp, nil
}

// ViewPoint is where View shows the image name read-only.
func (p *Pool) ViewPoint(name string) string { return filepath.Join(p.dir, "mounts", name+".ro") }

// View mounts the image name (read-write, as Mount) and a read-only bind
// of it at ViewPoint(name), and returns that path: a sandbox that mounts
// a volume read-only gets EROFS from the host, whatever it does inside.
func (p *Pool) View(ctx context.Context, name string) (string, error) {
	mp, err := p.Mount(ctx, name, false)
	if err != nil {
		return "", err
	}
	defer p.lock(name)()
	vp := p.ViewPoint(name)
	if isMountPoint(vp) {
		return vp, nil
	}
	if err := os.MkdirAll(vp, 0o700); err != nil {
		return "", err
	}
	if err := run(ctx, "mount", "--bind", mp, vp); err != nil {
		return "", fmt.Errorf("%w: read-only view of volume image %s: %v", errdefs.ErrUnavailable, name, err)
	}
	if err := run(ctx, "mount", "-o", "remount,bind,ro", vp); err != nil {
		run(ctx, "umount", vp)
		return "", fmt.Errorf("%w: read-only view of volume image %s: %v", errdefs.ErrUnavailable, name, err)
	}
	return vp, nil
}

// Unmount unmounts the image name and its read-only view (its loop device
// goes with it). An image that is not mounted is not an error.
func (p *Pool) Unmount(ctx context.Context, name string) error {
	if err := checkName(name); err != nil {
		return err
	}
	defer p.lock(name)()
	if vp := p.ViewPoint(name); isMountPoint(vp) {
		if err := run(ctx, "umount", vp); err != nil {
			return fmt.Errorf("unmount the view of volume image %s: %w", name, err)
		}
		os.Remove(vp)
	}
	// Its loop device is not waited for: every sandbox made while the
	// image was mounted holds a copy of the mount (in the runsc
	// processes' detached mount trees) until it goes. Mount reuses that
	// device meanwhile, and Close waits for them all.
	mp := p.MountPoint(name)
	if isMountPoint(mp) {
		if err := run(ctx, "umount", mp); err != nil {
			return fmt.Errorf("unmount volume image %s: %w", name, err)
		}
	}
	p.mu.Lock()
	delete(p.mounted, name)
	p.mu.Unlock()
	os.Remove(mp)
	return nil
}

// Capture copies the image src to the new image dst as it is at this
// instant: a mounted src is frozen (its dirty data written to the image,
// writers held) for the reflink and thawed after. dst that exists is
// ErrAlreadyExists; a crash leaves no partial dst.
func (p *Pool) Capture(ctx context.Context, src, dst string) error {
	for _, n := range []string{src, dst} {
		if err := checkName(n); err != nil {
			return err
		}
	}
	defer p.lock(src)()
	p.mu.Lock()
	mp, mounted := p.mounted[src]
	p.mu.Unlock()
	if mounted {
		thaw, err := freeze(mp)
		if err != nil {
			return fmt.Errorf("capture volume image %s: %w", src, err)
		}
		defer thaw()
	}
	return p.clone(src, dst)
}

// Flush writes a mounted image's dirty data back to its file and the
// file's to the disk, without holding writers: done before a Capture
// (whose freeze and reflink must write back whatever is still dirty then,
// with the sandbox paused), it leaves the capture only what was written
// meanwhile. An image not mounted is not an error.
func (p *Pool) Flush(ctx context.Context, name string) error {
	if err := checkName(name); err != nil {
		return err
	}
	p.mu.Lock()
	mp, mounted := p.mounted[name]
	p.mu.Unlock()
	if !mounted {
		return nil
	}
	for _, path := range []string{mp, p.image(name)} {
		f, err := os.Open(path)
		if err != nil {
			return err
		}
		if path == mp {
			err = unix.Syncfs(int(f.Fd()))
		} else {
			err = f.Sync()
		}
		f.Close()
		if err != nil {
			return fmt.Errorf("flush volume image %s: %w", name, err)
		}
	}
	return nil
}

// Copy copies the image src (not mounted by a writer: a snapshot's copy)
// to the new image dst.
func (p *Pool) Copy(ctx context.Context, src, dst string) error {
	for _, n := range []string{src, dst} {
		if err := checkName(n); err != nil {
			return err
		}
	}
	return p.clone(src, dst)
}

// clone reflinks src's image to dst's (through a temporary name, renamed
// once whole); a plain pool whose file system cannot reflink copies it.
func (p *Pool) clone(src, dst string) error {
	if _, err := os.Stat(p.image(dst)); err == nil {
		return fmt.Errorf("volume image %s: %w", dst, errdefs.ErrAlreadyExists)
	}
	in, err := os.Open(p.image(src))
	if errors.Is(err, fs.ErrNotExist) {
		return fmt.Errorf("volume image %s: %w", src, errdefs.ErrNotFound)
	}
	if err != nil {
		return err
	}
	defer in.Close()
	tmp := p.image(dst) + ".new"
	out, err := os.OpenFile(tmp, os.O_CREATE|os.O_TRUNC|os.O_WRONLY, 0o600)
	if err != nil {
		return err
	}
	err = unix.IoctlFileClone(int(out.Fd()), int(in.Fd()))
	if err != nil && p.plain && cannotReflink(err) {
		err = sparseCopy(out, in)
	}
	if err != nil {
		out.Close()
		os.Remove(tmp)
		return fmt.Errorf("copy volume image %s to %s: %w", src, dst, err)
	}
	if err := out.Sync(); err != nil {
		out.Close()
		os.Remove(tmp)
		return err
	}
	if err := out.Close(); err != nil {
		os.Remove(tmp)
		return err
	}
	return os.Rename(tmp, p.image(dst))
}

// Rename makes the image src the image dst, replacing dst's (both
// unmounted first): the kernel's rename, so a crash leaves one or the
// other. A missing src with dst there is done already.
func (p *Pool) Rename(ctx context.Context, src, dst string) error {
	for _, n := range []string{src, dst} {
		if err := checkName(n); err != nil {
			return err
		}
		if err := p.Unmount(ctx, n); err != nil {
			return err
		}
	}
	defer p.lock(dst)()
	err := os.Rename(p.image(src), p.image(dst))
	if errors.Is(err, fs.ErrNotExist) {
		if _, serr := os.Stat(p.image(dst)); serr == nil {
			return nil
		}
		return fmt.Errorf("volume image %s: %w", src, errdefs.ErrNotFound)
	}
	if err != nil {
		return fmt.Errorf("rename volume image %s to %s: %w", src, dst, err)
	}
	return nil
}

// Images lists the images in the pool.
func (p *Pool) Images() ([]string, error) {
	ents, err := os.ReadDir(p.fsDir())
	if err != nil {
		return nil, err
	}
	var out []string
	for _, e := range ents {
		if name, ok := strings.CutSuffix(e.Name(), ".img"); ok && checkName(name) == nil {
			out = append(out, name)
		}
	}
	return out, nil
}

// Published is a directory holding the image name alone, as the file
// "image" (a hard link: no copy), for a packer of directories (the blob
// store's). The image must not change while it is read: a snapshot's
// copy.
func (p *Pool) Published(name string) (string, error) {
	if err := checkName(name); err != nil {
		return "", err
	}
	defer p.lock(name)()
	if _, err := os.Stat(p.image(name)); err != nil {
		return "", fmt.Errorf("volume image %s: %w", name, errdefs.ErrNotFound)
	}
	dir := filepath.Join(p.fsDir(), ".published", name)
	if _, err := os.Stat(filepath.Join(dir, "image")); err == nil {
		return dir, nil
	}
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return "", err
	}
	if err := os.Link(p.image(name), filepath.Join(dir, "image")); err != nil && !errors.Is(err, fs.ErrExist) {
		return "", err
	}
	return dir, nil
}

// Install makes the image name from what fill writes into the directory
// it is given (the file "image", as Published shows it): written aside
// and renamed into place once whole. An image that exists is kept.
func (p *Pool) Install(ctx context.Context, name string, fill func(dir string) error) error {
	if err := checkName(name); err != nil {
		return err
	}
	defer p.lock(name)()
	if _, err := os.Stat(p.image(name)); err == nil {
		return nil
	}
	in := filepath.Join(p.fsDir(), ".incoming")
	if err := os.MkdirAll(in, 0o700); err != nil {
		return err
	}
	tmp := filepath.Join(in, name)
	os.RemoveAll(tmp)
	defer os.RemoveAll(tmp)
	if err := fill(tmp); err != nil {
		return fmt.Errorf("install volume image %s: %w", name, err)
	}
	if err := os.Rename(filepath.Join(tmp, "image"), p.image(name)); err != nil {
		return fmt.Errorf("install volume image %s: %w", name, err)
	}
	return nil
}

// Remove deletes the image name (unmounting it first). A missing image is
// not an error.
func (p *Pool) Remove(ctx context.Context, name string) error {
	if err := p.Unmount(ctx, name); err != nil {
		return err
	}
	defer p.lock(name)()
	os.RemoveAll(filepath.Join(p.fsDir(), ".published", name))
	if err := os.Remove(p.image(name)); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return fmt.Errorf("remove volume image %s: %w", name, err)
	}
	return nil
}

// Usage is a mounted image's bytes in use and its capacity, as its file
// system counts them.
func (p *Pool) Usage(name string) (used, capacity int64, err error) {
	p.mu.Lock()
	mp, ok := p.mounted[name]
	p.mu.Unlock()
	if !ok {
		return 0, 0, fmt.Errorf("volume image %s is not mounted: %w", name, errdefs.ErrConflict)
	}
	var st unix.Statfs_t
	if err := unix.Statfs(mp, &st); err != nil {
		return 0, 0, err
	}
	capacity = int64(st.Blocks) * st.Bsize
	return capacity - int64(st.Bfree)*st.Bsize, capacity, nil
}

// Stored is the bytes the pool's file system holds for the image name
// (reflinked extents counted in each image that shares them).
func (p *Pool) Stored(name string) (int64, error) {
	var st unix.Stat_t
	if err := unix.Stat(p.image(name), &st); err != nil {
		return 0, err
	}
	return st.Blocks * 512, nil
}

// freeze freezes the file system mounted at mp and returns its thaw.
func freeze(mp string) (func(), error) {
	d, err := os.Open(mp)
	if err != nil {
		return nil, err
	}
	if _, _, e := unix.Syscall(unix.SYS_IOCTL, d.Fd(), fifreeze, 0); e != 0 {
		d.Close()
		return nil, fmt.Errorf("freeze %s: %w", mp, e)
	}
	return func() {
		unix.Syscall(unix.SYS_IOCTL, d.Fd(), fithaw, 0)
		d.Close()
	}, nil
}

func truncate(path string, size int64) error {
	f, err := os.OpenFile(path, os.O_CREATE|os.O_EXCL|os.O_WRONLY, 0o600)
	if err != nil {
		return err
	}
	if err := f.Truncate(size); err != nil {
		f.Close()
		os.Remove(path)
		return err
	}
	return f.Close()
}

// isMountPoint reports whether dir is a mount point (its device differs
// from its parent's).
func isMountPoint(dir string) bool {
	var a, b unix.Stat_t
	if unix.Stat(dir, &a) != nil || unix.Stat(filepath.Dir(dir), &b) != nil {
		return false
	}
	return a.Dev != b.Dev
}

func run(ctx context.Context, name string, args ...string) error {
	out, err := exec.CommandContext(ctx, name, args...).CombinedOutput()
	if err != nil {
		return fmt.Errorf("%s %s: %w: %s", name, strings.Join(args, " "), err, strings.TrimSpace(string(out)))
	}
	return nil
}

// cannotReflink reports whether a FICLONE failed because the file system
// has no reflinks (not because of the files).
func cannotReflink(err error) bool {
	return errors.Is(err, unix.EOPNOTSUPP) || errors.Is(err, unix.ENOTSUP) || errors.Is(err, unix.EXDEV) ||
		errors.Is(err, unix.EINVAL) || errors.Is(err, unix.ENOTTY)
}

// sparseCopy copies in's data to out, region by region (SEEK_DATA and
// SEEK_HOLE, copy_file_range): holes stay holes, so a mostly empty image
// costs what was written to it. out ends at in's size.
func sparseCopy(out, in *os.File) error {
	st, err := in.Stat()
	if err != nil {
		return err
	}
	size := st.Size()
	ifd, ofd := int(in.Fd()), int(out.Fd())
	for off := int64(0); off < size; {
		data, err := unix.Seek(ifd, off, unix.SEEK_DATA)
		if errors.Is(err, unix.ENXIO) {
			break // only a hole is left
		}
		if err != nil {
			return fmt.Errorf("seek data: %w", err)
		}
		hole, err := unix.Seek(ifd, data, unix.SEEK_HOLE)
		if err != nil {
			return fmt.Errorf("seek hole: %w", err)
		}
		for r, w := data, data; r < hole; {
			n, err := unix.CopyFileRange(ifd, &r, ofd, &w, int(min(hole-r, 1<<30)), 0)
			if err != nil {
				return fmt.Errorf("copy data: %w", err)
			}
			if n == 0 {
				return fmt.Errorf("copy data: %w", io.ErrUnexpectedEOF)
			}
		}
		off = hole
	}
	return out.Truncate(size)
}

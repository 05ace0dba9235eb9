package pool_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"

	"github.com/spore-run/spore/internal/errdefs"
	"github.com/spore-run/spore/internal/testenv"
	"github.com/spore-run/spore/internal/volume/pool"
)

// open makes a pool in a fresh directory; the test's cleanup closes it and
// checks that no loop device is left on its images.
func open(t testing.TB, size ...int64) (*pool.Pool, string) {
	t.Helper()
	testenv.RealTier(t)
	dir := t.TempDir()
	sz := int64(2 << 30)
	if len(size) > 0 {
		sz = size[0]
	}
	p, err := pool.Open(context.Background(), dir, sz, nil)
	if err != nil {
		t.Fatalf("open the pool (needs root, loop devices and xfsprogs): %v", err)
	}
	t.Cleanup(func() {
		if err := p.Close(); err != nil {
			t.Errorf("close: %v", err)
		}
		if out, _ := exec.Command("losetup", "-j", filepath.Join(dir, "pool.img")).CombinedOutput(); len(bytes.TrimSpace(out)) != 0 {
			t.Errorf("loop devices left: %s", out)
		}
	})
	return p, dir
}

func write(t testing.TB, path, s string) {
	t.Helper()
	if err := os.WriteFile(path, []byte(s), 0o644); err != nil {
		t.Fatal(err)
	}
}

func read(t testing.TB, path string) string {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

// openPlain is open for a plain pool (no XFS: copies where reflinks are
// missing).
func openPlain(t testing.TB) (*pool.Pool, string) {
	t.Helper()
	testenv.RealTier(t)
	dir := t.TempDir()
	p, err := pool.OpenPlain(context.Background(), dir, nil)
	if err != nil {
		t.Fatalf("open a plain pool: %v", err)
	}
	t.Cleanup(func() {
		if err := p.Close(); err != nil {
			t.Errorf("close: %v", err)
		}
		if out, _ := exec.Command("losetup", "-a").CombinedOutput(); bytes.Contains(out, []byte(dir)) {
			t.Errorf("loop devices left: %s", out)
		}
	})
	return p, dir
}

// A capture of a mounted volume holds what was written before it, even
// unsynced (the freeze writes it to the image), and nothing written
// after; a copy of the capture is a volume of its own.
func TestCaptureAndCopy(t *testing.T) {
	p, _ := open(t)
	captureAndCopy(t, p)
}

// The fallback without XFS reflinks (docs/volumes.md): a plain pool keeps
// the images in a directory of the data directory's file system and
// copies them where it cannot reflink: the same semantics as the XFS
// pool's; a copy costs the image's written data only (its holes stay
// holes); reopened, with or without a size, it stays plain; an XFS pool
// cannot be opened as a plain one.
func TestPlainPool(t *testing.T) {
	p, dir := openPlain(t)
	captureAndCopy(t, p)
	ctx := context.Background()
	mp, err := p.Mount(ctx, "va", false)
	if err != nil {
		t.Fatal(err)
	}
	write(t, filepath.Join(mp, "data"), strings.Repeat("x", 8<<20))
	if err := p.Capture(ctx, "va", "s8"); err != nil {
		t.Fatal(err)
	}
	var st syscall.Stat_t
	if err := syscall.Stat(filepath.Join(dir, "pool", "s8.img"), &st); err != nil {
		t.Fatal(err)
	}
	if st.Size != 64<<20 || st.Blocks*512 < 8<<20 || st.Blocks*512 > 32<<20 {
		t.Fatalf("the capture of a 64 MiB image holding 8 MiB: %d bytes, %d on disk; want the size, sparse", st.Size, st.Blocks*512)
	}
	if err := p.Close(); err != nil {
		t.Fatal(err)
	}
	if !pool.Made(dir) {
		t.Fatal("a plain pool is not seen as made")
	}
	q, err := pool.Open(ctx, dir, 2<<30, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer q.Close()
	if _, err := os.Stat(filepath.Join(dir, "pool.img")); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("a plain pool reopened made an XFS pool: %v", err)
	}
	mp, err = q.Mount(ctx, "s8", true)
	if err != nil {
		t.Fatal(err)
	}
	if got := read(t, filepath.Join(mp, "data")); len(got) != 8<<20 {
		t.Fatalf("the capture reopened holds %d bytes", len(got))
	}
	_, xfs := open(t)
	if _, err := pool.OpenPlain(ctx, xfs, nil); !errdefs.IsConflict(err) {
		t.Fatalf("an XFS pool opened as a plain one: %v", err)
	}
}

func captureAndCopy(t *testing.T, p *pool.Pool) {
	ctx := context.Background()
	if err := p.Create(ctx, "va", 64<<20, 1000, 1000); err != nil {
		t.Fatal(err)
	}
	mp, err := p.Mount(ctx, "va", false)
	if err != nil {
		t.Fatal(err)
	}
	var st syscall.Stat_t
	if err := syscall.Stat(mp, &st); err != nil || st.Uid != 1000 || st.Gid != 1000 {
		t.Fatalf("the volume's root: uid %d gid %d (%v), want 1000", st.Uid, st.Gid, err)
	}
	write(t, filepath.Join(mp, "f"), "one")
	if err := p.Capture(ctx, "va", "s1"); err != nil {
		t.Fatal(err)
	}
	write(t, filepath.Join(mp, "f"), "two")
	write(t, filepath.Join(mp, "g"), "after")
	if err := p.Copy(ctx, "s1", "c1"); err != nil {
		t.Fatal(err)
	}
	cp, err := p.Mount(ctx, "c1", false)
	if err != nil {
		t.Fatal(err)
	}
	if got := read(t, filepath.Join(cp, "f")); got != "one" {
		t.Fatalf("the copy of the capture holds %q, want one", got)
	}
	if _, err := os.Stat(filepath.Join(cp, "g")); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("a file written after the capture is in its copy: %v", err)
	}
	write(t, filepath.Join(cp, "f"), "child")
	if got := read(t, filepath.Join(mp, "f")); got != "two" {
		t.Fatalf("the original holds %q after the copy's write, want two", got)
	}
	// Refused, nothing changed.
	for _, err := range []error{p.Capture(ctx, "va", "s1"), p.Copy(ctx, "va", "c1"), p.Create(ctx, "va", 64<<20, 0, 0)} {
		if !errdefs.IsAlreadyExists(err) {
			t.Fatalf("onto an existing image: %v", err)
		}
	}
	if err := p.Copy(ctx, "missing", "c2"); !errdefs.IsNotFound(err) {
		t.Fatalf("copy of a missing image: %v", err)
	}
	for _, bad := range []string{"../x", "a/b", "", "."} {
		if err := p.Create(ctx, bad, 64<<20, 0, 0); !errdefs.IsInvalidArgument(err) {
			t.Fatalf("Create(%q): %v", bad, err)
		}
		if _, err := p.Mount(ctx, bad, false); !errdefs.IsInvalidArgument(err) {
			t.Fatalf("Mount(%q): %v", bad, err)
		}
	}
	if err := p.Remove(ctx, "c1"); err != nil || p.Exists("c1") {
		t.Fatalf("remove: %v", err)
	}
	if err := p.Remove(ctx, "c1"); err != nil {
		t.Fatalf("remove again: %v", err)
	}
}

// The image's size is the quota: a write past it is ENOSPC, what was
// written stays readable, and room freed is usable again.
func TestQuotaIsENOSPC(t *testing.T) {
	p, _ := open(t)
	ctx := context.Background()
	if err := p.Create(ctx, "vq", 32<<20, 0, 0); err != nil {
		t.Fatal(err)
	}
	mp, err := p.Mount(ctx, "vq", false)
	if err != nil {
		t.Fatal(err)
	}
	write(t, filepath.Join(mp, "keep"), "kept")
	f, err := os.Create(filepath.Join(mp, "big"))
	if err != nil {
		t.Fatal(err)
	}
	chunk := bytes.Repeat([]byte{7}, 1<<20)
	var werr error
	for i := 0; i < 64 && werr == nil; i++ {
		_, werr = f.Write(chunk)
	}
	if werr == nil {
		werr = f.Sync()
	}
	f.Close()
	if !errors.Is(werr, syscall.ENOSPC) {
		t.Fatalf("64 MiB into a 32 MiB volume: %v, want ENOSPC", werr)
	}
	used, capacity, err := p.Usage("vq")
	if err != nil || capacity > 32<<20 || used < capacity*9/10 {
		t.Fatalf("usage of a full volume: %d of %d (%v)", used, capacity, err)
	}
	if got := read(t, filepath.Join(mp, "keep")); got != "kept" {
		t.Fatalf("after ENOSPC: %q", got)
	}
	os.Remove(filepath.Join(mp, "big"))
	write(t, filepath.Join(mp, "again"), "room")
}

// A read-only mount refuses writes with EROFS.
func TestReadOnlyMount(t *testing.T) {
	p, _ := open(t)
	ctx := context.Background()
	if err := p.Create(ctx, "vr", 32<<20, 0, 0); err != nil {
		t.Fatal(err)
	}
	mp, err := p.Mount(ctx, "vr", true)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(mp, "x"), []byte("x"), 0o644); !errors.Is(err, syscall.EROFS) {
		t.Fatalf("write on a read-only mount: %v, want EROFS", err)
	}
	// A read-only view of a read-write mount: the writer's files show,
	// the view refuses writes.
	if err := p.Create(ctx, "vw", 32<<20, 0, 0); err != nil {
		t.Fatal(err)
	}
	rw, err := p.Mount(ctx, "vw", false)
	if err != nil {
		t.Fatal(err)
	}
	vp, err := p.View(ctx, "vw")
	if err != nil || vp == rw {
		t.Fatalf("view %q (mount %q): %v", vp, rw, err)
	}
	write(t, filepath.Join(rw, "f"), "from the writer")
	if got := read(t, filepath.Join(vp, "f")); got != "from the writer" {
		t.Fatalf("through the view: %q", got)
	}
	if err := os.WriteFile(filepath.Join(vp, "g"), []byte("x"), 0o644); !errors.Is(err, syscall.EROFS) {
		t.Fatalf("write through the view: %v, want EROFS", err)
	}
	if again, err := p.View(ctx, "vw"); err != nil || again != vp {
		t.Fatalf("view again: %q %v", again, err)
	}
}

// The pool outlives the node process: reopened, its images are there.
func TestReopen(t *testing.T) {
	testenv.RealTier(t)
	dir := t.TempDir()
	ctx := context.Background()
	p, err := pool.Open(ctx, dir, 2<<30, nil)
	if err != nil {
		t.Fatal(err)
	}
	if err := p.Create(ctx, "vk", 32<<20, 0, 0); err != nil {
		p.Close()
		t.Fatal(err)
	}
	mp, err := p.Mount(ctx, "vk", false)
	if err == nil {
		write(t, filepath.Join(mp, "f"), "persisted")
	}
	if err := p.Close(); err != nil {
		t.Fatal(err)
	}
	q, err := pool.Open(ctx, dir, 2<<30, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer q.Close()
	mp, err = q.Mount(ctx, "vk", false)
	if err != nil {
		t.Fatal(err)
	}
	if got := read(t, filepath.Join(mp, "f")); got != "persisted" {
		t.Fatalf("after reopen: %q", got)
	}
	if _, err := pool.Open(ctx, t.TempDir(), 1<<20, nil); !errdefs.IsInvalidArgument(err) || !strings.Contains(err.Error(), "at least") {
		t.Fatalf("a pool too small: %v", err)
	}
}

// BenchmarkCapture: a capture of a mounted 1 GiB volume with 512 MiB
// rewritten since the last one (the rewrite is outside the timer):
// dirty, the freeze writes those 512 MiB back first; written-back (a
// sync outside the timer), the capture is the freeze and the reflink.
func BenchmarkCapture(b *testing.B) {
	for _, c := range []struct {
		name   string
		synced bool
		plain  bool
	}{{"dirty", false, false}, {"written-back", true, false}, {"plain/written-back", true, true}} {
		synced := c.synced
		b.Run(c.name, func(b *testing.B) {
			p, _ := open(b, 64<<30)
			if c.plain {
				p, _ = openPlain(b)
			}
			ctx := context.Background()
			if err := p.Create(ctx, "vb", 1<<30, 0, 0); err != nil {
				b.Fatal(err)
			}
			mp, err := p.Mount(ctx, "vb", false)
			if err != nil {
				b.Fatal(err)
			}
			half := bytes.Repeat([]byte{1}, 512<<20)
			for i := 0; b.Loop(); i++ {
				b.StopTimer()
				half[0] = byte(i)
				write(b, filepath.Join(mp, "half"), string(half))
				if synced {
					syscall.Sync()
				}
				b.StartTimer()
				if err := p.Capture(ctx, "vb", fmt.Sprintf("snap%d", i)); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

// A mount copied into another mount namespace (as every sandbox made
// while an image is mounted holds one, in its runsc processes) keeps the
// image's loop device after the pool's unmount: the image is mounted
// again through that device (one file system instance, the same
// content), renamed and removed without waiting for it, and the pool's
// Close waits for the copy to go.
func TestMountWhileACopyHoldsTheImage(t *testing.T) {
	p, dir := open(t)
	ctx := context.Background()
	if err := p.Create(ctx, "vheld", pool.MinImage, 0, 0); err != nil {
		t.Fatal(err)
	}
	mp, err := p.Mount(ctx, "vheld", false)
	if err != nil {
		t.Fatal(err)
	}
	write(t, filepath.Join(mp, "f"), "before")
	// The copy: a process in a mount namespace of its own, made now,
	// with the mount bound elsewhere there too (as runsc's gofer binds a
	// mount's source into its root: the unmount's rmdir of the mount
	// point would detach a copy at the same place).
	hold := filepath.Join(dir, "hold")
	if err := os.Mkdir(hold, 0o700); err != nil {
		t.Fatal(err)
	}
	holder := exec.Command("unshare", "-m", "--propagation", "private", "sh", "-c", `mount --bind "$1" "$2" && exec sleep 600`, "sh", mp, hold)
	if err := holder.Start(); err != nil {
		t.Fatal(err)
	}
	stopped := false
	stop := func() {
		if !stopped {
			holder.Process.Kill()
			holder.Wait()
			stopped = true
		}
	}
	t.Cleanup(stop)
	loops := func(name string) string {
		out, _ := exec.Command("losetup", "-nO", "NAME", "-j", filepath.Join(dir, "pool", name+".img")).Output()
		return strings.TrimSpace(string(out))
	}
	waitCopy := func() {
		self, _ := os.Readlink("/proc/self/ns/mnt")
		for range 100 {
			ns, _ := os.Readlink(fmt.Sprintf("/proc/%d/ns/mnt", holder.Process.Pid))
			b, err := os.ReadFile(fmt.Sprintf("/proc/%d/mountinfo", holder.Process.Pid))
			mp := hold
			comm, _ := os.ReadFile(fmt.Sprintf("/proc/%d/comm", holder.Process.Pid))
			// Once it runs sleep, unshare has made its namespace private.
			if ns != "" && ns != self && err == nil && bytes.Contains(b, []byte(mp)) && string(comm) == "sleep\n" {
				return
			}
			syscall.Nanosleep(&syscall.Timespec{Nsec: 10e6}, nil)
		}
		t.Fatal("the other namespace never had the mount")
	}
	waitCopy()
	first := loops("vheld")
	if err := p.Unmount(ctx, "vheld"); err != nil {
		t.Fatal(err)
	}
	if loops("vheld") != first || first == "" {
		t.Fatalf("the copy no longer holds the loop device (%q, was %q): the test holds nothing", loops("vheld"), first)
	}
	mp, err = p.Mount(ctx, "vheld", false)
	if err != nil {
		t.Fatal(err)
	}
	if got := loops("vheld"); got != first {
		t.Fatalf("the image is behind loop devices %q: want the one still attached, %s, alone", got, first)
	}
	if got := read(t, filepath.Join(mp, "f")); got != "before" {
		t.Fatalf("mounted again it holds %q", got)
	}
	write(t, filepath.Join(mp, "f"), "after")
	// Renamed while held: still one device, the same content under the
	// new name; removed: gone from the pool at once.
	if err := p.Rename(ctx, "vheld", "vmoved"); err != nil {
		t.Fatal(err)
	}
	if p.Exists("vheld") || !p.Exists("vmoved") {
		t.Fatal("the rename left the pool with the old name, or without the new")
	}
	mp, err = p.Mount(ctx, "vmoved", false)
	if err != nil {
		t.Fatal(err)
	}
	if got := read(t, filepath.Join(mp, "f")); got != "after" {
		t.Fatalf("after the rename it holds %q", got)
	}
	if out, _ := exec.Command("losetup", "-nO", "NAME", "-a").Output(); bytes.Count(out, []byte(first+"\n")) != 1 {
		t.Fatalf("loop devices after the rename: %s", out)
	}
	if err := p.Remove(ctx, "vmoved"); err != nil {
		t.Fatal(err)
	}
	if p.Exists("vmoved") {
		t.Fatal("removed, the image is still in the pool")
	}
	if err := p.Rename(ctx, "vmoved", "vother"); !errdefs.IsNotFound(err) {
		t.Fatalf("rename of a missing image: %v", err)
	}
	stop() // then Close (the cleanup) finds the device released
}

package node_test

import (
	"bytes"
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/spore-run/spore/internal/engine"
	"github.com/spore-run/spore/internal/errdefs"
	"github.com/spore-run/spore/internal/node"
	"github.com/spore-run/spore/internal/nodeapi"
	"github.com/spore-run/spore/internal/runtime"
)

// shFails runs script in a sandbox and returns its output, failing the
// test if the script succeeds.
func (e *env) shFails(ctx context.Context, id, script string) string {
	e.t.Helper()
	var out bytes.Buffer
	code, err := e.n.Engine.Exec(ctx, id, runtime.ExecSpec{Args: []string{"/bin/sh", "-c", script}, Stdout: &out, Stderr: &out})
	if err != nil || code == 0 {
		e.t.Fatalf("in %s: %q: exit %d, %v, want a failure: %s", id, script, code, err, out.String())
	}
	return out.String()
}

// A shared volume in sandboxes on one node: made on first use with its
// size as its quota, shown at the path asked, the same files in every
// sandbox that mounts it (read-write or read-only), its content outside
// snapshots (a rollback leaves it, a fork child mounts it too, a
// hibernated sandbox resumes with it), its content goes with the volume
// once no sandbox shows it; a full
// volume is ENOSPC and the sandbox lives on; unused slots are read-only
// and empty.
func TestSharedVolumeInSandboxes(t *testing.T) {
	e := newEnv(t)
	ctx := ctxFor(t)
	const vol = "vtestvolumeshared01"
	mount := func(path string, ro bool) []engine.Volume {
		t.Helper()
		vols, err := e.n.PrepareVolumes(ctx, []nodeapi.VolumeMount{{VolumeID: vol, SizeBytes: 48 << 20, Path: path, ReadOnly: ro}})
		if err != nil {
			t.Fatal(err)
		}
		return vols
	}
	a := e.create(ctx, engine.CreateOptions{Template: node.TemplateBase, Volumes: mount("/data", false)})
	e.sh(ctx, a.ID, "echo from-a > /data/hello && test -w /data/hello && test $(readlink /data) = /run/spore/volumes/0")
	b := e.create(ctx, engine.CreateOptions{Template: node.TemplateBase, Volumes: mount("/mnt/ro", true)})
	if got := e.sh(ctx, b.ID, "cat /mnt/ro/hello"); got != "from-a" {
		t.Fatalf("the read-only mount shows %q", got)
	}
	if out := e.shFails(ctx, b.ID, "echo x > /mnt/ro/other"); !strings.Contains(out, "Read-only") {
		t.Fatalf("a write on a read-only mount: %s", out)
	}
	// Unused slots: empty, and nothing can be put there.
	if out := e.shFails(ctx, a.ID, "ls -A /run/spore/volumes/1; echo x > /run/spore/volumes/1/x"); !strings.Contains(out, "Read-only") {
		t.Fatalf("a write in an unused slot: %s", out)
	}

	// Outside snapshots: a rollback keeps the volume's content and mount.
	snap, err := e.n.Engine.Snapshot(ctx, a.ID, engine.SnapshotOptions{})
	if err != nil {
		t.Fatal(err)
	}
	e.sh(ctx, a.ID, "echo after-snapshot > /data/later")
	if _, err := e.n.Engine.Rollback(ctx, a.ID, snap.Manifest.ID); err != nil {
		t.Fatal(err)
	}
	if got := e.sh(ctx, a.ID, "cat /data/later /data/hello"); got != "after-snapshot\nfrom-a" {
		t.Fatalf("after a rollback the shared volume holds %q", got)
	}
	// A fork child mounts the same volume.
	fork, err := e.n.Engine.Fork(ctx, a.ID, engine.ForkOptions{Count: 1})
	if err != nil || fork.Children[0].Err != nil {
		t.Fatalf("fork: %v %+v", err, fork)
	}
	child := fork.Children[0].Sandbox.ID
	e.sh(ctx, child, "echo from-child > /data/child")
	if got := e.sh(ctx, b.ID, "cat /mnt/ro/child"); got != "from-child" {
		t.Fatalf("the child's write, seen in b: %q", got)
	}

	// Hibernated and resumed, it shows the volume as before.
	if err := e.n.Engine.Hibernate(ctx, a.ID); err != nil {
		t.Fatal(err)
	}
	e.sh(ctx, b.ID, "test -r /mnt/ro/hello") // the volume stays for the others
	if err := e.n.Engine.Resume(ctx, a.ID); err != nil {
		t.Fatal(err)
	}
	if got := e.sh(ctx, a.ID, "cat /data/child"); got != "from-child" {
		t.Fatalf("after hibernate and resume: %q", got)
	}

	// The quota: a write past it is ENOSPC; the sandbox keeps working.
	if out := e.shFails(ctx, a.ID, "dd if=/dev/zero of=/data/big bs=1M count=80 2>&1"); !strings.Contains(out, "No space left") {
		t.Fatalf("80 MiB into a 48 MiB volume: %s", out)
	}
	e.sh(ctx, a.ID, "rm /data/big && echo still > /data/alive && cat /data/alive")

	// Its usage, as the image's file system counts it: 8 MiB written
	// count, and the capacity is the size less the file system's own.
	base, err := e.n.VolumeUsage(ctx, vol)
	if err != nil {
		t.Fatal(err)
	}
	e.sh(ctx, a.ID, "dd if=/dev/urandom of=/data/eight bs=1M count=8 2>/dev/null && sync")
	u, err := e.n.VolumeUsage(ctx, vol)
	if err != nil || u.UsedBytes-base.UsedBytes < 8<<20 || u.CapacityBytes > 48<<20 || u.CapacityBytes < 32<<20 {
		t.Fatalf("usage after 8 MiB: %+v (before %+v) %v", u, base, err)
	}
	if _, err := e.n.VolumeUsage(ctx, "vunknownvolume00000"); !errdefs.IsNotFound(err) {
		t.Fatalf("usage of a volume the node does not hold: %v", err)
	}

	// Bad requests change nothing.
	if _, err := e.n.PrepareVolumes(ctx, make([]nodeapi.VolumeMount, nodeapi.MaxVolumeMounts+1)); err == nil {
		t.Fatal("more mounts than slots were prepared")
	}
	if _, err := e.n.Engine.Create(ctx, engine.CreateOptions{Template: snap.Manifest.ID, Volumes: mount("/other", false)}); err == nil {
		t.Fatal("a snapshot that brings its volume took another")
	}
	// On the host: the volume's image, its mount and view, all removed
	// with the node (checked by the test's cleanup, with the loop devices).
	img := filepath.Join(e.dir, "volumes", "pool", vol+".img")
	if _, err := os.Stat(img); err != nil {
		t.Fatalf("the volume's image: %v", err)
	}
	// Its content goes once no sandbox here shows it.
	if err := e.n.DeleteVolume(ctx, vol); !errdefs.IsConflict(err) {
		t.Fatalf("delete of a volume sandboxes show: %v", err)
	}
	for _, id := range []string{a.ID, b.ID, child} {
		if err := e.n.Engine.Kill(ctx, id); err != nil {
			t.Fatal(err)
		}
	}
	if err := e.n.DeleteVolume(ctx, vol); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(img); !os.IsNotExist(err) {
		t.Fatalf("the image after the delete: %v", err)
	}
	if _, err := e.n.VolumeUsage(ctx, vol); !errdefs.IsNotFound(err) {
		t.Fatalf("usage of a deleted volume: %v", err)
	}
	if err := e.n.DeleteVolume(ctx, "vunknownvolume00000"); err != nil {
		t.Fatalf("delete of an unknown volume: %v", err)
	}
}

// After a restart of the host (the node process gone and every mount with
// it), the node mounts its volumes again at its start, so a hibernated
// sandbox that shows one resumes with its content.
func TestVolumesAfterAHostRestart(t *testing.T) {
	e := newEnv(t)
	ctx := ctxFor(t)
	const vol = "vtestvolumerestart1"
	vols, err := e.n.PrepareVolumes(ctx, []nodeapi.VolumeMount{{VolumeID: vol, SizeBytes: 32 << 20, Path: "/data"}})
	if err != nil {
		t.Fatal(err)
	}
	sb := e.create(ctx, engine.CreateOptions{Template: node.TemplateBase, Volumes: vols})
	e.sh(ctx, sb.ID, "echo kept > /data/f")
	if err := e.n.Engine.Hibernate(ctx, sb.ID); err != nil {
		t.Fatal(err)
	}
	e.n.Close() // a sandbox is left (hibernated): the volumes stay mounted
	// What a host restart does to them: every mount of the data directory
	// gone, the loop devices detached.
	mounts := filepath.Join(e.dir, "volumes")
	for _, m := range []string{"mounts/" + vol, "pool", "empty"} {
		// The pool's file system is busy until the kernel has detached
		// the volume's loop device, a moment after its unmount.
		err := unix.Unmount(filepath.Join(mounts, m), 0)
		for deadline := time.Now().Add(time.Minute); err == unix.EBUSY && time.Now().Before(deadline); {
			time.Sleep(10 * time.Millisecond)
			err = unix.Unmount(filepath.Join(mounts, m), 0)
		}
		if err != nil {
			t.Fatalf("unmount %s: %v", m, err)
		}
	}
	e.open()
	if err := e.n.Engine.Resume(ctx, sb.ID); err != nil {
		t.Fatal(err)
	}
	if got := e.sh(ctx, sb.ID, "cat /data/f"); got != "kept" {
		t.Fatalf("after the restart the volume holds %q", got)
	}
}

package gvisor_test

import (
	"context"
	"os"
	"slices"
	"testing"
	"time"

	"github.com/spore-run/spore/internal/ids"
	"github.com/spore-run/spore/internal/runtime"
	"github.com/spore-run/spore/internal/runtime/gvisor"
	"github.com/spore-run/spore/internal/testenv"
	"github.com/spore-run/spore/internal/timing"
)

// hashGuest holds 96 MiB of seeded random bytes and, each time /tmp/ask
// appears, writes the SHA-256 of that memory to /tmp/answer: whether the
// memory a restore loaded is whole is asked of the guest itself.
const hashGuest = `import hashlib, os, random, time
data = bytearray(random.Random(7).randbytes(96 << 20))
open("/tmp/answer", "w").write(hashlib.sha256(data).hexdigest())
while True:
    if os.path.exists("/tmp/ask"):
        os.remove("/tmp/ask")
        open("/tmp/answer.new", "w").write(hashlib.sha256(data).hexdigest())
        os.rename("/tmp/answer.new", "/tmp/answer")
    time.sleep(0.01)
`

// TestRestoreInTheBackground restores images whose memory loads after the
// restore returns (Config.BackgroundLoadBytes): the guest's memory is
// whole, its files are there, the image may be deleted the moment the
// restore returns, and a checkpoint taken while pages still load captures
// all of them.
func TestRestoreInTheBackground(t *testing.T) {
	ctx := context.Background()
	d := newDriverWith(t, gvisor.Config{BackgroundLoadBytes: 1})
	spec := func() runtime.Spec {
		return runtime.Spec{ID: ids.New('t'), RootFS: testenv.BaseRootFS(t), Args: []string{"/usr/bin/python3", "-c", hashGuest},
			Limits: runtime.Limits{MemoryMB: 1024, DiskMB: 256}}
	}
	out := func(id string, args ...string) (string, int) {
		t.Helper()
		return execOut(t, d, id, args...)
	}
	// ask has the guest hash its memory again and returns the hash.
	ask := func(id string) string {
		t.Helper()
		if _, code := out(id, "/bin/sh", "-c", "rm -f /tmp/answer && touch /tmp/ask"); code != 0 {
			t.Fatalf("ask %s: exit %d", id, code)
		}
		// Each look is a runsc exec (see await in patched_test.go): every
		// 250 ms, not every 20, leaves the guest the CPU it hashes with.
		for deadline := time.Now().Add(3 * time.Minute); time.Now().Before(deadline); time.Sleep(250 * time.Millisecond) {
			if h, code := out(id, "cat", "/tmp/answer"); code == 0 && len(h) == 64 {
				return h
			}
		}
		t.Fatalf("guest %s did not answer", id)
		return ""
	}

	src := spec()
	if err := d.Start(ctx, src); err != nil {
		t.Fatal(err)
	}
	var want string
	for deadline := time.Now().Add(2 * time.Minute); want == "" && time.Now().Before(deadline); time.Sleep(100 * time.Millisecond) {
		if h, code := out(src.ID, "cat", "/tmp/answer"); code == 0 && len(h) == 64 {
			want = h
		}
	}
	if want == "" {
		t.Fatal("the guest did not fill its memory")
	}
	if _, code := out(src.ID, "/bin/sh", "-c", "echo kept > /root/file"); code != 0 {
		t.Fatal("write a file")
	}
	img := t.TempDir()
	if err := d.Checkpoint(ctx, src.ID, img, runtime.CheckpointOptions{}); err != nil {
		t.Fatal(err)
	}
	if fi, err := os.Stat(img + "/pages.img"); err != nil || fi.Size() < 96<<20 {
		t.Fatalf("pages file: %v (%d bytes)", err, fi.Size())
	}

	// The image is deleted as soon as the restore returns: the sandbox
	// holds its files open until the pages are in.
	a := spec()
	tctx, rec := timing.With(ctx)
	if err := d.Restore(tctx, a, img); err != nil {
		t.Fatal(err)
	}
	if !slices.ContainsFunc(rec.Parts(), func(p timing.Part) bool { return p.Name == "background-load" }) {
		t.Fatalf("the restore did not load in the background (Server-Timing parts %v)", rec.Parts())
	}
	if err := os.RemoveAll(img); err != nil {
		t.Fatal(err)
	}
	if f, code := out(a.ID, "cat", "/root/file"); code != 0 || f != "kept" {
		t.Fatalf("file after restore: %q (exit %d)", f, code)
	}
	if got := ask(a.ID); got != want {
		t.Fatalf("memory after a restore in the background: sha256 %s, want %s", got, want)
	}

	// A checkpoint right after a background restore waits for the pages
	// still loading: its image restores whole.
	img2 := t.TempDir()
	b := spec()
	c := spec()
	if err := d.Restore(ctx, b, mustCheckpoint(t, d, a.ID, img2)); err != nil {
		t.Fatal(err)
	}
	img3 := t.TempDir()
	if err := d.Checkpoint(ctx, b.ID, img3, runtime.CheckpointOptions{LeaveRunning: true}); err != nil {
		t.Fatal(err)
	}
	// ... also into a pre-created instance (a restore target).
	if err := d.Precreate(ctx, c); err != nil {
		t.Fatal(err)
	}
	if err := d.Restore(ctx, c, img3); err != nil {
		t.Fatal(err)
	}
	for _, id := range []string{b.ID, c.ID} {
		if got := ask(id); got != want {
			t.Fatalf("memory of %s: sha256 %s, want %s", id, got, want)
		}
	}
}

func mustCheckpoint(t *testing.T, d *gvisor.Driver, id, dir string) string {
	t.Helper()
	if err := d.Checkpoint(context.Background(), id, dir, runtime.CheckpointOptions{}); err != nil {
		t.Fatal(err)
	}
	return dir
}

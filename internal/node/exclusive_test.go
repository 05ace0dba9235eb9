package node_test

import (
	"context"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/spore-run/spore/internal/blob/local"
	"github.com/spore-run/spore/internal/engine"
	"github.com/spore-run/spore/internal/errdefs"
	"github.com/spore-run/spore/internal/ids"
	"github.com/spore-run/spore/internal/netns"
	"github.com/spore-run/spore/internal/node"
	"github.com/spore-run/spore/internal/nodeapi"
	"github.com/spore-run/spore/internal/testenv"
)

// An exclusive volume on a real node (docs/volumes.md): its content is
// part of every snapshot, of the same instant as memory; a rollback
// brings it back (same sandbox), each fork child and a create from the
// snapshot get a volume of their own from the snapshot's copy, whose
// writes stay theirs; the snapshot keeps the content after the volume is
// deleted, and its copy goes with it; after a rollback the volume keeps
// the content its sandbox left when the sandbox goes; hibernate and
// resume keep it.
func TestExclusiveVolumeFollowsSnapshots(t *testing.T) {
	e := newEnv(t)
	ctx := ctxFor(t)
	const vol = "vtestexclusive00001"
	pool := filepath.Join(e.dir, "volumes", "pool")
	images := func() []string {
		t.Helper()
		ents, err := os.ReadDir(pool)
		if err != nil {
			t.Fatal(err)
		}
		var out []string
		for _, ent := range ents {
			if n, ok := strings.CutSuffix(ent.Name(), ".img"); ok {
				out = append(out, n)
			}
		}
		return out
	}
	vols, err := e.n.PrepareVolumes(ctx, []nodeapi.VolumeMount{{VolumeID: vol, SizeBytes: 64 << 20, Path: "/work", Exclusive: true}})
	if err != nil {
		t.Fatal(err)
	}
	a := e.create(ctx, engine.CreateOptions{Template: node.TemplateBase, Volumes: vols})
	// A writer that appends 1, 2, 3... to the volume and keeps its count
	// in /tmp (of the root filesystem, captured with memory; renamed into
	// place, so that no capture sees it truncated and empty): a capture
	// of one instant restores a log of exactly 1..n, n the count or one
	// past it. (A process runsc exec started does not outlive a restore:
	// the writer is started again where a capture needs it running, and
	// goes on from the log's length: from the count it would write again
	// the line a capture between its append and its count held.) It
	// returns once the writer has counted (waited for, up to 30 s: after a
	// fixed 0.2 s a loaded host may not have started it, and a capture
	// then has no count), and 0.2 s more.
	writer := func(id string) {
		t.Helper()
		e.sh(ctx, id, `was=$(cat /tmp/count 2>/dev/null)
			nohup sh -c 'i=$(cat /work/log 2>/dev/null | wc -l); while :; do i=$((i+1)); echo $i >> /work/log; echo $i > /tmp/count.new; mv /tmp/count.new /tmp/count; sleep 0.005; done' </dev/null >/dev/null 2>&1 &
			echo $! > /tmp/writer
			n=0; while [ "$(cat /tmp/count 2>/dev/null)" = "$was" ] && [ $n -lt 3000 ]; do n=$((n+1)); sleep 0.01; done
			sleep 0.2`)
	}
	e.sh(ctx, a.ID, "echo v1 > /work/f && mkdir /work/dir && echo kept > /work/dir/g")
	writer(a.ID)
	consistent := func(id, when string) {
		t.Helper()
		out := e.sh(ctx, id, `kill -STOP $(cat /tmp/writer) 2>/dev/null; sleep 0.05; cat /tmp/count; echo --; cat /work/log`)
		count, log, _ := strings.Cut(out, "\n--\n")
		n, err := strconv.Atoi(strings.TrimSpace(count))
		if err != nil {
			t.Fatalf("%s: %s", when, out)
		}
		lines := strings.Fields(log)
		for i, l := range lines {
			if l != strconv.Itoa(i+1) {
				t.Fatalf("%s: the volume's log skips at line %d (%q) while memory counted %d: volume and memory of different instants", when, i+1, l, n)
			}
		}
		if len(lines) != n && len(lines) != n+1 {
			t.Fatalf("%s: the volume's log has %d lines while memory counted %d: volume and memory of different instants", when, len(lines), n)
		}
		e.sh(ctx, id, `kill -CONT $(cat /tmp/writer) 2>/dev/null; true`)
	}

	snap, err := e.n.Engine.Snapshot(ctx, a.ID, engine.SnapshotOptions{})
	if err != nil {
		t.Fatal(err)
	}
	cp := snap.Manifest.Run.Volumes[0].Copy
	if cp == "" || !slices.Contains(images(), cp) {
		t.Fatalf("the snapshot's copy of the volume %q is not in the pool %v", cp, images())
	}
	// Changed after the snapshot, then rolled back: same sandbox, the
	// snapshot's content, of memory's instant.
	e.sh(ctx, a.ID, "echo v2 > /work/f && rm -r /work/dir && echo new > /work/new && sleep 0.2")
	if _, err := e.n.Engine.Rollback(ctx, a.ID, snap.Manifest.ID); err != nil {
		t.Fatal(err)
	}
	if got := e.sh(ctx, a.ID, "cat /work/f /work/dir/g; test ! -e /work/new && echo no-new"); got != "v1\nkept\nno-new" {
		t.Fatalf("after the rollback the volume holds %q", got)
	}
	consistent(a.ID, "after the rollback")

	// Fork 3: each child has the content at the fork, in a volume of its
	// own; their writes and the parent's stay apart.
	e.sh(ctx, a.ID, "echo pre-fork > /work/f")
	writer(a.ID)
	fork, err := e.n.Engine.Fork(ctx, a.ID, engine.ForkOptions{Count: 3})
	if err != nil {
		t.Fatal(err)
	}
	for i, c := range fork.Children {
		if c.Err != nil {
			t.Fatalf("child %d: %v", i, c.Err)
		}
		id := c.Sandbox.ID
		if got := e.sh(ctx, id, "cat /work/f"); got != "pre-fork" {
			t.Fatalf("child %s sees %q", id, got)
		}
		consistent(id, "in a fork child")
		e.sh(ctx, id, "echo child-"+strconv.Itoa(i)+" > /work/f")
		sb, err := e.n.Engine.Get(ctx, id)
		if err != nil || len(sb.Run.Volumes) != 1 || sb.Run.Volumes[0].Volume != ids.Derive('v', id, vol) {
			t.Fatalf("child %s shows volumes %+v (%v): want its own, %s", id, sb.Run.Volumes, err, ids.Derive('v', id, vol))
		}
	}
	e.sh(ctx, a.ID, "echo parent > /work/f")
	for i, c := range fork.Children {
		if got := e.sh(ctx, c.Sandbox.ID, "cat /work/f"); got != "child-"+strconv.Itoa(i) {
			t.Fatalf("child %d's write became %q", i, got)
		}
	}
	if got := e.sh(ctx, a.ID, "cat /work/f"); got != "parent" {
		t.Fatalf("the parent's volume holds %q", got)
	}
	if slices.ContainsFunc(images(), func(n string) bool { return strings.HasPrefix(n, "c-f") }) {
		t.Fatalf("the fork's copies are left in the pool: %v", images())
	}

	// Hibernated and resumed: the same content.
	if err := e.n.Engine.Hibernate(ctx, a.ID); err != nil {
		t.Fatal(err)
	}
	if err := e.n.Engine.Resume(ctx, a.ID); err != nil {
		t.Fatal(err)
	}
	if got := e.sh(ctx, a.ID, "cat /work/f"); got != "parent" {
		t.Fatalf("after hibernate and resume: %q", got)
	}
	// The volume's content is what the rolled-back sandbox runs with, and
	// stays the volume's when the sandbox goes.
	root, err := e.n.VolumeRoot(ctx, vol, 64<<20)
	if err != nil {
		t.Fatal(err)
	}
	if got, err := root.ReadFile("f"); err != nil || string(got) != "parent\n" {
		t.Fatalf("the content API reads %q (%v)", got, err)
	}
	root.Close()
	if err := e.n.DeleteVolume(ctx, vol); !errdefs.IsConflict(err) {
		t.Fatalf("delete of a volume a sandbox holds: %v", err)
	}
	e.sh(ctx, a.ID, "echo last > /work/f")
	if err := e.n.Engine.Kill(ctx, a.ID); err != nil {
		t.Fatal(err)
	}
	if imgs := images(); !slices.Contains(imgs, vol) || slices.ContainsFunc(imgs, func(n string) bool { return strings.HasPrefix(n, "r-") }) {
		t.Fatalf("after its sandbox went the pool holds %v: want the volume's image, and no rollback image", imgs)
	}
	root, err = e.n.VolumeRoot(ctx, vol, 64<<20)
	if err != nil {
		t.Fatal(err)
	}
	if got, err := root.ReadFile("f"); err != nil || string(got) != "last\n" {
		t.Fatalf("the volume after its sandbox went: %q (%v)", got, err)
	}
	root.Close()

	// The volume deleted, the snapshot still has its content: a create
	// from it gets a volume of its own, at the snapshot's instant.
	if err := e.n.DeleteVolume(ctx, vol); err != nil {
		t.Fatal(err)
	}
	b := e.create(ctx, engine.CreateOptions{Template: snap.Manifest.ID})
	if got := e.sh(ctx, b.ID, "cat /work/f /work/dir/g"); got != "v1\nkept" {
		t.Fatalf("a create from the snapshot sees %q", got)
	}
	consistent(b.ID, "in a create from the snapshot")
	// A second volume mount on a snapshot that brings its own is refused.
	if _, err := e.n.Engine.Create(ctx, engine.CreateOptions{Template: snap.Manifest.ID, Volumes: vols}); !errdefs.IsInvalidArgument(err) {
		t.Fatalf("a create from the snapshot with another volume: %v", err)
	}
	// The snapshot's copy goes with it.
	if err := e.n.Engine.DeleteSnapshot(ctx, snap.Manifest.ID); err != nil {
		t.Fatal(err)
	}
	if slices.Contains(images(), cp) {
		t.Fatalf("the deleted snapshot's copy %s is left in the pool", cp)
	}
	for _, id := range []string{b.ID, fork.Children[0].Sandbox.ID, fork.Children[1].Sandbox.ID, fork.Children[2].Sandbox.ID} {
		if err := e.n.Engine.Kill(ctx, id); err != nil {
			t.Fatal(err)
		}
	}
}

// Through the blob store: a durable snapshot of a sandbox with an
// exclusive volume carries its copy of the volume (a dependency of the
// snapshot, chunked as its data: the image's holes are not read); another
// node that fetches the snapshot gets the copy, sparse, and a sandbox
// created there from the snapshot has a volume of its own with the
// content of the snapshot's instant. The sandbox then moves to the other
// node through its hibernation, its volume with it.
func TestExclusiveVolumeThroughTheBlobStore(t *testing.T) {
	testenv.RealTier(t)
	blobs, err := local.Open(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	a := newEnvTuned(t, func(c *node.Config) { c.Blobs = blobs })
	b := newEnvTuned(t, func(c *node.Config) { c.Blobs, c.NetPrefix = blobs, "spq" })
	// Not ctxFor's 3 minutes: the first upload publishes the runtime build
	// (runsc, chunked and hashed under the race detector), which took 2m46s
	// of a loaded CI host once, and the test uploads and fetches twice more.
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	const vol = "vtestexclusive00002"
	vols, err := a.n.PrepareVolumes(ctx, []nodeapi.VolumeMount{{VolumeID: vol, SizeBytes: 1 << 30, Path: "/work", Exclusive: true}})
	if err != nil {
		t.Fatal(err)
	}
	sb := a.create(ctx, engine.CreateOptions{Template: node.TemplateBase, Volumes: vols})
	a.sh(ctx, sb.ID, "echo from-node-a > /work/f && head -c 3000000 /dev/urandom > /work/data && md5sum < /work/data > /tmp/sum")
	snap, err := a.n.Engine.Snapshot(ctx, sb.ID, engine.SnapshotOptions{})
	if err != nil {
		t.Fatal(err)
	}
	a.sh(ctx, sb.ID, "echo later > /work/f")
	up, err := a.n.Sync.Upload(ctx, snap.Manifest.ID)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("upload: %+v", up)
	if _, err := b.n.Sync.Ensure(ctx, snap.Manifest.ID, nil); err != nil {
		t.Fatalf("node B fetching the snapshot with its volume copy: %v", err)
	}
	cp := snap.Manifest.Run.Volumes[0].Copy
	img := filepath.Join(b.dir, "volumes", "pool", cp+".img")
	var st unix.Stat_t
	if err := unix.Stat(img, &st); err != nil {
		t.Fatalf("node B has no copy %s: %v", cp, err)
	}
	if st.Size != 1<<30 || st.Blocks*512 > 256<<20 {
		t.Fatalf("node B's copy: %d bytes, %d on disk: want the 1 GiB image, sparse", st.Size, st.Blocks*512)
	}
	c := b.create(ctx, engine.CreateOptions{Template: snap.Manifest.ID})
	if got := b.sh(ctx, c.ID, "cat /work/f; md5sum < /work/data | cmp - /tmp/sum && echo same"); got != "from-node-a\nsame" {
		t.Fatalf("the sandbox made on node B sees %q", got)
	}
	if v := c.Run.Volumes[0].Volume; v != ids.Derive('v', c.ID, vol) {
		t.Fatalf("the sandbox on node B shows volume %s", v)
	}

	// The sandbox itself moves to node B, hibernated: its hibernation
	// captured the volume, and node B makes the volume, under its own ID,
	// from that copy; the sandbox goes on with it there.
	a.sh(ctx, sb.ID, "echo at-hibernation > /work/f")
	if err := a.n.Engine.Hibernate(ctx, sb.ID); err != nil {
		t.Fatal(err)
	}
	hib, err := a.n.Engine.Get(ctx, sb.ID)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := a.n.Sync.Upload(ctx, hib.Hibernation); err != nil {
		t.Fatal(err)
	}
	if _, err := b.n.Sync.Ensure(ctx, hib.Hibernation, nil); err != nil {
		t.Fatalf("node B fetching the hibernation with its volume copy: %v", err)
	}
	if _, err := b.n.Engine.Adopt(ctx, sb.ID, hib.Hibernation, netns.Policy{Internet: true}); err != nil {
		t.Fatal(err)
	}
	if err := b.n.Engine.Resume(ctx, sb.ID); err != nil {
		t.Fatalf("resume on node B: %v", err)
	}
	if got := b.sh(ctx, sb.ID, "cat /work/f; md5sum < /work/data | cmp - /tmp/sum && echo same; echo on-b >> /work/f && tail -1 /work/f"); got != "at-hibernation\nsame\non-b" {
		t.Fatalf("the sandbox moved to node B sees %q", got)
	}
	if _, err := os.Stat(filepath.Join(b.dir, "volumes", "pool", vol+".img")); err != nil {
		t.Fatalf("node B has no image of the volume under its own ID: %v", err)
	}
	for _, e := range []struct {
		e  *env
		id string
	}{{a, sb.ID}, {b, c.ID}, {b, sb.ID}} {
		if err := e.e.n.Engine.Kill(ctx, e.id); err != nil {
			t.Fatal(err)
		}
	}
}

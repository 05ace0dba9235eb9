package node_test

import (
	"bytes"
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/spore-run/spore/internal/blob/local"
	"github.com/spore-run/spore/internal/engine"
	"github.com/spore-run/spore/internal/ids"
	"github.com/spore-run/spore/internal/node"
	"github.com/spore-run/spore/internal/rootfs"
	"github.com/spore-run/spore/internal/runtime"
	"github.com/spore-run/spore/internal/testenv"
)

// Two hosts that built their root filesystems separately: node B fetches,
// with node A's durable snapshot, the tree it was taken over (a checkpoint
// restores only over the build it was taken over), as a kept build. Once
// A publishes its build as the fleet's, B takes it (the copy it fetched
// becomes its base: nothing is fetched twice), its own build is kept
// aside, and the snapshot restores on B with its memory. A, which
// published, is unchanged.
func TestRootFSSharedThroughBlobStore(t *testing.T) {
	testenv.RealTier(t)
	blobs, err := local.Open(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	// B's own build: a copy of the machine's with another build ID.
	dirB := t.TempDir()
	src := testenv.RootFSDir(t)
	if out, err := exec.Command("cp", "-a", filepath.Join(src, "base"), filepath.Join(src, "base.json"), dirB).CombinedOutput(); err != nil {
		t.Fatalf("copy the root filesystem: %v %s", err, out)
	}
	var st rootfs.Stamp
	b, _ := os.ReadFile(filepath.Join(dirB, "base.json"))
	json.Unmarshal(b, &st)
	machineBuild := st.ID
	st.ID = ids.New('r')
	b, _ = json.Marshal(st)
	os.WriteFile(filepath.Join(dirB, "base.json"), b, 0o644)

	a := newEnvTuned(t, func(c *node.Config) { c.Blobs = blobs })
	bn := newEnvTuned(t, func(c *node.Config) { c.Blobs, c.RootFSDir, c.NetPrefix = blobs, dirB, "spq" })
	ctx := ctxFor(t)

	sb := a.create(ctx, engine.CreateOptions{Template: node.TemplateBase})
	var out bytes.Buffer
	if code, err := a.n.Engine.Exec(ctx, sb.ID, runtime.ExecSpec{Args: []string{"/bin/sh", "-c",
		"echo from-node-a > /tmp/mark; nohup python3 -c 'import time\nx=\"held-in-memory\"\nopen(\"/tmp/x\",\"w\").write(x)\ntime.sleep(100000)' >/dev/null 2>&1 & sleep 1"}, Stdout: &out}); err != nil || code != 0 {
		t.Fatalf("prepare: %d %v %s", code, err, out.String())
	}
	snap, err := a.n.Engine.Snapshot(ctx, sb.ID, engine.SnapshotOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := a.n.Sync.Upload(ctx, snap.Manifest.ID); err != nil {
		t.Fatal(err)
	}
	if _, err := bn.n.Sync.Ensure(ctx, snap.Manifest.ID, nil); err != nil {
		t.Fatalf("node B with its own root filesystem build: %v", err)
	}
	if st, ok := rootfs.Has(dirB, machineBuild); !ok || st.Name != "base" {
		t.Fatalf("node B did not fetch A's build with the snapshot: %+v", st)
	}
	ownB, err := rootfs.Lookup(dirB, "base")
	if err != nil {
		t.Fatal(err)
	}
	// A publishes first (it is the first with a store); B then takes it.
	if adopted, err := a.n.ShareRootFS(ctx, "base"); err != nil || adopted {
		t.Fatalf("node A publishing: adopted %v, %v", adopted, err)
	}
	adopted, err := bn.n.ShareRootFS(ctx, "base")
	if err != nil || !adopted {
		t.Fatalf("node B taking the fleet's root filesystem: adopted %v, %v", adopted, err)
	}
	gotB, err := rootfs.Lookup(dirB, "base")
	if err != nil || gotB.ID != machineBuild {
		t.Fatalf("B's root filesystem is %+v (%v), want build %s", gotB, err, machineBuild)
	}
	if ents, _ := filepath.Glob(filepath.Join(dirB, ".base*")); len(ents) != 0 {
		t.Fatalf("left in B's root filesystems: %v", ents)
	}
	if kept, err := rootfs.Kept(dirB); err != nil || len(kept) != 1 || kept[0].ID != ownB.ID {
		t.Fatalf("B keeps %+v (%v), want only its own build %s", kept, err, ownB.ID)
	}
	for _, f := range []string{"usr/bin/python3", "etc/os-release"} {
		if _, err := os.Lstat(filepath.Join(dirB, "base", f)); err != nil {
			t.Fatalf("B's root filesystem lacks %s: %v", f, err)
		}
	}
	if err := bn.n.EnsureTemplates(ctx); err != nil {
		t.Fatal(err)
	}
	moved := bn.create(ctx, engine.CreateOptions{Template: snap.Manifest.ID})
	out.Reset()
	if code, err := bn.n.Engine.Exec(ctx, moved.ID, runtime.ExecSpec{Args: []string{"/bin/sh", "-c", "cat /tmp/mark /tmp/x; pgrep -f held-in-memory >/dev/null && echo alive"}, Stdout: &out}); err != nil || code != 0 {
		t.Fatalf("on node B: %d %v %s", code, err, out.String())
	}
	if got := out.String(); !strings.Contains(got, "from-node-a") || !strings.Contains(got, "alive") {
		t.Fatalf("restored on node B: %q", got)
	}
	if again, err := bn.n.ShareRootFS(ctx, "base"); err != nil || again {
		t.Fatalf("B again: adopted %v, %v", again, err)
	}
}

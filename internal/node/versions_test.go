package node_test

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"connectrpc.com/connect"

	"github.com/spore-run/spore/internal/blob/local"
	"github.com/spore-run/spore/internal/chunk"
	"github.com/spore-run/spore/internal/engine"
	"github.com/spore-run/spore/internal/ids"
	"github.com/spore-run/spore/internal/node"
	"github.com/spore-run/spore/internal/rootfs"
	"github.com/spore-run/spore/internal/runtime"
	"github.com/spore-run/spore/internal/runtime/gvisor"
	"github.com/spore-run/spore/internal/setup"
	"github.com/spore-run/spore/internal/snapsync"
	"github.com/spore-run/spore/internal/testenv"
	processpb "github.com/spore-run/spore/proto/gen/process"
)

// anotherRunsc copies the runsc binary with bytes appended: another build
// by content, which runs as the original does.
func anotherRunsc(t *testing.T, runsc string) string {
	t.Helper()
	dst := filepath.Join(t.TempDir(), "runsc")
	b, err := os.ReadFile(runsc)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(dst, append(b, []byte("\nanother spore test build\n")...), 0o755); err != nil {
		t.Fatal(err)
	}
	if v, err := os.ReadFile(runsc + ".version"); err == nil {
		os.WriteFile(dst+".version", v, 0o644)
	}
	return dst
}

// tinyRootFS is a root filesystem directory of the test's own whose base
// is a few MB (busybox, with what Spore adds to an image's tree), so that
// its trees cross the blob store in a moment.
func tinyRootFS(t *testing.T) string {
	t.Helper()
	ctx := context.Background()
	src := filepath.Join(t.TempDir(), "tree")
	for _, d := range []string{"bin", "etc", "root"} {
		if err := os.MkdirAll(filepath.Join(src, d), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	bb, err := os.ReadFile(testenv.Busybox)
	if err != nil {
		t.Fatalf("%s (busybox-static, installed by `make setup`): %v", testenv.Busybox, err)
	}
	if err := os.WriteFile(filepath.Join(src, "bin", "busybox"), bb, 0o755); err != nil {
		t.Fatal(err)
	}
	for _, a := range []string{"sh", "cat", "echo", "test", "sleep", "kill", "rm", "seq"} {
		if err := os.Symlink("busybox", filepath.Join(src, "bin", a)); err != nil {
			t.Fatal(err)
		}
	}
	os.WriteFile(filepath.Join(src, "etc", "passwd"), []byte("root:x:0:0:root:/root:/bin/sh\n"), 0o644)
	os.WriteFile(filepath.Join(src, "etc", "group"), []byte("root:x:0:\n"), 0o644)
	dir := t.TempDir()
	sum := sha256.Sum256([]byte(ids.New('k')))
	key := "sha256:" + hex.EncodeToString(sum[:])
	name, _, _, err := rootfs.RegisterImage(ctx, dir, key, src)
	if err != nil {
		t.Fatal(err)
	}
	staging := filepath.Join(dir, ".build-base")
	if err := os.Rename(rootfs.Path(dir, name), staging); err != nil {
		t.Fatal(err)
	}
	if err := rootfs.Remove(dir, name); err != nil {
		t.Fatal(err)
	}
	st := rootfs.Stamp{ID: ids.New('r'), Suite: "tiny", Revision: rootfs.BaseSpec().Revision, Built: time.Now().UTC()}
	if err := rootfs.Install(ctx, dir, "base", staging, st); err != nil {
		t.Fatal(err)
	}
	return dir
}

// rebuildBase gives root filesystem base in dir a new build: its tree
// with one file added (/etc/spore-upgraded), a new build ID, the next tree
// revision. It returns the new stamp.
func rebuildBase(t *testing.T, dir string) rootfs.Stamp {
	t.Helper()
	old, err := rootfs.Lookup(dir, "base")
	if err != nil {
		t.Fatal(err)
	}
	staging := filepath.Join(dir, ".build-upgrade-"+ids.New('u'))
	if out, err := exec.Command("cp", "-al", rootfs.Path(dir, "base"), staging).CombinedOutput(); err != nil {
		t.Fatalf("copy the tree: %v: %s", err, out)
	}
	if err := os.WriteFile(filepath.Join(staging, "etc", "spore-upgraded"), []byte("yes\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	st := old
	st.ID, st.Revision, st.Built = ids.New('r'), old.Revision+1, time.Now().UTC()
	if err := rootfs.Install(context.Background(), dir, "base", staging, st); err != nil {
		t.Fatal(err)
	}
	return st
}

// sandboxView is what a sandbox runs: the runsc binary its sandbox
// process runs, whether its root filesystem is the upgraded tree, what it
// wrote to its disk before, and the value a process it started then holds
// in its memory only.
type sandboxView struct {
	exe      string
	upgraded bool
	mark     string
	held     string
}

// prepare leaves a mark on the sandbox's disk and starts, through its
// daemon (as an SDK does), a process that draws a value, keeps it in its
// memory only (the file it first wrote it to is deleted) and writes it out
// again on SIGUSR1. It returns the value.
func (e *env) prepare(ctx context.Context, sb engine.Sandbox, mark string) string {
	e.t.Helper()
	c := e.client(sb)
	sctx, cancel := context.WithCancel(ctx)
	st, err := c.proc.Start(sctx, connect.NewRequest(&processpb.StartRequest{Process: &processpb.ProcessConfig{Cmd: "/bin/sh", Args: []string{"-c",
		"echo " + mark + " > /tmp/mark; echo $$ > /tmp/holder; v=$RANDOM$RANDOM$RANDOM; " +
			`trap 'echo $v > /tmp/held' USR1; echo $v > /tmp/held; while :; do sleep 0.2; done`}}}))
	if err == nil && !st.Receive() {
		err = st.Err()
	}
	cancel() // the daemon keeps the process running
	if err != nil {
		e.t.Fatalf("start the holder in %s: %v", sb.ID, err)
	}
	return e.sh(ctx, sb.ID, "while ! test -s /tmp/held; do sleep 0.05; done; cat /tmp/held; rm /tmp/held")
}

func (e *env) sh(ctx context.Context, id, script string) string {
	e.t.Helper()
	var out bytes.Buffer
	if code, err := e.n.Engine.Exec(ctx, id, runtime.ExecSpec{Args: []string{"/bin/sh", "-c", script}, Stdout: &out, Stderr: &out}); err != nil || code != 0 {
		e.t.Fatalf("in %s: %q: exit %d, %v: %s", id, script, code, err, out.String())
	}
	return strings.TrimSpace(out.String())
}

func (e *env) look(ctx context.Context, id string) sandboxView {
	e.t.Helper()
	sb, err := e.n.Engine.Get(ctx, id)
	if err != nil {
		e.t.Fatal(err)
	}
	info, err := e.n.Runtime.State(ctx, sb.Instance)
	if err != nil {
		e.t.Fatal(err)
	}
	var v sandboxView
	if v.exe, err = os.Readlink("/proc/" + strconv.Itoa(info.PID) + "/exe"); err != nil {
		e.t.Fatal(err)
	}
	out := e.sh(ctx, id, "test -e /etc/spore-upgraded && echo upgraded; echo mark=$(cat /tmp/mark 2>/dev/null); "+
		"rm -f /tmp/held; kill -USR1 $(cat /tmp/holder 2>/dev/null) 2>/dev/null || exit 0; "+
		"for i in $(seq 1 60); do test -s /tmp/held && break; sleep 0.05; done; echo held=$(cat /tmp/held 2>/dev/null)")
	for _, l := range strings.Split(out, "\n") {
		k, val, _ := strings.Cut(l, "=")
		switch k {
		case "upgraded":
			v.upgraded = true
		case "mark":
			v.mark = val
		case "held":
			v.held = val
		}
	}
	return v
}

// TestVersionsKeptAcrossUpgrades takes snapshots, hibernates a sandbox and
// builds a template on one runsc build over one build of the base root
// filesystem; then upgrades both (a new tree build, a new runsc binary)
// and restarts the node on them. Everything made before restores, resumes
// and forks with the build that made it over the tree it was made over
// (its memory and files intact), while new sandboxes run the new ones; a
// node that never had the old tree or runsc fetches them from the blob
// store with the snapshot. Once nothing needs them, the old versions go,
// from the nodes and from the blob store, and never before. Before
// versions were kept, the first restore after the upgrade was refused.
func TestVersionsKeptAcrossUpgrades(t *testing.T) {
	testenv.RequireRoot(t)
	ctx := ctxFor(t)
	blobs, err := local.Open(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	runsc := testenv.Runsc(t)
	start := time.Now()
	step := func(what string) { t.Logf("%6.1fs %s", time.Since(start).Seconds(), what) }
	a := &env{t: t, dir: t.TempDir(), cgroup: "/spore-test-" + ids.New('g'), rootfs: tinyRootFS(t),
		tune: func(c *node.Config) { c.Blobs, c.RestoreTargetsBurst, c.OwnRootFS = blobs, -1, true }}
	a.open()
	t.Cleanup(func() { a.destroy() })

	// Before the upgrade: a template, a snapshot, a hibernated sandbox, and
	// a sandbox left running.
	spec := a.n.TemplateSpecs()[0]
	spec.Name = "old-tpl"
	tpl, err := a.n.Engine.BuildTemplate(ctx, spec)
	if err != nil {
		t.Fatal(err)
	}
	oldTree, oldBuild := tpl.RootFSID, a.n.Runtime.Build()
	running := a.create(ctx, engine.CreateOptions{Template: "old-tpl"})
	held := a.prepare(ctx, running, "v1")
	snap, err := a.n.Engine.Snapshot(ctx, running.ID, engine.SnapshotOptions{})
	if err != nil {
		t.Fatal(err)
	}
	sleeper := a.create(ctx, engine.CreateOptions{Template: "old-tpl"})
	asleep := a.prepare(ctx, sleeper, "asleep")
	if err := a.n.Engine.Hibernate(ctx, sleeper.ID); err != nil {
		t.Fatal(err)
	}
	step("before the upgrade: template, snapshot, hibernation")
	if _, err := a.n.Sync.Upload(ctx, snap.Manifest.ID); err != nil {
		t.Fatal(err)
	}
	step("snapshot uploaded with its tree and runsc build")

	// The upgrade: a new build of base, a new runsc; the node restarts.
	a.n.Close()
	newTree := rebuildBase(t, a.rootfs).ID
	newRunsc := anotherRunsc(t, runsc)
	a.tune = func(c *node.Config) { c.Blobs, c.RestoreTargetsBurst, c.Runsc, c.OwnRootFS = blobs, -1, newRunsc, true }
	a.open()
	newBuild := a.n.Runtime.Build()
	if newBuild == oldBuild || newTree == oldTree {
		t.Fatal("the upgrade changed nothing")
	}
	builds := setup.RunscBuildsDir(a.dir)
	oldExe := filepath.Join(gvisor.BuildDir(builds, oldBuild), "runsc")
	newExe := filepath.Join(gvisor.BuildDir(builds, newBuild), "runsc")
	old := func(who string, v sandboxView, mark, held string) {
		t.Helper()
		if v.exe != oldExe || v.upgraded || v.mark != mark || v.held != held {
			t.Fatalf("%s: %+v, want runsc %s over the old tree, mark %q, %q held in memory", who, v, oldExe, mark, held)
		}
	}

	step("upgraded, node reopened")
	restored := a.create(ctx, engine.CreateOptions{Template: snap.Manifest.ID})
	old("restored snapshot", a.look(ctx, restored.ID), "v1", held)
	if err := a.n.Engine.Resume(ctx, sleeper.ID); err != nil {
		t.Fatalf("resume a sandbox hibernated before the upgrade: %v", err)
	}
	old("resumed sandbox", a.look(ctx, sleeper.ID), "asleep", asleep)
	fr, err := a.n.Engine.Fork(ctx, running.ID, engine.ForkOptions{Count: 2})
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range fr.Children {
		if c.Err != nil {
			t.Fatalf("fork of a sandbox started before the upgrade: %v", c.Err)
		}
		old("fork child", a.look(ctx, c.Sandbox.ID), "v1", held)
	}
	fr, err = a.n.Engine.Fork(ctx, restored.ID, engine.ForkOptions{Count: 1})
	if err != nil || fr.Children[0].Err != nil {
		t.Fatalf("fork of a restored old snapshot: %v %+v", err, fr.Children)
	}
	old("fork of the restored snapshot", a.look(ctx, fr.Children[0].Sandbox.ID), "v1", held)
	fromTpl := a.create(ctx, engine.CreateOptions{Template: "old-tpl"})
	if v := a.look(ctx, fromTpl.ID); v.exe != oldExe || v.upgraded {
		t.Fatalf("sandbox of the old template: %+v", v)
	}

	spec.Name = "new-tpl"
	if _, err := a.n.Engine.BuildTemplate(ctx, spec); err != nil {
		t.Fatal(err)
	}
	fresh := a.create(ctx, engine.CreateOptions{Template: "new-tpl"})
	if v := a.look(ctx, fresh.ID); v.exe != newExe || !v.upgraded {
		t.Fatalf("a new sandbox: %+v, want runsc %s over the new tree", v, newExe)
	}
	if rep, err := a.n.PruneVersions(ctx); err != nil || len(rep.RemovedTrees)+len(rep.RemovedBuilds) > 0 {
		t.Fatalf("pruned versions still needed: %+v, %v", rep, err)
	}
	step("restored, resumed, forked; new template and sandbox")

	// A node that never had the old tree nor the old runsc: its own base
	// build, the new runsc.
	b := &env{t: t, dir: t.TempDir(), cgroup: "/spore-test-" + ids.New('g'), rootfs: tinyRootFS(t),
		tune: func(c *node.Config) {
			c.Blobs, c.Runsc, c.NetPrefix, c.RestoreTargets, c.OwnRootFS = blobs, newRunsc, "spv", -1, true
		}}
	rebuildBase(t, b.rootfs)
	step("second node")
	b.open() // prunes the build rebuildBase kept: nothing here needs it
	t.Cleanup(func() { b.destroy() })
	if _, ok := rootfs.Has(b.rootfs, oldTree); ok {
		t.Fatal("the second node holds the old tree")
	}
	if _, err := b.n.Runtime.HasBuild(oldBuild); err == nil {
		t.Fatal("the second node holds the old runsc build")
	}
	if _, err := b.n.Sync.Ensure(ctx, snap.Manifest.ID, nil); err != nil {
		t.Fatalf("fetch an old snapshot on a node that lacks its versions: %v", err)
	}
	step("fetched on the second node")
	moved := b.create(ctx, engine.CreateOptions{Template: snap.Manifest.ID})
	if v := b.look(ctx, moved.ID); v.exe != filepath.Join(gvisor.BuildDir(setup.RunscBuildsDir(b.dir), oldBuild), "runsc") || v.upgraded || v.mark != "v1" || v.held != held {
		t.Fatalf("the old snapshot on the other node: %+v", v)
	}

	// Garbage collection: the blob store keeps the old versions while the
	// snapshot refers to them, and deletes them once it is gone.
	gc := func() chunk.Report {
		t.Helper()
		rep, err := chunk.GC(ctx, blobs, chunk.GCOptions{Grace: time.Nanosecond, Budget: time.Minute})
		if err != nil {
			t.Fatal(err)
		}
		return rep
	}
	deps := []string{snapsync.Dep{Kind: snapsync.DepTree, ID: oldTree}.ManifestID(), snapsync.Dep{Kind: snapsync.DepRuntime, ID: oldBuild}.ManifestID()}
	if rep := gc(); len(rep.HeldDeleted) != 0 {
		t.Fatalf("the store's GC deleted versions a snapshot needs: %v", rep.HeldDeleted)
	}
	if err := a.n.Sync.Delete(ctx, snap.Manifest.ID); err != nil {
		t.Fatal(err)
	}
	if rep := gc(); !slices.Equal(sorted(rep.HeldDeleted), sorted(deps)) {
		t.Fatalf("the store's GC deleted %v, want %v", rep.HeldDeleted, deps)
	}
	// On the nodes: each keeps them while one of its snapshots, templates
	// or sandboxes needs them. A restart frees the restore targets.
	for _, e := range []*env{a, b} {
		for _, sb := range e.n.Engine.List(ctx) {
			if sb.RuntimeBuild == oldBuild {
				if err := e.n.Engine.Kill(ctx, sb.ID); err != nil {
					t.Fatal(err)
				}
			}
		}
		if rep, err := e.n.PruneVersions(ctx); err != nil || slices.Contains(rep.RemovedTrees, oldTree) {
			t.Fatalf("pruned while a snapshot needs them: %+v, %v", rep, err)
		}
		for _, m := range e.n.Engine.Snapshots().List() {
			if m.RuntimeBuild == oldBuild {
				if err := e.n.Engine.DeleteSnapshot(ctx, m.ID); err != nil {
					t.Fatal(err)
				}
			}
		}
		e.n.Close()
		e.open() // prunes
		if kept, err := rootfs.Kept(e.rootfs); err != nil || len(kept) != 0 {
			t.Fatalf("kept trees left: %+v, %v", kept, err)
		}
		if _, err := e.n.Runtime.HasBuild(oldBuild); err == nil {
			t.Fatal("the old runsc build is left")
		}
	}
	if v := a.look(ctx, fresh.ID); v.exe != newExe {
		t.Fatalf("a sandbox of the new versions after the old ones went: %+v", v)
	}
	step("old versions collected")
}

func sorted(s []string) []string {
	s = slices.Clone(s)
	slices.Sort(s)
	return s
}

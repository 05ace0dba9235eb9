package node_test

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"connectrpc.com/connect"

	"github.com/spore-run/spore/internal/blob/local"
	"github.com/spore-run/spore/internal/engine"
	"github.com/spore-run/spore/internal/errdefs"
	"github.com/spore-run/spore/internal/ids"
	"github.com/spore-run/spore/internal/node"
	"github.com/spore-run/spore/internal/oci"
	"github.com/spore-run/spore/internal/rootfs"
	"github.com/spore-run/spore/internal/testenv"
	processpb "github.com/spore-run/spore/proto/gen/process"
)

// shell runs a script with the image's /bin/sh through envd, as the
// sandbox's default user unless c.user says otherwise.
func (c *client) shell(ctx context.Context, script string) string {
	c.t.Helper()
	st, err := c.proc.Start(ctx, connect.NewRequest(&processpb.StartRequest{Process: &processpb.ProcessConfig{Cmd: "/bin/sh", Args: []string{"-c", script}}}))
	if err != nil {
		c.t.Fatalf("start %q: %v", script, err)
	}
	var out, errOut string
	var code int32 = -1
	for st.Receive() {
		ev := st.Msg().GetEvent()
		if d := ev.GetData(); d != nil {
			out += string(d.GetStdout())
			errOut += string(d.GetStderr())
		}
		if e := ev.GetEnd(); e != nil {
			code = e.GetExitCode()
		}
	}
	if err := st.Err(); err != nil || code != 0 {
		c.t.Fatalf("run %q: exit %d, %v: %s%s", script, code, err, out, errOut)
	}
	return out
}

// imageEnv is a node with its own root filesystem directory (no default
// templates: image templates need no base) and network prefix. Its
// sandboxes and snapshots (templates included) are removed at the end.
func imageEnv(t *testing.T, prefix, rootfsDir string, tune func(*node.Config)) *env {
	t.Helper()
	testenv.RequireRoot(t)
	e := &env{t: t, dir: t.TempDir(), cgroup: "/spore-test-" + ids.New('g'), tune: func(c *node.Config) {
		c.RootFSDir, c.NetPrefix = rootfsDir, prefix
		if tune != nil {
			tune(c)
		}
	}}
	e.open()
	t.Cleanup(e.destroy)
	t.Cleanup(func() { // before destroy
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		for _, sb := range e.n.Engine.List(ctx) {
			e.n.Engine.Kill(ctx, sb.ID)
		}
		for _, m := range e.n.Engine.Snapshots().List() {
			if err := e.n.Engine.DeleteSnapshot(ctx, m.ID); err != nil && !errdefs.IsNotFound(err) {
				t.Errorf("cleanup: snapshot %s: %v", m.ID, err)
			}
		}
	})
	return e
}

// TestImageTemplate builds templates from an image in a registry served
// in-process, then runs commands in sandboxes made from them.
func TestImageTemplate(t *testing.T) {
	rootfsDir := t.TempDir()
	e := imageEnv(t, "spx", rootfsDir, nil)
	ctx := ctxFor(t)

	reg := testenv.NewRegistry(t, "spore", "s3cret")
	img := testenv.BusyboxImage(t)
	tagRef := reg.Push(t, "app:v1", img)
	digest, _ := img.Digest()
	digestRef := reg.Host + "/app@" + digest.String()
	key, err := oci.ChainID(img)
	if err != nil {
		t.Fatal(err)
	}
	insecure := oci.Options{Insecure: true, Username: "spore", Password: "s3cret"}
	nothingLeft := func(what, template string) {
		t.Helper()
		if left, _ := filepath.Glob(filepath.Join(rootfsDir, "img-*")); len(left) > 0 {
			t.Fatalf("%s: root filesystem left: %v", what, left)
		}
		if _, err := e.n.Engine.Snapshots().Get(template); !errdefs.IsNotFound(err) {
			t.Fatalf("%s: template %s: %v", what, template, err)
		}
	}

	// Failures: each with its kind, none leaving a root filesystem or a
	// template behind.
	for _, c := range []struct {
		what, ref string
		is        func(error) bool
	}{
		{"malformed ref", reg.Host + "/App::v1", errdefs.IsInvalidArgument},
		{"unknown tag", reg.Host + "/app:nope", errdefs.IsNotFound},
		{"unknown repository", reg.Host + "/other:v1", errdefs.IsNotFound},
		{"registry down", "127.0.0.1:1/app:v1", errdefs.IsUnavailable},
	} {
		_, err := e.n.BuildImageTemplate(ctx, node.ImageTemplateSpec{Name: "img-bad", Ref: c.ref, Registry: insecure})
		if !c.is(err) {
			t.Fatalf("%s: got %v", c.what, err)
		}
		t.Logf("%s: %v", c.what, err)
		nothingLeft(c.what, "img-bad")
	}
	for _, o := range []oci.Options{{Insecure: true}, {Insecure: true, Username: "spore", Password: "wrong"}} {
		_, err := e.n.BuildImageTemplate(ctx, node.ImageTemplateSpec{Name: "img-bad", Ref: tagRef, Registry: o})
		if !errors.Is(err, oci.ErrUnauthorized) || !errdefs.IsInvalidArgument(err) {
			t.Fatalf("credentials %q: got %v", o.Password, err)
		}
		nothingLeft("refused credentials", "img-bad")
	}
	// A build failing after the image was registered (its readiness check
	// never passes) removes the root filesystem it registered.
	_, err = e.n.BuildImageTemplate(ctx, node.ImageTemplateSpec{Name: "img-bad", Ref: tagRef, Registry: insecure,
		Ready: []string{"/bin/false"}, ReadyTimeout: 3 * time.Second})
	if !errdefs.IsUnavailable(err) {
		t.Fatalf("failing readiness check: %v", err)
	}
	nothingLeft("failing readiness check", "img-bad")
	_, err = e.n.BuildImageTemplate(ctx, node.ImageTemplateSpec{Name: "img-bad", Ref: tagRef, Registry: insecure,
		Start: []string{"/no/such/command"}})
	if !errdefs.IsInvalidArgument(err) {
		t.Fatalf("start command not in the image: %v", err)
	}
	t.Logf("start command not in the image: %v", err)
	nothingLeft("start command not in the image", "img-bad")

	// Two templates of one image, by tag and by digest: one tree, one
	// root filesystem, each layer downloaded once.
	ma, err := e.n.BuildImageTemplate(ctx, node.ImageTemplateSpec{Name: "img-a", Ref: tagRef, Registry: insecure})
	if err != nil {
		t.Fatal(err)
	}
	// img-b has a start command (started through the daemon as the image's
	// user, still running in every sandbox) and a ready command.
	mb, err := e.n.BuildImageTemplate(ctx, node.ImageTemplateSpec{Name: "img-b", Ref: digestRef, Registry: insecure,
		Start: []string{"/bin/sh", "-c", "sleep 0.5; echo $$ > /tmp/start.pid; exec sleep 100000"},
		Ready: []string{"/bin/sh", "-c", "test -s /tmp/start.pid"}})
	if err != nil {
		t.Fatal(err)
	}
	if ma.RootFS != rootfs.ImageName(key.String()) || mb.RootFS != ma.RootFS || ma.RootFSID != rootfs.ImageID(key.String()) || mb.RootFSID != ma.RootFSID {
		t.Fatalf("root filesystems: a %s/%s, b %s/%s, want %s/%s", ma.RootFS, ma.RootFSID, mb.RootFS, mb.RootFSID,
			rootfs.ImageName(key.String()), rootfs.ImageID(key.String()))
	}
	if trees, _ := filepath.Glob(filepath.Join(node.OCIStoreDir(rootfsDir), "trees", "*")); len(trees) != 1 {
		t.Fatalf("trees: %v", trees)
	}
	layers, _ := img.Layers()
	for _, l := range layers {
		d, _ := l.Digest()
		if n := reg.BlobGets(d.String()); n != 1 {
			t.Fatalf("layer %s downloaded %d times", d, n)
		}
	}
	// The shared tree is the image's, untouched: Spore's files are only in
	// the root filesystem.
	tree, err := (&oci.Store{Dir: node.OCIStoreDir(rootfsDir)}).Lookup(key.String())
	if err != nil {
		t.Fatal(err)
	}
	if b, _ := os.ReadFile(filepath.Join(tree.Rootfs, "etc", "passwd")); strings.Contains(string(b), "user:") {
		t.Fatalf("the shared tree's /etc/passwd was changed: %q", b)
	}
	for _, p := range []string{"etc/hosts", "etc/resolv.conf", "opt/spore"} {
		if _, err := os.Lstat(filepath.Join(tree.Rootfs, p)); err == nil {
			t.Fatalf("the shared tree has Spore's /%s", p)
		}
	}

	for _, tpl := range []string{"img-a", "img-b"} {
		sb := e.create(ctx, engine.CreateOptions{Template: tpl})
		c := e.client(sb)
		got := c.shell(ctx, `id -un; id -u; pwd; echo "$GREETING"; cat /data/kept.txt /data/new.txt; `+
			`if test -e /data/gone.txt; then echo gone-present; else echo gone-absent; fi; cat /etc/hostname`)
		want := "app\n1234\n/srv/work\nhello from the image\nkept by layer 2\nadded by layer 2\ngone-absent\nsandbox\n"
		t.Logf("%s in %s: %q", tpl, sb.ID, got)
		if got != want {
			t.Fatalf("%s: got\n%s\nwant\n%s", tpl, got, want)
		}
		started := c.shell(ctx, `if test -e /tmp/start.pid; then kill -0 $(cat /tmp/start.pid) && echo running as $(stat -c %U /tmp/start.pid); else echo none; fi`)
		if want := map[string]string{"img-a": "none\n", "img-b": "running as app\n"}[tpl]; started != want {
			t.Fatalf("%s: start command: %q, want %q", tpl, started, want)
		}
		// Spore's additions: the account "user", the resolver.
		c.user = "user"
		if got := c.shell(ctx, `id -un; cat /etc/resolv.conf`); !strings.HasPrefix(got, "user\nnameserver ") {
			t.Fatalf("%s as user: %q", tpl, got)
		}
		if err := e.n.Engine.Kill(ctx, sb.ID); err != nil {
			t.Fatal(err)
		}
	}

	// The identity rule: the root filesystem made again from the same
	// image (a fresh pull and unpack, new files and inodes, as on another
	// node) has the same identity, so the templates taken over the old one
	// restore over it.
	if err := rootfs.Remove(rootfsDir, ma.RootFS); err != nil {
		t.Fatal(err)
	}
	if err := os.RemoveAll(node.OCIStoreDir(rootfsDir)); err != nil {
		t.Fatal(err)
	}
	if _, err := e.n.Engine.Create(ctx, engine.CreateOptions{Template: "img-a"}); !errdefs.IsNotFound(err) {
		t.Fatalf("create without the root filesystem: %v", err)
	}
	mc, err := e.n.BuildImageTemplate(ctx, node.ImageTemplateSpec{Name: "img-c", Ref: tagRef, Registry: insecure})
	if err != nil {
		t.Fatal(err)
	}
	if mc.RootFS != ma.RootFS || mc.RootFSID != ma.RootFSID {
		t.Fatalf("re-made root filesystem: %s/%s, was %s/%s", mc.RootFS, mc.RootFSID, ma.RootFS, ma.RootFSID)
	}
	sb := e.create(ctx, engine.CreateOptions{Template: "img-a"})
	if got := e.client(sb).shell(ctx, `id -un; cat /data/new.txt`); got != "app\nadded by layer 2\n" {
		t.Fatalf("img-a over the re-made root filesystem: %q", got)
	}
}

// TestImageSnapshotAcrossNodes: a snapshot of a sandbox made from an image
// template on node A restores on node B, which never pulled the image: the
// image's root filesystem comes with the snapshot from the blob store (a
// kept build), with its files, the image's defaults and the started
// process. B pulling the same image later (same root filesystem identity)
// makes that copy its image's root filesystem, and a template of it
// restores.
func TestImageSnapshotAcrossNodes(t *testing.T) {
	testenv.RealTier(t)
	blobs, err := local.Open(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	withBlobs := func(c *node.Config) { c.Blobs = blobs }
	a := imageEnv(t, "spy", t.TempDir(), withBlobs)
	b := imageEnv(t, "spz", t.TempDir(), withBlobs)
	ctx := ctxFor(t)
	reg := testenv.NewRegistry(t, "", "")
	ref := reg.Push(t, "app:v1", testenv.BusyboxImage(t))
	insecure := oci.Options{Insecure: true}

	if _, err := a.n.BuildImageTemplate(ctx, node.ImageTemplateSpec{Name: "img-a", Ref: ref, Registry: insecure,
		Start: []string{"/bin/sh", "-c", "echo $$ > /tmp/start.pid; exec sleep 100000"},
		Ready: []string{"/bin/sh", "-c", "test -s /tmp/start.pid"}}); err != nil {
		t.Fatal(err)
	}
	sb := a.create(ctx, engine.CreateOptions{Template: "img-a"})
	a.client(sb).shell(ctx, "echo from-node-a > /srv/work/mark")
	snap, err := a.n.Engine.Snapshot(ctx, sb.ID, engine.SnapshotOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := a.n.Sync.Upload(ctx, snap.Manifest.ID); err != nil {
		t.Fatal(err)
	}
	if _, err := b.n.Sync.Ensure(ctx, snap.Manifest.ID, nil); err != nil {
		t.Fatalf("node B, which never pulled the image: %v", err)
	}
	moved := b.create(ctx, engine.CreateOptions{Template: snap.Manifest.ID})
	got := b.client(moved).shell(ctx, `id -un; pwd; cat mark; echo "$GREETING"; kill -0 $(cat /tmp/start.pid) && echo running`)
	if want := "app\n/srv/work\nfrom-node-a\nhello from the image\nrunning\n"; got != want {
		t.Fatalf("on node B: %q, want %q", got, want)
	}
	// B pulls the image (another template of it): the same build, the
	// copy it holds.
	mb, err := b.n.BuildImageTemplate(ctx, node.ImageTemplateSpec{Name: "img-b", Ref: ref, Registry: insecure})
	if err != nil {
		t.Fatal(err)
	}
	if mb.RootFSID != snap.Manifest.RootFSID {
		t.Fatalf("node B's image root filesystem is build %s, the snapshot's %s", mb.RootFSID, snap.Manifest.RootFSID)
	}
	if sb := b.create(ctx, engine.CreateOptions{Template: "img-b"}); b.client(sb).shell(ctx, "id -un") != "app\n" {
		t.Fatal("a sandbox of node B's image template")
	}
}

package node_test

import (
	"archive/tar"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/layout"

	"github.com/spore-run/spore/internal/engine"
	"github.com/spore-run/spore/internal/errdefs"
	"github.com/spore-run/spore/internal/node"
	"github.com/spore-run/spore/internal/oci"
	"github.com/spore-run/spore/internal/testenv"
)

// layerNames lists a layer's tar entry names.
func layerNames(t *testing.T, l v1.Layer) map[string]string {
	t.Helper()
	rc, err := l.Uncompressed()
	if err != nil {
		t.Fatal(err)
	}
	defer rc.Close()
	out := map[string]string{}
	tr := tar.NewReader(rc)
	for {
		h, err := tr.Next()
		if err == io.EOF {
			return out
		}
		if err != nil {
			t.Fatal(err)
		}
		b, _ := io.ReadAll(tr)
		out[strings.TrimSuffix(h.Name, "/")] = string(b)
	}
}

// TestExportImageSandbox: a sandbox of an image template changes, adds
// and deletes files; exported to a registry, the image builds a template
// on the same node and on another one (its own data and root filesystem
// directories), whose sandboxes see exactly the sandbox's files.
func TestExportImageSandbox(t *testing.T) {
	reg := testenv.NewRegistry(t, "spore", "s3cret")
	insecure := func(c *node.Config) { c.InsecureRegistries = []string{reg.Host} }
	a := imageEnv(t, "spxa", t.TempDir(), insecure)
	ctx := ctxFor(t)
	srcRef := reg.Push(t, "app:v1", testenv.BusyboxImage(t))
	creds := oci.Options{Username: "spore", Password: "s3cret"}
	if _, err := a.n.BuildImage(ctx, node.ImageTemplateSpec{Name: "app", Ref: srcRef, Registry: creds}); err != nil {
		t.Fatal(err)
	}
	sb := a.create(ctx, engine.CreateOptions{Template: "app", Env: []string{"SECRET=from-create"}})
	c := a.client(sb)
	c.user = "root"
	c.shell(ctx, `echo added > /data/added.txt && echo changed > /data/kept.txt && rm /data/new.txt && `+
		`mkdir -p /srv/work/sub && echo deep > /srv/work/sub/f && ln -s ../data/added.txt /srv/link && chown 1234:1234 /srv/work/sub/f && `+
		`chmod 600 /srv/work/sub/f && echo per-sandbox > /etc/hostname`)

	// Bad input first.
	for _, bad := range []struct {
		what string
		spec node.ExportSpec
		is   func(error) bool
	}{
		{"unknown sandbox", node.ExportSpec{SandboxID: "inosuchsandbox0000000", Ref: reg.Host + "/x:v1"}, errdefs.IsNotFound},
		{"malformed ref", node.ExportSpec{SandboxID: sb.ID, Ref: reg.Host + "/Bad::ref"}, errdefs.IsInvalidArgument},
		{"neither ref nor layout", node.ExportSpec{SandboxID: sb.ID}, errdefs.IsInvalidArgument},
		// Same registry, spelled so that it is not in the insecure list.
		{"plain HTTP not allowed", node.ExportSpec{SandboxID: sb.ID, Ref: strings.Replace(reg.Host, "127.0.0.1", "localhost", 1) + "/x:v1", Registry: creds}, errdefs.IsInvalidArgument},
		{"wrong credentials", node.ExportSpec{SandboxID: sb.ID, Ref: reg.Host + "/x:v1", Registry: oci.Options{Username: "spore", Password: "no"}}, errdefs.IsInvalidArgument},
	} {
		_, err := a.n.Export(ctx, bad.spec)
		if !bad.is(err) {
			t.Fatalf("%s: got %v", bad.what, err)
		}
		t.Logf("%s: %v", bad.what, err)
	}

	outRef := reg.Host + "/exported:v1"
	start := time.Now()
	res, err := a.n.Export(ctx, node.ExportSpec{SandboxID: sb.ID, Ref: outRef, Registry: creds})
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("exported in %v: %+v", time.Since(start), res)
	if res.Layers != 2 || res.Deleted != 1 || res.Digest == "" {
		t.Fatalf("export: %+v", res)
	}
	pulled, err := oci.Pull(ctx, outRef, oci.Options{Username: "spore", Password: "s3cret", Insecure: true})
	if err != nil {
		t.Fatal(err)
	}
	cf, _ := pulled.ConfigFile()
	t.Logf("config: %+v", cf.Config)
	if cf.Config.User != "app" || cf.Config.WorkingDir != "/srv/work" || !slices.Contains(cf.Config.Env, "GREETING=hello from the image") ||
		slices.ContainsFunc(cf.Config.Env, func(kv string) bool { return strings.HasPrefix(kv, "SECRET=") || strings.HasPrefix(kv, "HOME=") }) ||
		cf.OS != "linux" || cf.Architecture != "amd64" {
		t.Fatalf("config: %+v", cf)
	}
	layers, _ := pulled.Layers()
	top := layerNames(t, layers[len(layers)-1])
	for _, p := range []string{"etc/hostname", "etc/hosts", "etc/resolv.conf"} {
		for i, l := range layers {
			if _, ok := layerNames(t, l)[p]; ok {
				t.Fatalf("layer %d has per-sandbox /%s", i, p)
			}
		}
	}
	if top["data/added.txt"] != "added\n" || top["data/.wh.new.txt"] != "" {
		t.Fatalf("top layer: %v", top)
	}
	if _, ok := top["data/.wh.new.txt"]; !ok {
		t.Fatalf("top layer has no whiteout for data/new.txt: %v", top)
	}

	check := func(e *env, tpl string) {
		t.Helper()
		if _, err := e.n.BuildImage(ctx, node.ImageTemplateSpec{Name: tpl, Ref: outRef, Registry: creds}); err != nil {
			t.Fatal(err)
		}
		sb := e.create(ctx, engine.CreateOptions{Template: tpl})
		c := e.client(sb)
		got := c.shell(ctx, `id -un; pwd; echo "$GREETING"; cat /data/added.txt /data/kept.txt /srv/link /srv/work/sub/f; `+
			`if test -e /data/new.txt; then echo new-present; else echo new-absent; fi; stat -c '%u %a' /srv/work/sub/f; `+
			`cat /data/.wh.new.txt 2>/dev/null; /bin/busybox --help >/dev/null && echo busybox; cat /etc/hostname; echo "${SECRET:-nosecret}"`)
		want := "app\n/srv/work\nhello from the image\nadded\nchanged\nadded\ndeep\nnew-absent\n1234 600\nbusybox\nsandbox\nnosecret\n"
		if got != want {
			t.Fatalf("%s: got\n%s\nwant\n%s", tpl, got, want)
		}
	}
	check(a, "app-exported")
	b := imageEnv(t, "spxb", t.TempDir(), insecure)
	check(b, "app-exported-b")
}

// TestExportBaseToLayout: a `base` sandbox exported into an OCI layout
// directory: two layers (the root filesystem, cached for the next export,
// and the change), its config, the file in the top layer.
func TestExportBaseToLayout(t *testing.T) {
	e := newEnv(t)
	ctx := ctxFor(t)
	sb := e.create(ctx, engine.CreateOptions{Template: "base"})
	c := e.client(sb)
	c.sh(ctx, `echo hello > ~/note.txt && rm -f ~/.bashrc`)
	var digests []string
	// Only under the node's export directory: anywhere else, a link out
	// of it, ".." are refused, and nothing is written.
	outside := filepath.Join(t.TempDir(), "layout")
	os.MkdirAll(e.n.ExportDir(), 0o700)
	os.Symlink(t.TempDir(), filepath.Join(e.n.ExportDir(), "link"))
	for _, bad := range []string{outside, "../escape", "link/layout", e.n.ExportDir(), "/etc/spore-export"} {
		if _, err := e.n.Export(ctx, node.ExportSpec{SandboxID: sb.ID, LayoutDir: bad}); !errdefs.IsInvalidArgument(err) {
			t.Fatalf("export to %q: %v, want refused", bad, err)
		}
	}
	if _, err := os.Stat(outside); err == nil {
		t.Fatal("a refused export wrote outside the export directory")
	}
	for i := range 2 {
		rel := fmt.Sprintf("t-%d-layout-%d", os.Getpid(), i)
		dir := filepath.Join(e.n.ExportDir(), rel)
		t.Cleanup(func() { os.RemoveAll(dir) })
		start := time.Now()
		res, err := e.n.Export(ctx, node.ExportSpec{SandboxID: sb.ID, LayoutDir: rel})
		if err != nil {
			t.Fatal(err)
		}
		t.Logf("export %d: %v: %+v", i+1, time.Since(start), res)
		p, err := layout.FromPath(dir)
		if err != nil {
			t.Fatal(err)
		}
		idx, err := p.ImageIndex()
		if err != nil {
			t.Fatal(err)
		}
		im, _ := idx.IndexManifest()
		if len(im.Manifests) != 1 || im.Manifests[0].Digest.String() != res.Digest {
			t.Fatalf("index: %+v, export %+v", im, res)
		}
		img, err := p.Image(im.Manifests[0].Digest)
		if err != nil {
			t.Fatal(err)
		}
		layers, err := img.Layers()
		if err != nil || len(layers) != 2 {
			t.Fatalf("layers: %d %v", len(layers), err)
		}
		cf, _ := img.ConfigFile()
		if cf.Config.User != "user" || cf.Config.WorkingDir != "/home/user" || !slices.Equal(cf.Config.Cmd, []string{"/bin/sh"}) {
			t.Fatalf("config: %+v", cf.Config)
		}
		top := layerNames(t, layers[1])
		if top["home/user/note.txt"] != "hello\n" {
			t.Fatalf("top layer: %v", top)
		}
		if _, ok := top["home/user/.wh..bashrc"]; !ok {
			t.Fatalf("no whiteout of ~/.bashrc: %v", top)
		}
		base := layerNames(t, layers[0])
		if _, ok := base["usr/bin/python3"]; !ok {
			t.Fatalf("base layer without usr/bin/python3 (%d entries)", len(base))
		}
		for _, p := range []string{"etc/hostname", "tmp/.spore-tmp-on-disk", "dev/null"} {
			if _, ok := base[p]; ok {
				t.Fatalf("base layer has %s", p)
			}
		}
		d, _ := layers[0].Digest()
		digests = append(digests, d.String())
	}
	if digests[0] != digests[1] {
		t.Fatalf("root filesystem layer made twice differently: %v", digests)
	}
	// This node has no blob store: a layout for a caller off the node
	// has nowhere to go.
	_, err := e.n.Export(ctx, node.ExportSpec{SandboxID: sb.ID, BlobKey: "exports/x.tar"})
	if !errdefs.IsConflict(err) || !strings.Contains(err.Error(), "blob store") {
		t.Fatalf("export to a blob key without a blob store: %v", err)
	}
}

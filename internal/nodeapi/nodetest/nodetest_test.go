package nodetest_test

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"net/http"
	"net/netip"
	"os"
	"path/filepath"
	"syscall"
	"testing"
	"time"

	"connectrpc.com/connect"
	v1 "github.com/google/go-containerregistry/pkg/v1"

	bloblocal "github.com/spore-run/spore/internal/blob/local"
	"github.com/spore-run/spore/internal/chunk"
	"github.com/spore-run/spore/internal/control/controltest"
	"github.com/spore-run/spore/internal/envd"
	"github.com/spore-run/spore/internal/envdclient"
	"github.com/spore-run/spore/internal/errdefs"
	"github.com/spore-run/spore/internal/ids"
	"github.com/spore-run/spore/internal/node"
	"github.com/spore-run/spore/internal/nodeapi"
	"github.com/spore-run/spore/internal/nodeapi/local"
	"github.com/spore-run/spore/internal/nodeapi/nodetest"
	"github.com/spore-run/spore/internal/oci"
	"github.com/spore-run/spore/internal/rootfs"
	"github.com/spore-run/spore/internal/runtime"
	"github.com/spore-run/spore/internal/snapsync"
	"github.com/spore-run/spore/internal/testenv"
	processpb "github.com/spore-run/spore/proto/gen/process"
	"github.com/spore-run/spore/proto/gen/process/processpbconnect"
)

// Fast tier: the in-process node over the engine over the fake runtime,
// directly and through the Connect-RPC hop.

func fakeTarget(t *testing.T) nodetest.Target {
	n := controltest.New(t)
	return nodetest.Target{Node: n.Local, Template: controltest.Templates[0], Sample: n.Engine.SampleActivity, Die: func(ctx context.Context, id string) error {
		sb, err := n.Engine.Get(ctx, id)
		if err != nil {
			return err
		}
		return n.Runtime.Die(sb.Instance, runtime.ExitCrashed, "nodetest: made to die")
	}}
}

func TestConformanceLocalFake(t *testing.T) { nodetest.Run(t, fakeTarget) }

// durableTarget is two fake nodes sharing a blob store (a directory).
func durableTarget(t *testing.T, wrap func(*testing.T, nodeapi.Node) nodeapi.Node) nodetest.Target {
	blobs, err := bloblocal.Open(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	mk := func(id string) (*controltest.Node, nodeapi.Node) {
		n := controltest.New(t)
		cache, err := chunk.OpenCache(filepath.Join(n.Dir, "chunk-cache"), 64<<20)
		if err != nil {
			t.Fatal(err)
		}
		sy, err := snapsync.New(snapsync.Config{Repo: n.Engine.Snapshots(), Store: blobs, Cache: cache, Runtime: n.Engine.Runtime().Name(),
			Log: slog.New(slog.DiscardHandler)})
		if err != nil {
			t.Fatal(err)
		}
		return n, wrap(t, local.New(n.Engine, local.Config{ID: id, Sync: sy}))
	}
	a, na := mk("na")
	_, nb := mk("nb")
	return nodetest.Target{Node: na, Peer: nb, Template: controltest.Templates[0], Sample: a.Engine.SampleActivity, Die: func(ctx context.Context, id string) error {
		sb, err := a.Engine.Get(ctx, id)
		if err != nil {
			return err
		}
		return a.Runtime.Die(sb.Instance, runtime.ExitCrashed, "nodetest: made to die")
	}}
}

func TestConformanceLocalFakeDurable(t *testing.T) {
	nodetest.Run(t, func(t *testing.T) nodetest.Target {
		return durableTarget(t, func(_ *testing.T, n nodeapi.Node) nodeapi.Node { return n })
	})
}

func TestConformanceRPCFakeDurable(t *testing.T) {
	nodetest.Run(t, func(t *testing.T) nodetest.Target {
		return durableTarget(t, func(t *testing.T, n nodeapi.Node) nodeapi.Node { return controltest.Remote(t, n) })
	})
}

func TestConformanceRPCFake(t *testing.T) {
	nodetest.Run(t, func(t *testing.T) nodetest.Target {
		tg := fakeTarget(t)
		tg.Node = controltest.Remote(t, tg.Node)
		return tg
	})
}

// Real tier: the same over a real node (gVisor sandboxes). One node serves
// every subtest (opening one builds its templates); the suite kills what
// it makes, and the node is taken apart at the end.

type realNode struct {
	n      *node.Node
	local  *local.Node
	prefix string
	images *nodetest.Images
}

func openReal(t *testing.T) *realNode {
	t.Helper()
	testenv.RequireRoot(t)
	dir := t.TempDir()
	// Registries for BuildImage: one the node lists as insecure (plain
	// HTTP, with basic auth), one it does not, and a listed port that
	// answers nothing.
	img := testenv.BusyboxImage(t)
	listed, unlisted := testenv.NewRegistry(t, "spore", "s3cret"), testenv.NewRegistry(t, "", "")
	down := "127.0.0.1:1"
	cfg := node.Config{
		DataDir: dir, RootFSDir: testenv.PrivateRootFSDir(t), Runsc: testenv.Runsc(t), EnvdBinary: testenv.EnvdBinary(t),
		NetPrefix: "spc", CgroupParent: "/spore-test-" + ids.New('g'),
		Logger:             slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn})),
		InsecureRegistries: []string{listed.Host, down},
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	n, err := node.Open(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	r := &realNode{n: n, local: local.New(n.Engine, local.Config{ID: "real", Images: n}), prefix: cfg.NetPrefix,
		images: &nodetest.Images{Ref: listed.Push(t, "app:v1", img), User: listed.User, Pass: listed.Pass,
			Unlisted: unlisted.Push(t, "app:v1", img), Down: down + "/app:v1", Shell: shell}}
	t.Cleanup(func() { removeImage(t, cfg.RootFSDir, img) })
	t.Cleanup(func() { r.destroy(t) })
	if err := n.EnsureTemplates(ctx); err != nil {
		t.Fatal(err)
	}
	return r
}

func (r *realNode) destroy(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	for _, sb := range r.n.Engine.List(ctx) {
		t.Errorf("cleanup: sandbox %s left by the suite", sb.ID)
		if err := r.n.Engine.Kill(ctx, sb.ID); err != nil && !errdefs.IsNotFound(err) {
			t.Errorf("cleanup: kill %s: %v", sb.ID, err)
		}
	}
	r.n.Close()
	if err := r.n.Runtime.Purge(ctx); err != nil {
		t.Errorf("cleanup: purge: %v", err)
	}
	if err := r.n.Net.Sweep(ctx, nil); err != nil {
		t.Errorf("cleanup: networks: %v", err)
	}
	r.n.Net.RemoveHostRules()
	if ents, _ := filepath.Glob("/var/run/netns/" + r.prefix + "-*"); len(ents) > 0 {
		t.Errorf("cleanup: namespaces left: %v", ents)
	}
}

// die SIGKILLs the sandbox's gVisor kernel from the host, as the OOM
// killer would.
func (r *realNode) die(ctx context.Context, id string) error {
	sb, err := r.n.Engine.Get(ctx, id)
	if err != nil {
		return err
	}
	info, err := r.n.Runtime.State(ctx, sb.Instance)
	if err != nil {
		return err
	}
	if info.PID <= 0 {
		return fmt.Errorf("instance %s has no PID", sb.Instance)
	}
	return syscall.Kill(info.PID, syscall.SIGKILL)
}

func (r *realNode) target(n nodeapi.Node) nodetest.Target {
	return nodetest.Target{Node: n, Template: node.TemplateBase, Die: r.die, Images: r.images, Sample: r.n.Engine.SampleActivity}
}

func TestConformanceLocalReal(t *testing.T) {
	r := openReal(t)
	nodetest.Run(t, func(t *testing.T) nodetest.Target { return r.target(r.local) })
}

func TestConformanceRPCReal(t *testing.T) {
	r := openReal(t)
	nodetest.Run(t, func(t *testing.T) nodetest.Target { return r.target(controltest.Remote(t, r.local)) })
}

// shell runs a script with /bin/sh in a sandbox through its daemon.
func shell(ctx context.Context, sb nodeapi.Sandbox, script string) (string, error) {
	addr, err := netip.ParseAddr(sb.Addr)
	if err != nil {
		return "", fmt.Errorf("sandbox %s address %q: %w", sb.ID, sb.Addr, err)
	}
	hc := &http.Client{Transport: &http.Transport{DisableKeepAlives: true}}
	pc := processpbconnect.NewProcessClient(hc, envdclient.URL(addr, envd.Port))
	req := connect.NewRequest(&processpb.StartRequest{Process: &processpb.ProcessConfig{Cmd: "/bin/sh", Args: []string{"-c", script}}})
	req.Header().Set("X-Access-Token", sb.AccessToken)
	st, err := pc.Start(ctx, req)
	if err != nil {
		return "", err
	}
	defer st.Close()
	var out, errOut string
	code := int32(-1)
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
		return out, fmt.Errorf("%q: exit %d, %v: %s", script, code, err, errOut)
	}
	return out, nil
}

// removeImage removes what building templates from img left in the
// shared root filesystem directory: its root filesystem and its unpacked
// tree (the suite deleted the templates over them).
func removeImage(t *testing.T, rootfsDir string, img v1.Image) {
	key, err := oci.ChainID(img)
	if err != nil {
		t.Fatal(err)
	}
	name := rootfs.ImageName(key.String())
	if err := rootfs.Remove(rootfsDir, name); err != nil && !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("cleanup: image root filesystem: %v", err)
	}
	os.Remove(filepath.Join(rootfsDir, "."+name+".lock")) // its registration lock
	if err := os.RemoveAll(filepath.Join(node.OCIStoreDir(rootfsDir), "trees", key.Algorithm+"-"+key.Hex)); err != nil {
		t.Errorf("cleanup: image tree: %v", err)
	}
}

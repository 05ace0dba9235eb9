package node_test

import (
	"strings"
	"testing"

	"github.com/spore-run/spore/internal/engine"
	"github.com/spore-run/spore/internal/node"
)

// TestShmFillIsENOSPC: /dev/shm is a tmpfs in the sandbox's memory, which
// killing processes does not free. Filling it in a default sandbox fails
// with ENOSPC at its size (half the sandbox's memory) instead of taking the
// sandbox to its memory limit, and the sandbox lives on.
func TestShmFillIsENOSPC(t *testing.T) {
	e := newEnvTuned(t, func(c *node.Config) { c.NetPrefix = "sps" })
	ctx := ctxFor(t)
	sb := e.create(ctx, engine.CreateOptions{Template: node.TemplateBase})
	c := e.client(sb)
	r, err := c.run(ctx, `head -c 2G /dev/zero > /dev/shm/fill; echo "rc=$?"; du -m /dev/shm/fill`)
	if err != nil {
		t.Fatalf("fill /dev/shm: %v", err)
	}
	t.Logf("fill: %q %q", r.stdout, r.stderr)
	if !strings.Contains(r.stderr, "No space left on device") || !strings.Contains(r.stdout, "rc=1") {
		t.Errorf("filling /dev/shm with 2 GiB: stdout %q stderr %q, want ENOSPC", r.stdout, r.stderr)
	}
	if got := c.sh(ctx, "rm /dev/shm/fill && echo alive"); got != "alive\n" {
		t.Errorf("after the fill: %q", got)
	}
	if got, err := e.n.Engine.Get(ctx, sb.ID); err != nil || got.State != engine.StateRunning {
		t.Errorf("sandbox after the fill: %v %v", got.State, err)
	}
}

// TestShmSizeFollowsTheManifest: a template whose manifest records no
// /dev/shm size (built before sizes existed) still restores, with the
// unsized mount its image was taken with; EnsureTemplates sees it as stale
// and rebuilds it, and sandboxes from the new one get the size.
func TestShmSizeFollowsTheManifest(t *testing.T) {
	e := newEnvTuned(t, func(c *node.Config) { c.NetPrefix = "spt" })
	ctx := ctxFor(t)
	old := e.n.TemplateSpecs()[0]
	old.Run.Limits.ShmMB = 0
	if _, err := e.n.Engine.BuildTemplate(ctx, old); err != nil {
		t.Fatal(err)
	}
	shmSize := func() string {
		sb := e.create(ctx, engine.CreateOptions{Template: node.TemplateBase})
		defer e.n.Engine.Kill(ctx, sb.ID)
		return strings.TrimSpace(e.client(sb).sh(ctx, "df -m --output=size /dev/shm | tail -1"))
	}
	if got := shmSize(); got == "512" {
		t.Fatalf("/dev/shm of the old template is %s MiB, want the unsized default", got)
	}
	if err := e.n.EnsureTemplates(ctx); err != nil {
		t.Fatal(err)
	}
	m, err := e.n.Engine.Snapshots().Get(node.TemplateBase)
	if err != nil || m.Run.Limits.ShmMB != 512 {
		t.Fatalf("rebuilt template: shm %d MiB, %v", m.Run.Limits.ShmMB, err)
	}
	if got := shmSize(); got != "512" {
		t.Fatalf("/dev/shm of the rebuilt template is %s MiB, want 512", got)
	}
}

package node_test

import (
	"strconv"
	"strings"
	"testing"

	"github.com/spore-run/spore/internal/engine"
	"github.com/spore-run/spore/internal/node"
)

// TestTmpIsOnDisk: runsc mounts an unsized tmpfs (in the sandbox's memory)
// over an empty /tmp, so filling /tmp took the whole sandbox to its memory
// limit and killed it. /tmp now lives on the root overlay: a fill past the
// disk limit is ENOSPC and the sandbox lives on.
func TestTmpIsOnDisk(t *testing.T) {
	e := newEnvTuned(t, func(c *node.Config) { c.NetPrefix = "spk" })
	ctx := ctxFor(t)
	if spec := e.n.TemplateSpecs()[0]; spec.Run.Limits.DiskMB <= 0 {
		t.Fatalf("the default template has no disk limit: %+v", spec.Run.Limits)
	}
	// The base template with a small disk: filling the default 4 GiB took
	// 97 s of CI (the overlay writes every byte); the limit is the same
	// mechanism at any size.
	spec := e.n.TemplateSpecs()[0]
	spec.Name = "small-disk"
	spec.Run.Limits.DiskMB = 256
	if _, err := e.n.Engine.BuildTemplate(ctx, spec); err != nil {
		t.Fatal(err)
	}
	sb := e.create(ctx, engine.CreateOptions{Template: "small-disk"})
	c := e.client(sb)
	if fs := strings.TrimSpace(c.sh(ctx, "stat -f -c %T /tmp")); fs == "tmpfs" {
		t.Errorf("/tmp is a %s", fs)
	}
	limit := sb.Run.Limits.DiskMB
	if limit != 256 {
		t.Fatalf("sandbox's disk limit %d MB, want the template's 256", limit)
	}
	r, err := c.run(ctx, `head -c `+strconv.FormatInt(limit+256, 10)+`M /dev/zero > /tmp/fill; echo "rc=$?"`)
	if err != nil {
		t.Fatalf("fill /tmp: %v", err)
	}
	if !strings.Contains(r.stderr, "No space left on device") || !strings.Contains(r.stdout, "rc=1") {
		t.Errorf("filling /tmp past the %d MB disk: stdout %q stderr %q, want ENOSPC", limit, r.stdout, r.stderr)
	}
	if got := c.sh(ctx, "rm /tmp/fill && echo alive"); got != "alive\n" {
		t.Errorf("after the fill: %q", got)
	}
	if got, err := e.n.Engine.Get(ctx, sb.ID); err != nil || got.State != engine.StateRunning {
		t.Errorf("sandbox after the fill: %v %v", got.State, err)
	}
}

package node_test

import (
	"testing"

	"github.com/google/nftables"

	"github.com/spore-run/spore/internal/engine"
	"github.com/spore-run/spore/internal/node"
)

// hostTable reports whether the root namespace holds prefix's table.
func hostTable(t *testing.T, prefix string) bool {
	t.Helper()
	c, err := nftables.New()
	if err != nil {
		t.Fatal(err)
	}
	tables, err := c.ListTablesOfFamily(nftables.TableFamilyIPv4)
	if err != nil {
		t.Fatal(err)
	}
	for _, tb := range tables {
		if tb.Name == prefix+"-host" {
			return true
		}
	}
	return false
}

// A node that stops with a sandbox still running keeps the root
// namespace's table (the sandbox's egress is masqueraded by it, and the
// node re-attaches the sandbox at its next start); one that stops with no
// sandbox network left removes it, so its DNS port rule does not outlive
// the forwarder (one such table, left by an unknown earlier run, was
// found on a development machine).
func TestCloseRemovesHostRulesWithNoSandboxLeft(t *testing.T) {
	e := newEnvTuned(t, func(c *node.Config) { c.NetPrefix = "spx" })
	ctx := ctxFor(t)
	sb := e.create(ctx, engine.CreateOptions{Template: node.TemplateBase})
	e.n.Close()
	if !hostTable(t, "spx") {
		t.Fatal("the table went while a sandbox's network remains")
	}
	e.open() // re-attaches the sandbox
	if err := e.n.Engine.Kill(ctx, sb.ID); err != nil {
		t.Fatal(err)
	}
	e.n.Close()
	if hostTable(t, "spx") {
		t.Fatal("the table stayed with no sandbox network left")
	}
	e.open() // for the cleanup
}

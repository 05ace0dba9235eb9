package netns_test

import (
	"context"
	"os"
	"path/filepath"
	"testing"
)

// TestTeardownUnmountedNamespaceFile: a kill between creating a
// namespace's file under /var/run/netns and bind-mounting the namespace
// on it leaves a plain file. Teardown and Sweep must remove it (unmounting
// it fails with EINVAL). Before, every Teardown failed with "invalid
// argument" and the node's purge could never finish (seen in CI after a
// node agent was SIGKILLed during a fork).
func TestTeardownUnmountedNamespaceFile(t *testing.T) {
	m := newManager(t)
	ctx := context.Background()
	for _, name := range []string{"spt-sb-torn1-1", "spt-gw-torn1-1", "spt-sb-torn2-1"} {
		p := filepath.Join("/var/run/netns", name)
		if err := os.WriteFile(p, nil, 0o444); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { os.Remove(p) })
	}
	if err := m.Teardown(ctx, "torn1-1"); err != nil {
		t.Fatalf("teardown of a namespace whose file was never mounted: %v", err)
	}
	if err := m.Sweep(ctx, nil); err != nil {
		t.Fatalf("sweep: %v", err)
	}
	for _, name := range []string{"spt-sb-torn1-1", "spt-gw-torn1-1", "spt-sb-torn2-1"} {
		if _, err := os.Stat(filepath.Join("/var/run/netns", name)); !os.IsNotExist(err) {
			t.Errorf("%s left: %v", name, err)
		}
	}
}

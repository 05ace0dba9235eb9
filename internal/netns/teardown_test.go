package netns_test

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"testing"

	"github.com/vishvananda/netlink"

	"github.com/spore-run/spore/internal/netns"
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

// Teardown leaves the links to the kernel, which removes them with the
// namespaces: they are gone soon after, and the slot's next holder gets
// its host end even when an old link of that name is still there (here
// a link nothing removes: Setup waits for it, then deletes it).
func TestTeardownLeavesTheLinksToTheKernel(t *testing.T) {
	m := newManager(t)
	ctx := context.Background()
	a, err := m.Setup(ctx, "links-a", netns.Policy{Internet: true})
	if err != nil {
		t.Fatal(err)
	}
	if err := m.Teardown(ctx, "links-a"); err != nil {
		t.Fatal(err)
	}
	hostEnd := fmt.Sprintf("spth%d", a.Slot)
	eventually(t, func() error {
		if _, err := netlink.LinkByName(hostEnd); err == nil {
			return fmt.Errorf("%s still there", hostEnd)
		}
		return nil
	})
	// The slot handed out next (round-robin) has a stale link of its
	// host end's name, without an address.
	stale := fmt.Sprintf("spth%d", a.Slot+1)
	if err := netlink.LinkAdd(&netlink.Veth{LinkAttrs: netlink.LinkAttrs{Name: stale}, PeerName: stale + "p"}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if l, err := netlink.LinkByName(stale + "p"); err == nil {
			netlink.LinkDel(l)
		}
	})
	old, err := netlink.LinkByName(stale)
	if err != nil {
		t.Fatal(err)
	}
	b, err := m.Setup(ctx, "links-b", netns.Policy{Internet: true})
	if err != nil {
		t.Fatalf("setup over a stale host link: %v", err)
	}
	if b.Slot != a.Slot+1 {
		t.Fatalf("slot %d, want %d", b.Slot, a.Slot+1)
	}
	if l, err := netlink.LinkByName(stale); err != nil || l.Attrs().Index == old.Attrs().Index {
		t.Fatalf("host end after setup: the stale link (%v)", err)
	}
	if _, err := netlink.LinkByName(stale + "p"); err == nil {
		t.Fatal("the stale link's peer is still there")
	}
}

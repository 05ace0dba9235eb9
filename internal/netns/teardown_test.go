package netns_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"sync"
	"testing"

	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"

	"github.com/spore-run/spore/internal/errdefs"
	"github.com/spore-run/spore/internal/netns"
	"github.com/spore-run/spore/internal/testenv"
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

// A sandbox's connections outlive its namespaces in the root namespace's
// connection tracking (an established TCP entry lasts days); Teardown
// flushes them, for IPv4 and IPv6, so a later holder of the slot starts
// clean.
func TestTeardownFlushesConnectionTracking(t *testing.T) {
	m := newManager(t)
	ctx := context.Background()
	n, err := m.Setup(ctx, "ct-a", netns.Policy{Internet: true})
	if err != nil {
		t.Fatal(err)
	}
	peer := testenv.NewTestHost(t, "spt-ctpeer", netip.MustParseAddr("198.18.7.2"), netip.MustParseAddr("198.18.7.1"), false)
	peer.AddIPv6(t, netip.MustParseAddr("2001:2:0:7::2"), netip.MustParseAddr("2001:2:0:7::1"))
	var mu sync.Mutex
	var held []net.Conn
	t.Cleanup(func() {
		mu.Lock()
		defer mu.Unlock()
		for _, c := range held {
			c.Close()
		}
	})
	for _, addr := range []string{"198.18.7.2:8008", "[2001:2:0:7::2]:8008"} {
		l := peer.Listen(t, "tcp", addr)
		go func() {
			for {
				c, err := l.Accept()
				if err != nil {
					return
				}
				mu.Lock()
				held = append(held, c) // kept open: the entry stays established
				mu.Unlock()
			}
		}()
		// A process in the sandbox's namespace connects and stays.
		cmd := exec.Command("ip", "netns", "exec", "spt-sb-ct-a", "/usr/bin/python3", "-c",
			"import socket,sys,time; h,p=sys.argv[1].rsplit(':',1); s=socket.create_connection((h.strip('[]'),int(p))); time.sleep(600)", addr)
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { cmd.Process.Kill(); cmd.Wait() })
	}
	entries := func() (n4, n6 int) {
		for fam, count := range map[netlink.InetFamily]*int{unix.AF_INET: &n4, unix.AF_INET6: &n6} {
			flows, err := netlink.ConntrackTableList(netlink.ConntrackTable, fam)
			if err != nil {
				t.Fatal(err)
			}
			for _, f := range flows {
				for _, ip := range []net.IP{f.Forward.SrcIP, f.Reverse.DstIP} {
					if a, _ := netip.AddrFromSlice(ip); a.Unmap() == n.Addr || a.Unmap() == n.Addr6 {
						*count++
						break
					}
				}
			}
		}
		return
	}
	eventually(t, func() error {
		if n4, n6 := entries(); n4 == 0 || n6 == 0 {
			return fmt.Errorf("connection tracking of the sandbox: %d IPv4, %d IPv6 entries", n4, n6)
		}
		return nil
	})
	// The sandbox's processes go, as its sandbox would, then its network.
	if out, err := exec.Command("sh", "-c", "kill -9 $(ip netns pids spt-sb-ct-a)").CombinedOutput(); err != nil {
		t.Fatalf("kill: %v %s", err, out)
	}
	if err := m.Teardown(ctx, "ct-a"); err != nil {
		t.Fatal(err)
	}
	// The flush is batched: the slot stays marked, so no network gets it,
	// until the flush Teardown scheduled has run.
	mark := filepath.Join("/run/spore-netns-ct", strconv.Itoa(n.Slot))
	if _, err := os.Stat(mark); err != nil {
		if n4, n6 := entries(); n4 != 0 || n6 != 0 {
			t.Fatalf("slot %d is not marked (%v), and %d IPv4, %d IPv6 entries of the sandbox are left", n.Slot, err, n4, n6)
		}
	}
	eventually(t, func() error {
		if n4, n6 := entries(); n4 != 0 || n6 != 0 {
			return fmt.Errorf("after teardown: %d IPv4, %d IPv6 entries of the sandbox left", n4, n6)
		}
		if _, err := os.Stat(mark); err == nil {
			return fmt.Errorf("slot %d still marked after its flush", n.Slot)
		}
		return nil
	})
}

// A slot whose connection tracking is not flushed yet is not handed out:
// the next network takes the slot after it, and the flush clears the mark.
func TestMarkedSlotSkipped(t *testing.T) {
	state := t.TempDir()
	m := newManagerWith(t, netns.Config{StateDir: state})
	ctx := context.Background()
	a, err := m.Setup(ctx, "mk-a", netns.Policy{Internet: true})
	if err != nil {
		t.Fatal(err)
	}
	if err := m.Teardown(ctx, "mk-a"); err != nil {
		t.Fatal(err)
	}
	mark := filepath.Join("/run/spore-netns-ct", strconv.Itoa(a.Slot))
	// Hold the mark: the test plays a flush that has not run yet.
	if err := os.WriteFile(mark, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.Remove(mark) })
	// Once its host end is gone, the slot would be free: the cursor points
	// at it.
	eventually(t, func() error {
		if _, err := netlink.LinkByName("spth" + strconv.Itoa(a.Slot)); err == nil {
			return fmt.Errorf("host end of slot %d still there", a.Slot)
		}
		return nil
	})
	if err := os.WriteFile(filepath.Join(state, "cursor"), []byte(strconv.Itoa(a.Slot)), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(mark, nil, 0o600); err != nil { // again, in case the scheduled flush ran meanwhile
		t.Fatal(err)
	}
	b, err := m.Setup(ctx, "mk-b", netns.Policy{Internet: true})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { m.Teardown(ctx, "mk-b") })
	if b.Slot == a.Slot {
		t.Fatalf("network of mk-b got slot %d, marked for a flush", b.Slot)
	}
	if err := m.FlushConntrack(); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(mark); err == nil {
		t.Fatalf("slot %d still marked after a flush", a.Slot)
	}
}

// A slot is held exactly as long as a record of this manager's names it:
// a record found at start holds its slot even with no host end left, and
// a torn-down network's slot is handed out again.
func TestSlotsHeldByTheRecords(t *testing.T) {
	state := t.TempDir()
	ctx := context.Background()
	// A record a previous run left: its slot is where the cursor points,
	// its host end long gone.
	const ghostSlot = 4000
	b, err := json.Marshal(netns.Net{Instance: "sl-ghost", Slot: ghostSlot, Policy: netns.Policy{Internet: true}})
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(state, "sl-ghost.json"), b, 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(state, "cursor"), []byte(strconv.Itoa(ghostSlot)), 0o600); err != nil {
		t.Fatal(err)
	}
	m := newManagerWith(t, netns.Config{StateDir: state})
	a, err := m.Setup(ctx, "sl-a", netns.Policy{Internet: true})
	if err != nil {
		t.Fatal(err)
	}
	if a.Slot == ghostSlot {
		t.Fatalf("network of sl-a got slot %d, held by the record of sl-ghost", a.Slot)
	}
	if _, err := m.Setup(ctx, "sl-a", netns.Policy{Internet: true}); !errors.Is(err, errdefs.ErrAlreadyExists) {
		t.Fatalf("a second network of sl-a: %v, want already exists", err)
	}
	// Torn down, its slot is free again once its host end is gone and its
	// connection tracking flushed.
	if err := m.Teardown(ctx, "sl-a"); err != nil {
		t.Fatal(err)
	}
	eventually(t, func() error {
		if _, err := netlink.LinkByName("spth" + strconv.Itoa(a.Slot)); err == nil {
			return fmt.Errorf("host end of slot %d still there", a.Slot)
		}
		return nil
	})
	if err := m.FlushConntrack(); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(state, "cursor"), []byte(strconv.Itoa(a.Slot)), 0o600); err != nil {
		t.Fatal(err)
	}
	c, err := m.Setup(ctx, "sl-c", netns.Policy{Internet: true})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { m.Teardown(ctx, "sl-c") })
	if c.Slot != a.Slot {
		t.Fatalf("network of sl-c got slot %d, want %d, freed by sl-a", c.Slot, a.Slot)
	}
}

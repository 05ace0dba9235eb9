package netns_test

import (
	"net"
	"net/netip"
	"runtime"
	"sync"
	"testing"
	"time"

	"github.com/vishvananda/netlink"
	vnetns "github.com/vishvananda/netns"

	"github.com/spore-run/spore/internal/netns"
	"github.com/spore-run/spore/internal/testenv"
)

// HostAddrs answers, complete, while links come and go: a netlink dump
// spanning several messages is flagged interrupted when the table changes
// during it, and the list may then miss entries. Under load a fork's
// network setup failed with "results may be incomplete or inconsistent"
// (TestLoad: a fork child 500) because one interrupted dump was an error.
// Runs in a namespace of its own: 300 stable addresses (the dump spans
// several messages) and a goroutine adding and removing others.
func TestHostAddrsSurvivesConcurrentChanges(t *testing.T) {
	testenv.RealTier(t)
	testenv.RequireRoot(t)
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	orig, err := vnetns.Get()
	if err != nil {
		t.Fatal(err)
	}
	defer orig.Close()
	ns, err := vnetns.New() // switches this thread into it
	if err != nil {
		t.Fatal(err)
	}
	defer func() {
		vnetns.Set(orig)
		ns.Close()
	}()
	h, err := netlink.NewHandleAt(ns)
	if err != nil {
		t.Fatal(err)
	}
	defer h.Close()
	addLink := func(name string) netlink.Link {
		l := &netlink.Veth{LinkAttrs: netlink.LinkAttrs{Name: name}, PeerName: name + "p"} // no dummy module here
		if err := h.LinkAdd(l); err != nil {
			t.Fatal(err)
		}
		return l
	}
	stable := addLink("stable0")
	want := map[netip.Addr]bool{}
	for i := range 300 {
		a := netip.AddrFrom4([4]byte{10, 77, byte(i / 250), byte(1 + i%250)})
		if err := h.AddrAdd(stable, &netlink.Addr{IPNet: &net.IPNet{IP: a.AsSlice(), Mask: net.CIDRMask(32, 32)}}); err != nil {
			t.Fatal(err)
		}
		want[a] = true
	}
	churn := addLink("churn0")
	stop := make(chan struct{})
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		for i := 0; ; i++ {
			select {
			case <-stop:
				return
			default:
			}
			a := &netlink.Addr{IPNet: &net.IPNet{IP: net.IPv4(10, 78, byte(i/250%250), byte(1+i%250)), Mask: net.CIDRMask(32, 32)}}
			if err := h.AddrAdd(churn, a); err == nil {
				h.AddrDel(churn, a)
			}
			// ~2,500 changes a second: far more than sandboxes come and
			// go, and enough to interrupt most dumps.
			time.Sleep(200 * time.Microsecond)
		}
	}()
	defer func() { close(stop); wg.Wait() }()
	const calls = 300
	for i := range calls {
		got, err := netns.HostAddrs()
		if err != nil {
			t.Fatalf("call %d of %d: %v", i+1, calls, err)
		}
		for a := range want {
			if !got[a] {
				t.Fatalf("call %d: %s missing from %d addresses", i+1, a, len(got))
			}
		}
	}
	t.Logf("%d complete lists under concurrent changes", calls)
}

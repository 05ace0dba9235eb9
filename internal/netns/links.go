package netns

// Namespaces, links and addresses: the kernel plumbing Setup is made of.

import (
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"time"

	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"
)

// dumpTries bounds the rereads of an interrupted netlink dump: each is
// interrupted only by a change landing during it, and the waits between
// them grow (in all ~0.5 s at most).
const dumpTries = 100

// HostAddrs returns the addresses (IPv4 and IPv6) configured in the calling
// thread's namespace (the root one, for a node). A dump that a concurrent
// change interrupted (another sandbox's link coming or going: the kernel
// flags it, netlink.ErrDumpInterrupted, and the list may miss entries) is
// read again.
func HostAddrs() (map[netip.Addr]bool, error) {
	var addrs []netlink.Addr
	var err error
	for i := range dumpTries {
		if addrs, err = netlink.AddrList(nil, netlink.FAMILY_ALL); !errors.Is(err, netlink.ErrDumpInterrupted) {
			break
		}
		time.Sleep(time.Duration(i+1) * 100 * time.Microsecond) // let a burst of changes pass
	}
	if err != nil {
		return nil, fmt.Errorf("list host addresses: %w", err)
	}
	out := map[netip.Addr]bool{}
	for _, a := range addrs {
		if ip, ok := netip.AddrFromSlice(a.IP); ok {
			out[ip.Unmap()] = true
		}
	}
	return out, nil
}

// addAddr6 gives the link name an IPv6 address and, when gw is valid, a
// default route via it (the link is up already).
func addAddr6(h *netlink.Handle, name string, addr netip.Prefix, gw netip.Addr) error {
	l, err := h.LinkByName(name)
	if err != nil {
		return err
	}
	if err := addAddr(h, l, addr); err != nil {
		return err
	}
	return defaultRoute(h, l, gw)
}

// addAddr gives a link an address of either family. IPv6 ones skip
// duplicate address detection: they are the namespace's own, nobody else
// on the link has them, and detection would keep them unusable for a
// second.
func addAddr(h *netlink.Handle, l netlink.Link, addr netip.Prefix) error {
	a := &netlink.Addr{IPNet: &net.IPNet{IP: addr.Addr().AsSlice(), Mask: net.CIDRMask(addr.Bits(), addr.Addr().BitLen())}}
	if addr.Addr().Is6() {
		a.Flags = unix.IFA_F_NODAD
	}
	if err := h.AddrAdd(l, a); err != nil {
		return fmt.Errorf("address %v: %w", addr, err)
	}
	return nil
}

// defaultRoute adds a default route via gw on a link that is up, when gw
// is valid.
func defaultRoute(h *netlink.Handle, l netlink.Link, gw netip.Addr) error {
	if !gw.IsValid() {
		return nil
	}
	if err := h.RouteAdd(&netlink.Route{LinkIndex: l.Attrs().Index, Gw: gw.AsSlice()}); err != nil {
		return fmt.Errorf("default route via %v: %w", gw, err)
	}
	return nil
}

// hostHasIPv6 says whether the calling thread's namespace has IPv6.
func hostHasIPv6() bool {
	b, err := os.ReadFile("/proc/sys/net/ipv6/conf/all/disable_ipv6")
	return err == nil && strings.TrimSpace(string(b)) == "0"
}

// forward6 switches on IPv6 forwarding in the root namespace. A host
// that forwards ignores router advertisements on interfaces whose
// accept_ra is 1 (the default), which would cost it its own
// autoconfigured addresses and default route: such interfaces get
// accept_ra 2 (accept them while forwarding) first, as routers that
// autoconfigure their uplink do. "default" (what interfaces made later
// get) is left alone: the sandboxes' host ends must not take
// advertisements.
func forward6(log *slog.Logger) error {
	const all = "/proc/sys/net/ipv6/conf/all/forwarding"
	if b, err := os.ReadFile(all); err == nil && strings.TrimSpace(string(b)) == "1" {
		return nil
	}
	confs, _ := filepath.Glob("/proc/sys/net/ipv6/conf/*/accept_ra")
	for _, f := range confs {
		ifname := filepath.Base(filepath.Dir(f))
		if ifname == "all" || ifname == "default" || ifname == "lo" {
			continue
		}
		if b, err := os.ReadFile(f); err == nil && strings.TrimSpace(string(b)) == "1" {
			if err := os.WriteFile(f, []byte("2"), 0o644); err != nil {
				return fmt.Errorf("accept_ra of %s: %w", ifname, err)
			}
			log.Info("IPv6 forwarding: router advertisements stay accepted", "interface", ifname)
		}
	}
	return os.WriteFile(all, []byte("1"), 0o644)
}

// ConfigureLink renames (when newName is set), addresses and raises a link,
// and adds a default route via gw when valid.
func ConfigureLink(h *netlink.Handle, name, newName string, addr netip.Prefix, mac net.HardwareAddr, gw netip.Addr) error {
	l, err := h.LinkByName(name)
	if err != nil {
		return err
	}
	if newName != "" {
		if err := h.LinkSetName(l, newName); err != nil {
			return err
		}
	}
	if mac != nil {
		if err := h.LinkSetHardwareAddr(l, mac); err != nil {
			return err
		}
	}
	if err := addAddr(h, l, addr); err != nil {
		return err
	}
	if err := h.LinkSetUp(l); err != nil {
		return err
	}
	return defaultRoute(h, l, gw)
}

const runDir = "/var/run/netns"

// sharedRunDir makes the namespace directory a shared mount point, the way
// iproute2 does on its first `ip netns add`. Without it, an `ip netns`
// command run later re-mounts the directory over itself and hides every
// namespace created before.
func sharedRunDir() error {
	if err := os.MkdirAll(runDir, 0o755); err != nil {
		return err
	}
	err := unix.Mount("", runDir, "none", unix.MS_SHARED|unix.MS_REC, "")
	if errors.Is(err, unix.EINVAL) { // not a mount point yet
		if err := unix.Mount(runDir, runDir, "none", unix.MS_BIND|unix.MS_REC, ""); err != nil {
			return fmt.Errorf("bind %s: %w", runDir, err)
		}
		err = unix.Mount("", runDir, "none", unix.MS_SHARED|unix.MS_REC, "")
	}
	if err != nil {
		return fmt.Errorf("make %s shared: %w", runDir, err)
	}
	return nil
}

// newNamed creates a named network namespace without moving the calling
// goroutine's thread into it for longer than the call.
func newNamed(name string) (netns.NsHandle, error) {
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	orig, err := netns.Get()
	if err != nil {
		return netns.None(), err
	}
	defer orig.Close()
	defer netns.Set(orig)
	return netns.NewNamed(name)
}

// inNS runs fn with the calling thread in ns.
func inNS(ns netns.NsHandle, fn func() error) error {
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	orig, err := netns.Get()
	if err != nil {
		return err
	}
	defer orig.Close()
	if err := netns.Set(ns); err != nil {
		return err
	}
	defer netns.Set(orig)
	return fn()
}

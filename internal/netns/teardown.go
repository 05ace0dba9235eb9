package netns

// Freeing networks: Teardown, the sweep of what a crash left, and the
// connection tracking a sandbox leaves behind.

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"strings"

	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"
)

// Teardown removes an instance's namespaces, links and record. It is
// idempotent; a missing network is not an error.
//
// The links go with the namespaces: once the last reference to the
// gateway namespace is dropped (its processes are gone, and the egress
// proxy's listeners and the audit's descriptor are closed here), the
// kernel removes the namespace and the veth pairs in it, the host end's
// peer included, in the background. Deleting the host end here instead
// cost 28 ms (IPv4) and 43 ms (IPv6 beside it) of the caller's time per
// sandbox, measured; the kernel batches the background removals of many
// namespaces. Until it is done the host end keeps its address, so the
// slot is not handed out (allocate skips slots whose host address
// exists), and build waits for a leftover host end of its name.
func (m *Manager) Teardown(ctx context.Context, instance string) error {
	var errs []error
	if m.cfg.Egress != nil {
		m.cfg.Egress.Stop(instance)
	}
	m.stopAudit(instance)
	n, err := m.Get(instance)
	if err == nil {
		defer m.unindex(n.Addr)
		// Its connection tracking is flushed with the next batch
		// (conntrack.go); the mark keeps the slot from being handed out
		// before. Without one, it is flushed here, after the namespaces.
		if merr := markDirty(n.Slot); merr != nil {
			m.cfg.Logger.Warn("network: mark a slot for a batched conntrack flush; flushing now", "slot", n.Slot, "err", merr)
			defer flushConntrack(n.Addr)
			if n.Addr6.IsValid() {
				defer flushConntrack(n.Addr6)
			}
		} else {
			defer m.scheduleFlush()
		}
	}
	for _, name := range []string{m.sbName(instance), m.gwName(instance)} {
		err := netns.DeleteNamed(name)
		if errors.Is(err, unix.EINVAL) {
			// Not a mount point: the namespace's file was made but never
			// bind-mounted (a kill between the two), or the unmount was
			// done before. The file is all that is left of it.
			err = os.Remove(filepath.Join(runDir, name))
		}
		if err != nil && !errors.Is(err, os.ErrNotExist) {
			errs = append(errs, fmt.Errorf("delete %s: %w", name, err))
		}
	}
	if err := os.Remove(m.statePath(instance)); err != nil && !errors.Is(err, os.ErrNotExist) {
		errs = append(errs, err)
	} else if n.Instance != "" {
		m.freeSlot(n.Slot, instance)
	}
	return errors.Join(errs...)
}

// flushConntrack deletes the root namespace's connection-tracking entries
// of a sandbox address (connections to it, and its own outbound ones).
func flushConntrack(addr netip.Addr) {
	ip := net.IP(addr.AsSlice())
	toIt := &netlink.ConntrackFilter{}
	toIt.AddIP(netlink.ConntrackReplyAnyIP, ip)
	fromIt := &netlink.ConntrackFilter{}
	fromIt.AddIP(netlink.ConntrackOrigSrcIP, ip)
	family := netlink.InetFamily(unix.AF_INET)
	if addr.Is6() {
		family = unix.AF_INET6
	}
	netlink.ConntrackDeleteFilters(netlink.ConntrackTable, family, toIt, fromIt)
}

// Sweep removes namespaces with the manager's prefix that no record
// claims (left by a crash between creating them and recording).
func (m *Manager) Sweep(ctx context.Context, keep map[string]bool) error {
	ents, _ := os.ReadDir(runDir)
	var errs []error
	for _, e := range ents {
		for _, kind := range []string{"-sb-", "-gw-"} {
			if inst, ok := strings.CutPrefix(e.Name(), m.cfg.Prefix+kind); ok && !keep[inst] {
				if err := m.Teardown(ctx, inst); err != nil {
					errs = append(errs, err)
				}
			}
		}
	}
	ids, _ := m.List()
	for _, id := range ids {
		if !keep[id] {
			if err := m.Teardown(ctx, id); err != nil {
				errs = append(errs, err)
			}
		}
	}
	// One flush for all it freed, now: a purge exits right after.
	if err := m.FlushConntrack(); err != nil {
		errs = append(errs, fmt.Errorf("flush connection tracking: %w", err))
	}
	return errors.Join(errs...)
}

// slotOf returns the slot an address of the sandbox space (IPv4 or IPv6)
// belongs to.
func (m *Manager) slotOf(a netip.Addr) (int, bool) {
	if a.Is6() {
		if !sandboxSpace6.Contains(a) {
			return 0, false
		}
		b := a.As16()
		if s := int(binary.BigEndian.Uint16(b[6:])); s < maxSlots {
			return s, true
		}
		return 0, false
	}
	base, v := addrU32(m.base), addrU32(a)
	if v < base || v >= base+uint32(maxSlots*4) {
		return 0, false
	}
	return int(v-base) / 4, true
}

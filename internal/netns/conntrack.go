package netns

// The connection tracking a sandbox leaves behind, flushed in batches.
//
// A sandbox's connections outlive its namespaces in the root namespace's
// connection tracking (an established TCP entry lasts days), and would
// mark a later holder of its slot's packets INVALID. They must be gone
// before the slot is handed out again. But a flush is a walk of the
// host's whole table (the kernel has no index by address): ~10 ms of CPU
// per address family here (262,144 buckets), whatever the table holds.
// Flushing at every Teardown made a sandbox's kill cost ~20 ms of CPU, a
// fork of 100's kill 2 s.
//
// Teardown marks the slot instead (a file in ctDirtyDir, host-wide like
// the slot space and hostLock) before anything of it is freed; allocate
// skips marked slots; and one flush, ctFlushDelay after the first mark,
// deletes every marked slot's entries in one walk per address family,
// then clears the marks. A crash before the flush leaves the
// marks in /run, and New's flushStale flushes every free slot anyway.

import (
	"errors"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"strconv"
	"time"

	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"
)

// ctDirtyDir holds a file per slot whose connection tracking is yet to be
// flushed, named by the slot.
const ctDirtyDir = "/run/spore-netns-ct"

// ctFlushDelay gathers a burst's teardowns (a fork's children killed, a
// node's sweep) into one flush.
const ctFlushDelay = 2 * time.Second

// markDirty records that slot's connection tracking must be flushed
// before the slot is handed out again.
// (New makes ctDirtyDir.)
func markDirty(slot int) error {
	return os.WriteFile(filepath.Join(ctDirtyDir, strconv.Itoa(slot)), nil, 0o600)
}

// dirtySlots lists the marked slots.
func dirtySlots() (map[int]bool, error) {
	ents, err := os.ReadDir(ctDirtyDir)
	if errors.Is(err, os.ErrNotExist) {
		return map[int]bool{}, nil
	}
	if err != nil {
		return nil, err
	}
	out := make(map[int]bool, len(ents))
	for _, e := range ents {
		if s, err := strconv.Atoi(e.Name()); err == nil && s >= 0 && s < maxSlots {
			out[s] = true
		}
	}
	return out, nil
}

// scheduleFlush makes sure a flush runs within ctFlushDelay.
func (m *Manager) scheduleFlush() {
	m.flushMu.Lock()
	defer m.flushMu.Unlock()
	if m.flushTimer != nil || m.flushClosed {
		return
	}
	m.flushWG.Add(1)
	m.flushTimer = time.AfterFunc(ctFlushDelay, func() {
		defer m.flushWG.Done()
		m.flushMu.Lock()
		m.flushTimer = nil
		m.flushMu.Unlock()
		if err := m.FlushConntrack(); err != nil {
			m.cfg.Logger.Warn("network: flush the connection tracking of freed slots", "err", err)
		}
	})
}

// FlushConntrack deletes the connection tracking of every slot marked by a
// teardown (by any server on the host), in one walk of the table, and
// clears the marks. Teardown schedules it; tests and tools that need the
// table clean now call it.
//
// It takes no lock: a marked slot is not handed out, so it cannot be
// freed and marked again while the walk runs, and the marks it removes
// are of the slots it flushed. (A walk takes ~10 ms per family: under the
// host lock, every network set up meanwhile would wait for it.)
func (m *Manager) FlushConntrack() error {
	dirty, err := dirtySlots()
	if err != nil || len(dirty) == 0 {
		return err
	}
	if err := m.deleteFlows(slotFilter{m: m, match: func(s int) bool { return dirty[s] }}); err != nil {
		return err
	}
	var errs []error
	for s := range dirty {
		if err := os.Remove(filepath.Join(ctDirtyDir, strconv.Itoa(s))); err != nil && !errors.Is(err, os.ErrNotExist) {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

// closeFlush runs a pending flush now (Close).
func (m *Manager) closeFlush() {
	m.flushMu.Lock()
	m.flushClosed = true
	pending := m.flushTimer != nil && m.flushTimer.Stop()
	if pending {
		m.flushTimer = nil
		m.flushWG.Done()
	}
	m.flushMu.Unlock()
	m.flushWG.Wait()
	if pending {
		if err := m.FlushConntrack(); err != nil {
			m.cfg.Logger.Warn("network: flush the connection tracking of freed slots", "err", err)
		}
	}
}

// flushStale deletes the root namespace's connection-tracking entries of
// sandbox addresses whose slot nobody holds (no host address configured
// for it, by this server or another on the host): what a crash left. The
// marks of those slots go with them.
func (m *Manager) flushStale() error {
	unlock, err := hostLock()
	if err != nil {
		return err
	}
	defer unlock()
	live, err := HostAddrs()
	if err != nil {
		return err
	}
	free := func(s int) bool { return !live[m.slotAddr(s, 1)] }
	if err := m.deleteFlows(slotFilter{m: m, match: free}); err != nil {
		return err
	}
	dirty, err := dirtySlots()
	if err != nil {
		return err
	}
	for s := range dirty {
		if free(s) {
			os.Remove(filepath.Join(ctDirtyDir, strconv.Itoa(s)))
		}
	}
	return nil
}

// deleteFlows deletes the root namespace's entries f matches: a walk of
// the table per address family (a delete names its family, so one walk
// for both, AF_UNSPEC, cannot delete).
func (m *Manager) deleteFlows(f slotFilter) error {
	if _, err := netlink.ConntrackDeleteFilters(netlink.ConntrackTable, unix.AF_INET, f); err != nil || !m.ipv6 {
		return err
	}
	_, err := netlink.ConntrackDeleteFilters(netlink.ConntrackTable, unix.AF_INET6, f)
	return err
}

// slotFilter matches entries touching an address (IPv4 or IPv6) of a slot
// match accepts.
type slotFilter struct {
	m     *Manager
	match func(slot int) bool
}

func (f slotFilter) MatchConntrackFlow(flow *netlink.ConntrackFlow) bool {
	for _, ip := range []net.IP{flow.Forward.SrcIP, flow.Forward.DstIP, flow.Reverse.SrcIP, flow.Reverse.DstIP} {
		a, ok := netip.AddrFromSlice(ip)
		if !ok {
			continue
		}
		if slot, ok := f.m.slotOf(a.Unmap()); ok && f.match(slot) {
			return true
		}
	}
	return false
}

// Package netns gives each sandbox instance its own network, in a topology
// that survives checkpoint, restore and fork (see
// shared/notes/sandbox-networking.md for the measurements behind it):
//
//	sandbox netns "<p>-sb-<instance>":  lo, eth0 10.0.0.2/30 (fixed MAC), default via 10.0.0.1
//	gateway netns "<p>-gw-<instance>":  gw0 10.0.0.1/30 <-> eth0; up0 10.200.S.2/30 <-> host "<p>h<S>"
//	root netns:                         "<p>h<S>" 10.200.S.1/30
//
// and, when the host has IPv6, the same in IPv6 beside it:
//
//	sandbox eth0 fd53:7070::2/64, default via fd53:7070::1 (gw0)
//	gateway up0 fd53:7071:0:S::2/64 <-> host end fd53:7071:0:S::1/64
//
// Every sandbox sees the same inside addresses (gVisor re-reads them from
// the namespace at restore), so one image restores into any number of
// clones. The host reaches the sandbox's ports at 10.200.S.2 (DNAT in the
// gateway, IPv4 only). The gateway's forward chains (one per family) are
// default-drop and hold the egress policy; both families leave the gateway
// and the host masqueraded (NAT66 for IPv6: the inside addresses are
// unique local ones). The root namespace drops new connections from
// sandboxes to the host and between sandboxes.
package netns

import (
	"context"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"

	"github.com/spore-run/spore/internal/egress"
	"github.com/spore-run/spore/internal/errdefs"
	"github.com/spore-run/spore/internal/netaudit"
)

// Inside addresses, identical in every sandbox.
var (
	SandboxIP     = netip.MustParseAddr("10.0.0.2")
	GatewayIP     = netip.MustParseAddr("10.0.0.1")
	SandboxIP6    = netip.MustParseAddr("fd53:7070::2")
	GatewayIP6    = netip.MustParseAddr("fd53:7070::1")
	sandboxMAC, _ = net.ParseMAC("02:53:50:00:00:02")
)

// Policy is a sandbox's egress policy.
type Policy struct {
	Internet bool           `json:"internet"` // outbound traffic allowed by default
	Allow    []netip.Prefix `json:"allow,omitempty"`
	Deny     []netip.Prefix `json:"deny,omitempty"` // Allow wins over it
	// AllowDomains and DenyDomains are domain entries (egress.ParseDomain
	// form: "api.example.com", "*.example.com"), enforced on the TLS SNI
	// (port 443) and HTTP Host (port 80) by the egress proxy the gateway
	// redirects those ports to; allow entries win over deny entries.
	AllowDomains []string `json:"allowDomains,omitempty"`
	DenyDomains  []string `json:"denyDomains,omitempty"`
	// Inject sets headers on HTTPS requests to matching names (resolved
	// values, secrets included), signed for with CA. Never written to
	// disk: after a restart of the node's process they are gone until
	// the control plane sets the policy again.
	Inject []egress.Injection `json:"-"`
	CA     *egress.CA         `json:"-"`
}

// HasDomains says whether a policy has domain entries.
func (p Policy) HasDomains() bool { return len(p.AllowDomains)+len(p.DenyDomains) > 0 }

// NeedsProxy says whether a policy needs the egress proxy: domain entries
// to judge, or headers to inject.
func (p Policy) NeedsProxy() bool { return p.HasDomains() || len(p.Inject) > 0 }

// EgressProxy serves the listeners the manager opens in gateways (see
// egress.Proxy): Serve takes a gateway's listener, Update changes the
// rules new connections are judged by, Stop forgets an instance.
type EgressProxy interface {
	Serve(instance string, r egress.Rules, ls ...net.Listener)
	Update(instance string, r egress.Rules)
	Stop(instance string)
}

// Net is one instance's network.
type Net struct {
	Instance string     `json:"instance"`
	Slot     int        `json:"slot"`
	NetNS    string     `json:"netns"` // path of the sandbox namespace, for the OCI spec
	Addr     netip.Addr `json:"addr"`  // where the host reaches the sandbox's ports
	HostAddr netip.Addr `json:"host"`  // the host end
	// Addr6 and HostAddr6 are the IPv6 addresses of up0 and the host end;
	// unset when the sandbox has no IPv6 (a host without it, or a network
	// built before Spore gave sandboxes IPv6).
	Addr6     netip.Addr `json:"addr6,omitzero"`
	HostAddr6 netip.Addr `json:"host6,omitzero"`
	Policy    Policy     `json:"policy"`
}

// Config configures the manager.
type Config struct {
	// Prefix names everything the manager creates ("sp"); keep it short:
	// interface names have 15 characters.
	Prefix string
	// StateDir records which instance holds which slot.
	StateDir string
	// Floor is what no sandbox reaches whatever its policy (the operator
	// floor): nil means DefaultFloor. The host's own addresses are always
	// added. It is checked before a sandbox's allow list, so no user
	// policy opens the host's LAN or the cloud metadata address.
	Floor []netip.Prefix
	// DNSPort is the port of the node's DNS forwarder on the host end of
	// every sandbox (10.200.S.1): the gateway sends the sandbox's queries
	// to 10.0.0.1:53 there. 0: sandboxes get no DNS service.
	DNSPort uint16
	// Egress, when set, gets a listener in every gateway namespace
	// (egress.ListenPort); the gateway redirects a sandbox's new
	// connections to ports 80 and 443 there while its policy has domain
	// entries. Nil: domain entries are refused.
	Egress EgressProxy
	// Audit, when set, is told of every gateway namespace (a descriptor of
	// it, valid during the call) before its rules are written, and stopped
	// before it goes: the egress audit's collector (netaudit).
	Audit Auditor
	// NoIPv6 keeps sandboxes on IPv4 alone. Without it they get IPv6
	// whenever the host has it (net.ipv6.conf.all.disable_ipv6 = 0).
	NoIPv6 bool
	Logger *slog.Logger
}

// Auditor collects a gateway's connection attempts (see Config.Audit).
type Auditor interface {
	// Start begins collecting; stop(final) ends it, final when the
	// gateway is about to go (false: the manager closes, the sandbox runs on).
	Start(instance string, gwFD int) (stop func(final bool), err error)
}

// Manager creates and removes instance networks.
type Manager struct {
	cfg   Config
	base  netip.Addr     // 10.200.0.0
	floor []netip.Prefix // the floor, host addresses included (both families)
	ipv6  bool           // sandboxes get IPv6
	mu    sync.Mutex

	// byAddr maps each sandbox's gateway address (where its packets to
	// the host come from) to its policy, for the DNS forwarder. Its own
	// lock: a DNS query never waits on a slot allocation's file I/O.
	idxMu  sync.RWMutex
	byAddr map[netip.Addr]Policy

	auditMu sync.Mutex
	audits  map[string]func(final bool) // running collectors' stops, by instance
}

// sandboxSpace holds every host end and gateway address; sandboxSpace6
// their IPv6 addresses (a /64 per slot).
var (
	sandboxSpace  = netip.MustParsePrefix("10.200.0.0/16")
	sandboxSpace6 = netip.MustParsePrefix("fd53:7071::/48")
	inside6       = netip.PrefixFrom(GatewayIP6, 64).Masked() // the sandbox-gateway link
)

const maxSlots = 1 << 14 // 10.200.0.0/16 in /30 blocks

// New prepares the host side (root namespace rules, forwarding).
func New(ctx context.Context, cfg Config) (*Manager, error) {
	if cfg.Prefix == "" {
		cfg.Prefix = "sp"
	}
	if len(cfg.Prefix) > 4 {
		return nil, errdefs.Invalidf("netns prefix %q longer than 4 characters", cfg.Prefix)
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	if err := os.MkdirAll(cfg.StateDir, 0o700); err != nil {
		return nil, err
	}
	m := &Manager{cfg: cfg, base: sandboxSpace.Addr(), byAddr: map[netip.Addr]Policy{}, audits: map[string]func(final bool){}}
	for _, p := range cfg.Floor {
		if !p.IsValid() {
			return nil, errdefs.Invalidf("egress floor entry %v is not a CIDR", p)
		}
	}
	m.ipv6 = !cfg.NoIPv6 && hostHasIPv6()
	host, err := HostAddrs()
	if err != nil {
		return nil, fmt.Errorf("netns: host addresses: %w", err)
	}
	m.floor = buildFloor(cfg.Floor, host)
	if err := m.loadIndex(); err != nil {
		return nil, fmt.Errorf("netns: %w", err)
	}
	if err := sharedRunDir(); err != nil {
		return nil, fmt.Errorf("netns: %w", err)
	}
	if err := m.hostRules(); err != nil {
		return nil, fmt.Errorf("netns: host rules: %w", err)
	}
	if err := m.flushStale(); err != nil {
		return nil, fmt.Errorf("netns: flush stale connection tracking: %w", err)
	}
	if err := os.WriteFile("/proc/sys/net/ipv4/ip_forward", []byte("1"), 0o644); err != nil {
		return nil, fmt.Errorf("netns: enable forwarding: %w", err)
	}
	if m.ipv6 {
		if err := forward6(cfg.Logger); err != nil {
			return nil, fmt.Errorf("netns: enable IPv6 forwarding: %w", err)
		}
	}
	m.refreshEgress()
	return m, nil
}

func (m *Manager) sbName(instance string) string { return m.cfg.Prefix + "-sb-" + instance }
func (m *Manager) gwName(instance string) string { return m.cfg.Prefix + "-gw-" + instance }
func (m *Manager) hostIf(slot int) string        { return fmt.Sprintf("%sh%d", m.cfg.Prefix, slot) }
func (m *Manager) hostIfPrefix() string          { return m.cfg.Prefix + "h" }
func (m *Manager) statePath(instance string) string {
	return filepath.Join(m.cfg.StateDir, instance+".json")
}

func (m *Manager) slotAddr(slot, n int) netip.Addr {
	var b [4]byte
	binary.BigEndian.PutUint32(b[:], addrU32(m.base)+uint32(slot*4+n))
	return netip.AddrFrom4(b)
}

// slotAddr6 is the IPv6 twin of slotAddr: fd53:7071:0:S::n.
func slotAddr6(slot, n int) netip.Addr {
	b := sandboxSpace6.Addr().As16()
	binary.BigEndian.PutUint16(b[6:], uint16(slot))
	b[15] = byte(n)
	return netip.AddrFrom16(b)
}

func addrU32(a netip.Addr) uint32 {
	b := a.As4()
	return binary.BigEndian.Uint32(b[:])
}

// Get returns an instance's network.
func (m *Manager) Get(instance string) (Net, error) {
	var n Net
	b, err := os.ReadFile(m.statePath(instance))
	if err != nil {
		if errors.Is(err, os.ErrNotExist) {
			return Net{}, fmt.Errorf("network of %s: %w", instance, errdefs.ErrNotFound)
		}
		return Net{}, err
	}
	if err := json.Unmarshal(b, &n); err != nil {
		return Net{}, fmt.Errorf("network of %s: %w", instance, err)
	}
	return n, nil
}

// List returns the instances that have networks.
func (m *Manager) List() ([]string, error) {
	ents, err := os.ReadDir(m.cfg.StateDir)
	if err != nil {
		return nil, err
	}
	var out []string
	for _, e := range ents {
		if id, ok := strings.CutSuffix(e.Name(), ".json"); ok && !strings.HasPrefix(id, ".") {
			out = append(out, id)
		}
	}
	return out, nil
}

// allocate picks the lowest free slot and records it (under m.mu).
func (m *Manager) allocate(instance string, p Policy) (Net, error) {
	used := map[int]bool{}
	ids, err := m.List()
	if err != nil {
		return Net{}, err
	}
	for _, id := range ids {
		if id == instance {
			return Net{}, fmt.Errorf("network of %s: %w", instance, errdefs.ErrAlreadyExists)
		}
		if n, err := m.Get(id); err == nil {
			used[n.Slot] = true
		}
	}
	// Round-robin from the last slot handed out: an address freed now is
	// not reused at once, so a client's pooled connection to a killed
	// sandbox never lands on a new one.
	cursor := 0
	if b, err := os.ReadFile(filepath.Join(m.cfg.StateDir, "cursor")); err == nil {
		cursor, _ = strconv.Atoi(strings.TrimSpace(string(b)))
	}
	// A slot whose host address exists on the host belongs to someone else
	// (another server on this host).
	taken, err := HostAddrs()
	if err != nil {
		return Net{}, err
	}
	for i := 0; i < maxSlots; i++ {
		s := (cursor + i) % maxSlots
		if used[s] || taken[m.slotAddr(s, 1)] {
			continue
		}
		os.WriteFile(filepath.Join(m.cfg.StateDir, "cursor"), []byte(strconv.Itoa(s+1)), 0o600)
		n := Net{
			Instance: instance, Slot: s, NetNS: "/var/run/netns/" + m.sbName(instance),
			Addr: m.slotAddr(s, 2), HostAddr: m.slotAddr(s, 1), Policy: p,
		}
		if m.ipv6 {
			n.Addr6, n.HostAddr6 = slotAddr6(s, 2), slotAddr6(s, 1)
		}
		b, _ := json.Marshal(n)
		if err := os.WriteFile(m.statePath(instance), b, 0o600); err != nil {
			return Net{}, err
		}
		m.index(n)
		return n, nil
	}
	return Net{}, fmt.Errorf("no free network slot: %w", errdefs.ErrResourceLimit)
}

// hostLock serializes slot allocation and host-side setup across every
// process on the host: the 10.200.0.0/16 space and the root namespace are
// shared (two servers on one host, tests in parallel).
func hostLock() (func(), error) {
	f, err := os.OpenFile("/run/spore-netns.lock", os.O_CREATE|os.O_RDWR, 0o600)
	if err != nil {
		return nil, err
	}
	if err := unix.Flock(int(f.Fd()), unix.LOCK_EX); err != nil {
		f.Close()
		return nil, err
	}
	return func() { f.Close() }, nil
}

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

// Setup creates the instance's namespaces, links, addresses and rules.
// On failure nothing is left.
func (m *Manager) Setup(ctx context.Context, instance string, p Policy) (Net, error) {
	if err := m.validate(p); err != nil {
		return Net{}, fmt.Errorf("network of %s: %w", instance, err)
	}
	unlock, err := hostLock()
	if err != nil {
		return Net{}, fmt.Errorf("network of %s: host lock: %w", instance, err)
	}
	defer unlock()
	m.mu.Lock()
	n, err := m.allocate(instance, p)
	m.mu.Unlock()
	if err != nil {
		return Net{}, err
	}
	// Connection tracking outlives namespaces: entries for this address
	// left by an earlier sandbox (killed abruptly, in ESTABLISHED for days)
	// would mark the new sandbox's packets INVALID and the host would drop
	// them mid-stream. Every free address is kept clean instead of
	// flushing here (a flush dumps the host's whole table, and it was most
	// of the server's CPU in a fork of 50, measured with pprof): Teardown
	// flushes an address before freeing its slot, and New flushes the
	// addresses of slots nobody holds, left by a crash.
	if err := m.build(n); err != nil {
		m.Teardown(ctx, instance)
		return Net{}, fmt.Errorf("network of %s: %w", instance, err)
	}
	return n, nil
}

// build does the work of Setup.
func (m *Manager) build(n Net) error {
	sb, err := newNamed(m.sbName(n.Instance))
	if err != nil {
		return fmt.Errorf("create sandbox namespace: %w", err)
	}
	defer sb.Close()
	gw, err := newNamed(m.gwName(n.Instance))
	if err != nil {
		return fmt.Errorf("create gateway namespace: %w", err)
	}
	defer gw.Close()

	root, err := netlink.NewHandle()
	if err != nil {
		return err
	}
	defer root.Close()
	tmpA, tmpB := fmt.Sprintf("%sa%d", m.cfg.Prefix, n.Slot), fmt.Sprintf("%sb%d", m.cfg.Prefix, n.Slot)
	tmpU := fmt.Sprintf("%su%d", m.cfg.Prefix, n.Slot)
	// sandbox <-> gateway
	if err := root.LinkAdd(&netlink.Veth{LinkAttrs: netlink.LinkAttrs{Name: tmpA, Namespace: netlink.NsFd(sb)}, PeerName: tmpB, PeerNamespace: netlink.NsFd(gw)}); err != nil {
		return fmt.Errorf("veth sandbox-gateway: %w", err)
	}
	// gateway <-> host
	if err := m.awaitHostEnd(root, n.Slot); err != nil {
		return err
	}
	if err := root.LinkAdd(&netlink.Veth{LinkAttrs: netlink.LinkAttrs{Name: m.hostIf(n.Slot)}, PeerName: tmpU, PeerNamespace: netlink.NsFd(gw)}); err != nil {
		return fmt.Errorf("veth gateway-host: %w", err)
	}
	if err := ConfigureLink(root, m.hostIf(n.Slot), "", netip.PrefixFrom(n.HostAddr, 30), nil, netip.Addr{}); err != nil {
		return fmt.Errorf("host end: %w", err)
	}
	hs, err := netlink.NewHandleAt(sb)
	if err != nil {
		return err
	}
	defer hs.Close()
	if lo, err := hs.LinkByName("lo"); err == nil {
		hs.LinkSetUp(lo)
	}
	if err := ConfigureLink(hs, tmpA, "eth0", netip.PrefixFrom(SandboxIP, 30), sandboxMAC, GatewayIP); err != nil {
		return fmt.Errorf("sandbox eth0: %w", err)
	}
	if n.Addr6.IsValid() {
		if err := addAddr6(hs, "eth0", netip.PrefixFrom(SandboxIP6, inside6.Bits()), GatewayIP6); err != nil {
			return fmt.Errorf("sandbox eth0: %w", err)
		}
	}
	hg, err := netlink.NewHandleAt(gw)
	if err != nil {
		return err
	}
	defer hg.Close()
	if lo, err := hg.LinkByName("lo"); err == nil {
		hg.LinkSetUp(lo)
	}
	if err := ConfigureLink(hg, tmpB, "gw0", netip.PrefixFrom(GatewayIP, 30), nil, netip.Addr{}); err != nil {
		return fmt.Errorf("gateway gw0: %w", err)
	}
	if err := ConfigureLink(hg, tmpU, "up0", netip.PrefixFrom(n.Addr, 30), nil, n.HostAddr); err != nil {
		return fmt.Errorf("gateway up0: %w", err)
	}
	if n.Addr6.IsValid() {
		if err := addAddr6(root, m.hostIf(n.Slot), netip.PrefixFrom(n.HostAddr6, 64), netip.Addr{}); err != nil {
			return fmt.Errorf("host end: %w", err)
		}
		if err := addAddr6(hg, "gw0", netip.PrefixFrom(GatewayIP6, inside6.Bits()), netip.Addr{}); err != nil {
			return fmt.Errorf("gateway gw0: %w", err)
		}
		if err := addAddr6(hg, "up0", netip.PrefixFrom(n.Addr6, 64), n.HostAddr6); err != nil {
			return fmt.Errorf("gateway up0: %w", err)
		}
	}
	if err := inNS(gw, func() error {
		if n.Addr6.IsValid() {
			if err := os.WriteFile("/proc/sys/net/ipv6/conf/all/forwarding", []byte("1"), 0o644); err != nil {
				return err
			}
		}
		return os.WriteFile("/proc/sys/net/ipv4/ip_forward", []byte("1"), 0o644)
	}); err != nil {
		return fmt.Errorf("gateway forwarding: %w", err)
	}
	if err := m.startAudit(gw, n.Instance); err != nil {
		// The sandbox runs without its audit rather than not at all;
		// the node says so loudly.
		m.cfg.Logger.Error("egress audit: not collecting for this sandbox", "instance", n.Instance, "err", err)
	}
	if err := m.gatewayRules(gw, n); err != nil {
		return fmt.Errorf("gateway rules: %w", err)
	}
	return m.serveEgress(gw, n)
}

// awaitHostEnd makes sure the host end's name is free before a slot's
// link is made: an earlier holder's host end may still be on its way out
// (Teardown leaves its removal to the kernel, which takes tens of
// milliseconds). One still there after a second is held by nothing of
// ours (a namespace kept alive from outside): it is deleted.
func (m *Manager) awaitHostEnd(root *netlink.Handle, slot int) error {
	name := m.hostIf(slot)
	for deadline := time.Now().Add(time.Second); ; time.Sleep(2 * time.Millisecond) {
		l, err := root.LinkByName(name)
		if err != nil {
			return nil // gone (LinkNotFoundError), or the add reports it
		}
		if time.Now().After(deadline) {
			m.cfg.Logger.Warn("network: deleting a leftover host link", "link", name)
			if err := root.LinkDel(l); err != nil {
				return fmt.Errorf("leftover host link %s: %w", name, err)
			}
			return nil
		}
	}
}

// startAudit switches on connection accounting in a gateway and starts
// its collector (once per instance).
func (m *Manager) startAudit(gw netns.NsHandle, instance string) error {
	if m.cfg.Audit == nil {
		return nil
	}
	m.auditMu.Lock()
	defer m.auditMu.Unlock()
	if _, ok := m.audits[instance]; ok {
		return nil
	}
	if err := inNS(gw, netaudit.PrepareNamespace); err != nil {
		return fmt.Errorf("connection tracking: %w", err)
	}
	stop, err := m.cfg.Audit.Start(instance, int(gw))
	if err != nil {
		return err
	}
	m.audits[instance] = stop
	return nil
}

// stopAudit stops an instance's collector (it writes the connections
// still open), if it runs.
func (m *Manager) stopAudit(instance string) {
	m.auditMu.Lock()
	stop, ok := m.audits[instance]
	delete(m.audits, instance)
	m.auditMu.Unlock()
	if ok {
		stop(true)
	}
}

// Close stops the collectors of the gateways left running (they write
// nothing more: a manager opened next takes them over).
func (m *Manager) Close() {
	m.auditMu.Lock()
	audits := m.audits
	m.audits = map[string]func(final bool){}
	m.auditMu.Unlock()
	for _, stop := range audits {
		stop(false)
	}
}

// serveEgress opens the egress proxy's listeners in a gateway namespace
// (IPv4, and IPv6 when the sandbox has it) and hands them to the proxy
// with the policy's rules.
func (m *Manager) serveEgress(gw netns.NsHandle, n Net) error {
	if m.cfg.Egress == nil {
		return nil
	}
	var ls []net.Listener
	if err := inNS(gw, func() error {
		l, err := net.Listen("tcp4", fmt.Sprintf("0.0.0.0:%d", egress.ListenPort))
		if err != nil {
			return err
		}
		ls = append(ls, l)
		if n.Addr6.IsValid() {
			l, err := net.Listen("tcp6", fmt.Sprintf("[::]:%d", egress.ListenPort))
			if err != nil {
				ls[0].Close()
				return err
			}
			ls = append(ls, l)
		}
		return nil
	}); err != nil {
		return fmt.Errorf("egress proxy listener: %w", err)
	}
	m.cfg.Egress.Serve(n.Instance, m.egressRules(n.Policy), ls...)
	return nil
}

// egressRules is what the proxy judges a policy's connections by.
func (m *Manager) egressRules(p Policy) egress.Rules {
	return egress.Rules{Internet: p.Internet, Allow: p.Allow, Deny: p.Deny,
		AllowDomains: p.AllowDomains, DenyDomains: p.DenyDomains, Floor: m.floor, Inject: p.Inject, CA: p.CA}
}

// validate checks a policy for this manager: domain entries need the
// egress proxy.
func (m *Manager) validate(p Policy) error {
	if err := p.Validate(); err != nil {
		return err
	}
	if p.NeedsProxy() && m.cfg.Egress == nil {
		return errdefs.Invalidf("domain entries and network rules need the egress proxy, which this node does not run")
	}
	return nil
}

// addAddr6 gives a link an IPv6 address, without duplicate address
// detection (the addresses are the namespace's own: nobody else on the
// link has them, and detection would keep them unusable for a second),
// and a default route via gw when valid.
func addAddr6(h *netlink.Handle, name string, addr netip.Prefix, gw netip.Addr) error {
	l, err := h.LinkByName(name)
	if err != nil {
		return err
	}
	ip := &net.IPNet{IP: addr.Addr().AsSlice(), Mask: net.CIDRMask(addr.Bits(), 128)}
	if err := h.AddrAdd(l, &netlink.Addr{IPNet: ip, Flags: unix.IFA_F_NODAD}); err != nil {
		return fmt.Errorf("address %v: %w", addr, err)
	}
	if gw.IsValid() {
		if err := h.RouteAdd(&netlink.Route{LinkIndex: l.Attrs().Index, Gw: gw.AsSlice()}); err != nil {
			return fmt.Errorf("IPv6 default route: %w", err)
		}
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
	ip := &net.IPNet{IP: addr.Addr().AsSlice(), Mask: net.CIDRMask(addr.Bits(), 32)}
	if err := h.AddrAdd(l, &netlink.Addr{IPNet: ip}); err != nil {
		return err
	}
	if err := h.LinkSetUp(l); err != nil {
		return err
	}
	if gw.IsValid() {
		if err := h.RouteAdd(&netlink.Route{LinkIndex: l.Attrs().Index, Gw: gw.AsSlice()}); err != nil {
			return fmt.Errorf("default route: %w", err)
		}
	}
	return nil
}

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
		// After the namespaces: nothing of the sandbox's sends any more.
		defer m.unindex(n.Addr)
		defer flushConntrack(n.Addr)
		if n.Addr6.IsValid() {
			defer flushConntrack(n.Addr6)
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
	return errors.Join(errs...)
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

// flushStale deletes the root namespace's connection-tracking entries of
// sandbox addresses whose slot nobody holds (no host address configured
// for it, by this server or another on the host): what a crash left.
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
	if _, err := netlink.ConntrackDeleteFilters(netlink.ConntrackTable, unix.AF_INET, staleFilter{m: m, live: live}); err != nil {
		return err
	}
	if m.ipv6 {
		_, err = netlink.ConntrackDeleteFilters(netlink.ConntrackTable, unix.AF_INET6, staleFilter{m: m, live: live})
	}
	return err
}

// staleFilter matches entries touching a sandbox address of a free slot.
type staleFilter struct {
	m    *Manager
	live map[netip.Addr]bool
}

func (f staleFilter) MatchConntrackFlow(flow *netlink.ConntrackFlow) bool {
	for _, ip := range []net.IP{flow.Forward.SrcIP, flow.Forward.DstIP, flow.Reverse.SrcIP, flow.Reverse.DstIP} {
		a, ok := netip.AddrFromSlice(ip)
		if !ok {
			continue
		}
		if slot, ok := f.m.slotOf(a.Unmap()); ok && !f.live[f.m.slotAddr(slot, 1)] {
			return true
		}
	}
	return false
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

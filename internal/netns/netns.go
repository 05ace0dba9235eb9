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
	// Owner is what the egress audit journals the instance's traffic
	// under when Claim named it (a network set up ahead of time for a
	// pre-created instance, claimed by a sandbox); "" means the instance.
	Owner string `json:"owner,omitempty"`
	// Reserved: set up ahead of time by Reserve, not yet claimed; its
	// egress audit starts with the claim.
	Reserved bool `json:"reserved,omitempty"`
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
	// Start begins collecting for instance, journaling under owner (""
	// for the instance itself: see Net.Owner); stop(final) ends it, final
	// when the gateway is about to go (false: the manager closes, the
	// sandbox runs on).
	Start(instance, owner string, gwFD int) (stop func(final bool), err error)
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
	// slots maps each slot this manager's records hold to the record's
	// instance (under idxMu too), so an allocation does not read every
	// record: kept with the records, loaded with the index at New.
	slots map[int]string

	auditMu sync.Mutex
	audits  map[string]func(final bool) // running collectors' stops, by instance

	// The batched conntrack flush (conntrack.go): the pending one's timer.
	flushMu     sync.Mutex
	flushTimer  *time.Timer
	flushClosed bool
	flushWG     sync.WaitGroup
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
	m := &Manager{cfg: cfg, base: sandboxSpace.Addr(), byAddr: map[netip.Addr]Policy{}, slots: map[int]string{}, audits: map[string]func(final bool){}}
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
	if err := os.MkdirAll(ctDirtyDir, 0o700); err != nil {
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
func (m *Manager) allocate(instance string, p Policy, reserved bool) (Net, error) {
	if _, err := os.Stat(m.statePath(instance)); err == nil {
		return Net{}, fmt.Errorf("network of %s: %w", instance, errdefs.ErrAlreadyExists)
	} else if !errors.Is(err, os.ErrNotExist) {
		return Net{}, err
	}
	used := m.usedSlots()
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
	// A slot freed with its connection tracking not yet flushed
	// (conntrack.go) is skipped; when only such slots are left, they are
	// flushed now.
	dirty, err := dirtySlots()
	if err != nil {
		return Net{}, err
	}
	skipped := false
	for i := 0; i < maxSlots; i++ {
		s := (cursor + i) % maxSlots
		if used[s] || taken[m.slotAddr(s, 1)] {
			continue
		}
		if dirty[s] {
			skipped = true
			continue
		}
		os.WriteFile(filepath.Join(m.cfg.StateDir, "cursor"), []byte(strconv.Itoa(s+1)), 0o600)
		n := Net{
			Instance: instance, Slot: s, NetNS: "/var/run/netns/" + m.sbName(instance),
			Addr: m.slotAddr(s, 2), HostAddr: m.slotAddr(s, 1), Policy: p, Reserved: reserved,
		}
		if m.ipv6 {
			n.Addr6, n.HostAddr6 = slotAddr6(s, 2), slotAddr6(s, 1)
		}
		b, _ := json.Marshal(n)
		if err := os.WriteFile(m.statePath(instance), b, 0o600); err != nil {
			return Net{}, err
		}
		m.index(n)
		m.holdSlot(n.Slot, instance)
		return n, nil
	}
	if skipped {
		// None clean: flush the marked ones and try again.
		if err := m.FlushConntrack(); err != nil {
			return Net{}, err
		}
		return m.allocate(instance, p, reserved)
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

// Setup creates the instance's namespaces, links, addresses and rules.
// On failure nothing is left.
func (m *Manager) Setup(ctx context.Context, instance string, p Policy) (Net, error) {
	return m.setup(ctx, instance, p, false)
}

// Reserve sets up a network ahead of time, for an instance no sandbox
// holds yet (a restore target): nothing leaves it, and it has no egress
// audit until Claim hands it to a sandbox.
func (m *Manager) Reserve(ctx context.Context, instance string) (Net, error) {
	return m.setup(ctx, instance, Policy{}, true)
}

func (m *Manager) setup(ctx context.Context, instance string, p Policy, reserved bool) (Net, error) {
	if err := m.validate(p); err != nil {
		return Net{}, fmt.Errorf("network of %s: %w", instance, err)
	}
	unlock, err := hostLock()
	if err != nil {
		return Net{}, fmt.Errorf("network of %s: host lock: %w", instance, err)
	}
	defer unlock()
	m.mu.Lock()
	n, err := m.allocate(instance, p, reserved)
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
	if n.Reserved {
		// No rules and no forwarding until Claim writes the sandbox's
		// (rules written into a fresh table cost no kernel grace period,
		// unlike rewriting a gateway's chains).
		if err := forwarding(gw, n, false); err != nil {
			return err
		}
		return m.serveEgress(gw, n)
	}
	if err := forwarding(gw, n, true); err != nil {
		return err
	}
	if err := m.startAudit(gw, n); err != nil {
		// The sandbox runs without its audit rather than not at all;
		// the node says so loudly.
		m.cfg.Logger.Error("egress audit: not collecting for this sandbox", "instance", n.Instance, "err", err)
	}
	if err := m.gatewayRules(gw, n); err != nil {
		return fmt.Errorf("gateway rules: %w", err)
	}
	return m.serveEgress(gw, n)
}

// forwarding turns a gateway's forwarding on or off (both families).
// Off matters: a new namespace takes IPv4's from the host's, where it is on.
func forwarding(gw netns.NsHandle, n Net, on bool) error {
	v := []byte("0")
	if on {
		v = []byte("1")
	}
	if err := inNS(gw, func() error {
		if n.Addr6.IsValid() {
			if err := os.WriteFile("/proc/sys/net/ipv6/conf/all/forwarding", v, 0o644); err != nil {
				return err
			}
		}
		return os.WriteFile("/proc/sys/net/ipv4/ip_forward", v, 0o644)
	}); err != nil {
		return fmt.Errorf("gateway forwarding: %w", err)
	}
	return nil
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
func (m *Manager) startAudit(gw netns.NsHandle, n Net) error {
	if m.cfg.Audit == nil || n.Reserved {
		return nil
	}
	m.auditMu.Lock()
	defer m.auditMu.Unlock()
	if _, ok := m.audits[n.Instance]; ok {
		return nil
	}
	if err := inNS(gw, netaudit.PrepareNamespace); err != nil {
		return fmt.Errorf("connection tracking: %w", err)
	}
	stop, err := m.cfg.Audit.Start(n.Instance, n.Owner, int(gw))
	if err != nil {
		return err
	}
	m.audits[n.Instance] = stop
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
	m.closeFlush()
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

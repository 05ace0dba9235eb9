package netns

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"github.com/spore-run/spore/internal/egress"
	"github.com/spore-run/spore/internal/errdefs"
	"github.com/spore-run/spore/internal/netaudit"
	"github.com/spore-run/spore/internal/nftexpr"
	"net/netip"
	"os"
	"path/filepath"

	"github.com/google/nftables"
	"github.com/google/nftables/binaryutil"
	"github.com/google/nftables/expr"
	"github.com/mdlayher/netlink"
	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"
)

// family is what the rules of one address family differ in: the table's
// family and where the addresses sit in the network header.
type family struct {
	table        nftables.TableFamily
	src, dst     uint32 // offsets of the source and destination addresses
	six          bool
	gatewayRange netip.Prefix // the sandbox-gateway link
	space        netip.Prefix // the host ends' and gateways' addresses
}

var (
	fam4 = family{table: nftables.TableFamilyIPv4, src: 12, dst: 16, gatewayRange: netip.PrefixFrom(GatewayIP, 30).Masked(), space: sandboxSpace}
	fam6 = family{table: nftables.TableFamilyIPv6, src: 8, dst: 24, six: true, gatewayRange: inside6, space: sandboxSpace6}
)

// of keeps the prefixes of this family.
func (f family) of(ps []netip.Prefix) []netip.Prefix {
	var out []netip.Prefix
	for _, p := range ps {
		if p.Addr().Is6() == f.six {
			out = append(out, p)
		}
	}
	return out
}

// gatewayTable is a gateway's table of a family (both are named "spore").
func (f family) gatewayTable() *nftables.Table {
	return &nftables.Table{Family: f.table, Name: "spore"}
}

// bigBatch lets one transaction carry a policy's hundreds of rules: the
// kernel acknowledges every message, and the acknowledgements of ~500
// rules overflow a default netlink receive buffer (ENOBUFS). Small acks
// and a forced 4 MiB buffer (the server runs as root) hold them.
var bigBatch = nftables.WithSockOptions(func(c *netlink.Conn) error {
	if err := c.SetOption(netlink.CapAcknowledge, true); err != nil {
		return err
	}
	raw, err := c.SyscallConn()
	if err != nil {
		return err
	}
	var serr error
	if err := raw.Control(func(fd uintptr) {
		serr = unix.SetsockoptInt(int(fd), unix.SOL_SOCKET, unix.SO_RCVBUFFORCE, 4<<20)
	}); err != nil {
		return err
	}
	return serr
})

var policyAccept = nftables.ChainPolicyAccept
var policyDrop = nftables.ChainPolicyDrop

// hostRules installs (replacing) the root namespace's tables (IPv4, and
// IPv6 when sandboxes have it): no new connections from sandboxes to the
// host, none between sandboxes, and masquerading of sandbox egress.
func (m *Manager) hostRules() error {
	c, err := nftables.New()
	if err != nil {
		return err
	}
	m.hostTable(c, fam4)
	if m.ipv6 {
		m.hostTable(c, fam6)
	}
	return c.Flush()
}

// hostTable queues (replacing) the root namespace's table of a family.
// IPv4's also guards the DNS forwarder (sandboxes get no IPv6 DNS
// service: their resolver is the IPv4 one); IPv6's lets neighbour
// discovery through.
func (m *Manager) hostTable(c *nftables.Conn, fam family) {
	t := &nftables.Table{Family: fam.table, Name: m.cfg.Prefix + "-host"}
	c.AddTable(t)
	c.DelTable(t) // replace whatever an earlier run left
	c.AddTable(t)
	input := c.AddChain(&nftables.Chain{Name: "input", Table: t, Type: nftables.ChainTypeFilter, Hooknum: nftables.ChainHookInput, Priority: nftables.ChainPriorityFilter, Policy: &policyAccept})
	sb := m.hostIfPrefix() + "*"
	c.AddRule(&nftables.Rule{Table: t, Chain: input, Exprs: nftexpr.Rule(nftexpr.IfName(expr.MetaKeyIIFNAME, sb, expr.CmpOpEq), nftexpr.CtEstablished(), nftexpr.Verdict(expr.VerdictAccept))})
	if fam.six {
		// Neighbour discovery on the host ends is not a connection: the
		// host must answer its gateways' solicitations.
		c.AddRule(&nftables.Rule{Table: t, Chain: input, Exprs: nftexpr.Rule(nftexpr.IfName(expr.MetaKeyIIFNAME, sb, expr.CmpOpEq), nftexpr.NDP(), nftexpr.Verdict(expr.VerdictAccept))})
	} else if port := m.cfg.DNSPort; port != 0 {
		// The DNS forwarder: sandboxes' queries (DNAT'd by their gateway)
		// in, other hosts' out: it is no open resolver for the LAN. Only
		// flows opened toward the port from outside are dropped: the same
		// port number is also a client's ephemeral port (replies to it
		// must pass) or, once this table outlives its forwarder (a node
		// killed, a server stopped: the table stays for the sandboxes
		// left running), a local listener's; dropping those stalled
		// unrelated loopback connections until they timed out.
		for _, proto := range []byte{unix.IPPROTO_UDP, unix.IPPROTO_TCP} {
			c.AddRule(&nftables.Rule{Table: t, Chain: input, Exprs: nftexpr.Rule(nftexpr.IfName(expr.MetaKeyIIFNAME, sb, expr.CmpOpEq), nftexpr.Dport(proto, port), nftexpr.Verdict(expr.VerdictAccept))})
			c.AddRule(&nftables.Rule{Table: t, Chain: input, Exprs: nftexpr.Rule(nftexpr.IfName(expr.MetaKeyIIFNAME, "lo", expr.CmpOpNeq), nftexpr.CtNew(), nftexpr.Dport(proto, port), nftexpr.Verdict(expr.VerdictDrop))})
		}
	}
	c.AddRule(&nftables.Rule{Table: t, Chain: input, Exprs: nftexpr.Rule(nftexpr.IfName(expr.MetaKeyIIFNAME, sb, expr.CmpOpEq), nftexpr.Verdict(expr.VerdictDrop))})
	fwd := c.AddChain(&nftables.Chain{Name: "forward", Table: t, Type: nftables.ChainTypeFilter, Hooknum: nftables.ChainHookForward, Priority: nftables.ChainPriorityFilter, Policy: &policyAccept})
	c.AddRule(&nftables.Rule{Table: t, Chain: fwd, Exprs: nftexpr.Rule(nftexpr.IfName(expr.MetaKeyIIFNAME, sb, expr.CmpOpEq), nftexpr.IfName(expr.MetaKeyOIFNAME, sb, expr.CmpOpEq), nftexpr.Verdict(expr.VerdictDrop))})
	post := c.AddChain(&nftables.Chain{Name: "postrouting", Table: t, Type: nftables.ChainTypeNAT, Hooknum: nftables.ChainHookPostrouting, Priority: nftables.ChainPriorityNATSource})
	c.AddRule(&nftables.Rule{Table: t, Chain: post, Exprs: nftexpr.Rule(nftexpr.InPrefix(fam.src, fam.space, expr.CmpOpEq), nftexpr.IfName(expr.MetaKeyOIFNAME, sb, expr.CmpOpNeq), &expr.Masq{})})
}

// RemoveHostRules deletes the root namespace's tables; one already gone
// is no error.
func (m *Manager) RemoveHostRules() error {
	var errs []error
	for _, f := range []nftables.TableFamily{nftables.TableFamilyIPv4, nftables.TableFamilyIPv6} {
		c, err := nftables.New()
		if err != nil {
			return err
		}
		c.DelTable(&nftables.Table{Family: f, Name: m.cfg.Prefix + "-host"})
		if err := c.Flush(); err != nil && !errors.Is(err, unix.ENOENT) {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

// gatewayRules installs the gateway namespace's tables (IPv4, and IPv6
// when the sandbox has it) in one transaction.
func (m *Manager) gatewayRules(gw netns.NsHandle, n Net) error {
	c, err := nftables.New(nftables.WithNetNSFd(int(gw)), bigBatch)
	if err != nil {
		return err
	}
	m.gatewayTable(c, fam4, n)
	if n.Addr6.IsValid() {
		m.gatewayTable(c, fam6, n)
	}
	return c.Flush()
}

// gatewayTable queues a gateway's table of a family: the egress proxy's
// redirect, masquerading out of up0, a default-drop forward chain with
// the policy. IPv4's also carries the host's way in (DNAT of its
// connections to the sandbox, masqueraded toward it) and the sandbox's
// resolver; IPv6 has neither (the host reaches a sandbox's ports over
// IPv4, and its resolver is the IPv4 one).
func (m *Manager) gatewayTable(c *nftables.Conn, fam family, n Net) {
	t := c.AddTable(fam.gatewayTable())
	pre := c.AddChain(&nftables.Chain{Name: "prerouting", Table: t, Type: nftables.ChainTypeNAT, Hooknum: nftables.ChainHookPrerouting, Priority: nftables.ChainPriorityNATDest})
	dnsPort := m.cfg.DNSPort
	if fam.six {
		dnsPort = 0
	} else {
		sbAddr := SandboxIP.As4()
		c.AddRule(&nftables.Rule{Table: t, Chain: pre, Exprs: nftexpr.Rule(
			nftexpr.IfName(expr.MetaKeyIIFNAME, "up0", expr.CmpOpEq),
			nftexpr.InPrefix(fam.dst, netip.PrefixFrom(n.Addr, 32), expr.CmpOpEq),
			&expr.Immediate{Register: 1, Data: sbAddr[:]},
			&expr.NAT{Type: expr.NATTypeDestNAT, Family: unix.NFPROTO_IPV4, RegAddrMin: 1, RegAddrMax: 1},
		)})
	}
	// The sandbox's resolver (10.0.0.1:53 in its resolv.conf) is the
	// node's DNS forwarder on the host end: identical inside every
	// sandbox and clone, whatever its slot.
	hostAddr := n.HostAddr.As4()
	if dnsPort != 0 {
		for _, proto := range []byte{unix.IPPROTO_UDP, unix.IPPROTO_TCP} {
			c.AddRule(&nftables.Rule{Table: t, Chain: pre, Exprs: nftexpr.Rule(
				nftexpr.IfName(expr.MetaKeyIIFNAME, "gw0", expr.CmpOpEq),
				nftexpr.InPrefix(fam.dst, netip.PrefixFrom(GatewayIP, 32), expr.CmpOpEq),
				nftexpr.Dport(proto, 53),
				&expr.Immediate{Register: 1, Data: hostAddr[:]},
				&expr.Immediate{Register: 2, Data: binaryutil.BigEndian.PutUint16(dnsPort)},
				&expr.NAT{Type: expr.NATTypeDestNAT, Family: unix.NFPROTO_IPV4, RegAddrMin: 1, RegAddrMax: 1, RegProtoMin: 2, RegProtoMax: 2, Specified: true},
			)})
		}
	}
	// The sandbox's other connections pass the egress proxy's redirect
	// (a chain of its own, rewritten with the policy).
	enat := c.AddChain(&nftables.Chain{Name: "egressnat", Table: t})
	c.AddRule(&nftables.Rule{Table: t, Chain: pre, Exprs: nftexpr.Rule(nftexpr.IfName(expr.MetaKeyIIFNAME, "gw0", expr.CmpOpEq), &expr.Verdict{Kind: expr.VerdictJump, Chain: "egressnat"})})
	redirectRules(c, t, enat, fam, m.floor, n.Policy)
	post := c.AddChain(&nftables.Chain{Name: "postrouting", Table: t, Type: nftables.ChainTypeNAT, Hooknum: nftables.ChainHookPostrouting, Priority: nftables.ChainPriorityNATSource})
	// Toward the sandbox everything comes from its gateway; outward
	// everything leaves from up0's address.
	if !fam.six {
		c.AddRule(&nftables.Rule{Table: t, Chain: post, Exprs: nftexpr.Rule(nftexpr.IfName(expr.MetaKeyOIFNAME, "gw0", expr.CmpOpEq), &expr.Masq{})})
	}
	c.AddRule(&nftables.Rule{Table: t, Chain: post, Exprs: nftexpr.Rule(nftexpr.IfName(expr.MetaKeyOIFNAME, "up0", expr.CmpOpEq), &expr.Masq{})})
	fwd := c.AddChain(&nftables.Chain{Name: "forward", Table: t, Type: nftables.ChainTypeFilter, Hooknum: nftables.ChainHookForward, Priority: nftables.ChainPriorityFilter, Policy: &policyDrop})
	egress := c.AddChain(&nftables.Chain{Name: "egress", Table: t})
	c.AddRule(&nftables.Rule{Table: t, Chain: fwd, Exprs: nftexpr.Rule(nftexpr.CtEstablished(), nftexpr.Verdict(expr.VerdictAccept))})
	if !fam.six {
		c.AddRule(&nftables.Rule{Table: t, Chain: fwd, Exprs: nftexpr.Rule(nftexpr.IfName(expr.MetaKeyIIFNAME, "up0", expr.CmpOpEq), nftexpr.IfName(expr.MetaKeyOIFNAME, "gw0", expr.CmpOpEq), nftexpr.Verdict(expr.VerdictAccept))})
	}
	if dnsPort != 0 {
		// Only the DNAT'd queries reach the forwarder: its address is in
		// the floor for everything else.
		for _, proto := range []byte{unix.IPPROTO_UDP, unix.IPPROTO_TCP} {
			c.AddRule(&nftables.Rule{Table: t, Chain: fwd, Exprs: nftexpr.Rule(
				nftexpr.IfName(expr.MetaKeyIIFNAME, "gw0", expr.CmpOpEq), nftexpr.IfName(expr.MetaKeyOIFNAME, "up0", expr.CmpOpEq),
				nftexpr.InPrefix(fam.dst, netip.PrefixFrom(n.HostAddr, 32), expr.CmpOpEq), nftexpr.Dport(proto, dnsPort), nftexpr.Verdict(expr.VerdictAccept))})
		}
	}
	c.AddRule(&nftables.Rule{Table: t, Chain: fwd, Exprs: nftexpr.Rule(nftexpr.IfName(expr.MetaKeyIIFNAME, "gw0", expr.CmpOpEq), nftexpr.IfName(expr.MetaKeyOIFNAME, "up0", expr.CmpOpEq), &expr.Verdict{Kind: expr.VerdictJump, Chain: "egress"})})
	auditChains(c, t)
	egressRules(c, t, egress, fam, m.floor, n.Policy)
}

// egressRules fills the egress chain: the operator floor first (the
// host's LAN, link-local and loopback: no user policy reaches past it),
// then the allow list, the deny list and the default: allow wins over
// deny, as in E2B (`denyOut: ["0.0.0.0/0"], allowOut: ["1.1.1.1"]` reaches
// that address only). The floor is rewritten with the policy, so a policy
// change also brings an older gateway up to the manager's floor. Each
// family's chain gets that family's entries.
//
// Every drop goes through an audit chain (auditChains) that logs the
// connection attempt to the egress audit's NFLOG group, naming the rule
// kind (netaudit), then drops it.
func egressRules(c *nftables.Conn, t *nftables.Table, ch *nftables.Chain, fam family, floor []netip.Prefix, p Policy) {
	drop := func(chain string, match ...any) {
		c.AddRule(&nftables.Rule{Table: t, Chain: ch, Exprs: nftexpr.Rule(append(append([]any{}, match...), &expr.Verdict{Kind: expr.VerdictGoto, Chain: chain})...)})
	}
	for _, f := range fam.of(floor) {
		drop(auditFloor, nftexpr.InPrefix(fam.dst, f, expr.CmpOpEq))
	}
	for _, a := range fam.of(p.Allow) {
		c.AddRule(&nftables.Rule{Table: t, Chain: ch, Exprs: nftexpr.Rule(nftexpr.InPrefix(fam.dst, a, expr.CmpOpEq), nftexpr.Verdict(expr.VerdictAccept))})
	}
	for _, d := range fam.of(p.Deny) {
		drop(auditDeny, nftexpr.InPrefix(fam.dst, d, expr.CmpOpEq))
	}
	if !p.Internet {
		drop(auditOff)
		return
	}
	c.AddRule(&nftables.Rule{Table: t, Chain: ch, Exprs: nftexpr.Rule(nftexpr.Verdict(expr.VerdictAccept))})
}

// The audit chains the egress chain's drops go to, and the rule kind each
// logs (netaudit.Entry.Rule).
const (
	auditFloor = "audit_floor"
	auditDeny  = "audit_deny"
	auditOff   = "audit_off"
)

var auditRules = map[string]string{auditFloor: "floor", auditDeny: "deny", auditOff: "internet off"}

// auditRate bounds the attempts a sandbox's gateway logs a second per
// kind (a burst of twice that passes): a sandbox hammering a denied
// address cannot flood the node's journal. Attempts over it are dropped
// unlogged.
const auditRate = 100

// auditChains (re)writes the audit chains: each logs a new connection's
// first packet (rate-limited) to the egress audit's NFLOG group with the
// rule kind as prefix, and drops everything. One chain per kind, not a
// log rule per entry: 256 deny entries with a log rule each overflow one
// netlink batch.
func auditChains(c *nftables.Conn, t *nftables.Table) {
	for name, rule := range auditRules {
		ch := c.AddChain(&nftables.Chain{Name: name, Table: t})
		c.FlushChain(ch)
		c.AddRule(&nftables.Rule{Table: t, Chain: ch, Exprs: nftexpr.Rule(nftexpr.CtNew(),
			&expr.Limit{Type: expr.LimitTypePkts, Rate: auditRate, Unit: expr.LimitTimeSecond, Burst: 2 * auditRate},
			&expr.Log{Key: 1<<unix.NFTA_LOG_GROUP | 1<<unix.NFTA_LOG_PREFIX | 1<<unix.NFTA_LOG_SNAPLEN,
				Group: netaudit.Group, Snaplen: netaudit.SnapLen, Data: []byte(netaudit.PrefixMark + rule)})})
		c.AddRule(&nftables.Rule{Table: t, Chain: ch, Exprs: nftexpr.Rule(nftexpr.Verdict(expr.VerdictDrop))})
	}
}

// redirectRules fills the egressnat chain: while a policy has domain
// entries or headers to inject, the sandbox's new TCP connections to ports 80 and 443 go to
// the egress proxy's listener in the gateway, which judges them on the
// name they ask for. Floor destinations (and the gateway itself) are not
// redirected: the forward chain drops them as before.
func redirectRules(c *nftables.Conn, t *nftables.Table, ch *nftables.Chain, fam family, floor []netip.Prefix, p Policy) {
	if !p.NeedsProxy() {
		return
	}
	for _, f := range append([]netip.Prefix{fam.gatewayRange}, fam.of(floor)...) {
		c.AddRule(&nftables.Rule{Table: t, Chain: ch, Exprs: nftexpr.Rule(nftexpr.InPrefix(fam.dst, f, expr.CmpOpEq), nftexpr.Verdict(expr.VerdictReturn))})
	}
	for _, port := range []uint16{80, 443} {
		c.AddRule(&nftables.Rule{Table: t, Chain: ch, Exprs: nftexpr.Rule(
			nftexpr.Dport(unix.IPPROTO_TCP, port),
			&expr.Immediate{Register: 1, Data: binaryutil.BigEndian.PutUint16(egress.ListenPort)},
			&expr.Redir{RegisterProtoMin: 1},
		)})
	}
}

// SetPolicy changes a running instance's egress policy (atomically: the
// chains are flushed and refilled in one transaction); the egress proxy
// judges new connections by it from then on.
func (m *Manager) SetPolicy(ctx context.Context, instance string, p Policy) error {
	if err := m.validate(p); err != nil {
		return fmt.Errorf("network of %s: %w", instance, err)
	}
	n, err := m.Get(instance)
	if err != nil {
		return err
	}
	// The proxy first: a connection redirected under the new chains is
	// judged by the new rules. (One redirected just before, under the old
	// chains, is judged by the new rules too: the newer policy wins.)
	if m.cfg.Egress != nil {
		m.cfg.Egress.Update(instance, m.egressRules(p))
	}
	if err := m.writeEgress(n, p); err != nil {
		if m.cfg.Egress != nil {
			m.cfg.Egress.Update(instance, m.egressRules(n.Policy))
		}
		return err
	}
	n.Policy = p
	m.index(n)
	b, _ := json.Marshal(n)
	return os.WriteFile(m.statePath(instance), b, 0o600)
}

// Claim hands a network Reserve set up to the sandbox that now holds its
// instance: the gateway's rules with the sandbox's policy, forwarding, and
// the egress audit, journaled under owner. A network that is not reserved
// is refused (ErrConflict) and left as it was.
func (m *Manager) Claim(ctx context.Context, instance, owner string, p Policy) error {
	if err := m.validate(p); err != nil {
		return fmt.Errorf("network of %s: %w", instance, err)
	}
	n, err := m.Get(instance)
	if err != nil {
		return err
	}
	if !n.Reserved {
		return errdefs.Conflictf("network of %s: not reserved, or claimed already", instance)
	}
	gw, err := netns.GetFromName(m.gwName(instance))
	if err != nil {
		return fmt.Errorf("network of %s: %w", instance, err)
	}
	defer gw.Close()
	n.Policy, n.Owner, n.Reserved = p, owner, false
	if m.cfg.Egress != nil {
		m.cfg.Egress.Update(instance, m.egressRules(p))
	}
	if err := m.gatewayRules(gw, n); err != nil {
		return fmt.Errorf("network of %s: gateway rules: %w", instance, err)
	}
	if err := forwarding(gw, n, true); err != nil {
		return fmt.Errorf("network of %s: %w", instance, err)
	}
	b, _ := json.Marshal(n)
	if err := os.WriteFile(m.statePath(instance), b, 0o600); err != nil {
		return fmt.Errorf("network of %s: %w", instance, err)
	}
	m.index(n)
	if err := m.startAudit(gw, n); err != nil {
		// As in Setup: the sandbox runs without its audit rather than
		// not at all; the node says so loudly.
		m.cfg.Logger.Error("egress audit: not collecting for this sandbox", "instance", instance, "err", err)
	}
	return nil
}

// writeEgress replaces a gateway's egress chains (each family's) in one
// transaction.
func (m *Manager) writeEgress(n Net, p Policy) error {
	gw, err := netns.GetFromName(m.gwName(n.Instance))
	if err != nil {
		return fmt.Errorf("network of %s: %w", n.Instance, err)
	}
	defer gw.Close()
	c, err := nftables.New(nftables.WithNetNSFd(int(gw)), bigBatch)
	if err != nil {
		return err
	}
	fams := []family{fam4}
	if n.Addr6.IsValid() {
		fams = append(fams, fam6)
	}
	for _, fam := range fams {
		t := fam.gatewayTable()
		ch := &nftables.Chain{Name: "egress", Table: t}
		c.FlushChain(ch)
		// A gateway built before the egress audit has no audit chains:
		// made here, so its drops are journaled from now on.
		auditChains(c, t)
		egressRules(c, t, ch, fam, m.floor, p)
		// A gateway built before the egress proxy has no egressnat chain
		// (and no jump to it): adding it is harmless there, and its
		// domain rules then fail closed (ports 80 and 443 judged by the
		// CIDR rules alone).
		enat := c.AddChain(&nftables.Chain{Name: "egressnat", Table: t})
		c.FlushChain(enat)
		redirectRules(c, t, enat, fam, m.floor, p)
	}
	if err := c.Flush(); err != nil {
		return fmt.Errorf("network of %s: set policy: %w", n.Instance, err)
	}
	return nil
}

// refreshEgress rewrites the egress chain of every gateway this manager
// recorded, so sandboxes that kept running across a restart get the
// floor as configured now (and gateways built before the floor existed
// get one). A record without a gateway is left to Sweep.
func (m *Manager) refreshEgress() {
	ids, _ := m.List()
	for _, id := range ids {
		n, err := m.Get(id)
		if err != nil || n.Reserved { // a reserved one has no rules yet, and no sandbox
			continue
		}
		if _, err := os.Stat(filepath.Join(runDir, m.gwName(id))); err != nil {
			continue
		}
		if err := m.writeEgress(n, n.Policy); err != nil {
			m.cfg.Logger.Warn("egress floor not applied to a running sandbox", "instance", id, "err", err)
		}
		if gw, err := netns.GetFromName(m.gwName(id)); err == nil {
			if err := m.startAudit(gw, n); err != nil {
				m.cfg.Logger.Warn("egress audit not collecting for a running sandbox", "instance", id, "err", err)
			}
			if err := m.serveEgress(gw, n); err != nil {
				m.cfg.Logger.Warn("egress proxy not serving a running sandbox", "instance", id, "err", err)
			}
			gw.Close()
		}
	}
}

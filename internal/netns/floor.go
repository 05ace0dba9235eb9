package netns

import (
	"net/netip"
	"slices"
	"strings"

	"github.com/spore-run/spore/internal/egress"
	"github.com/spore-run/spore/internal/errdefs"
)

// MaxPolicyEntries caps each list of a policy: every entry is a rule the
// kernel walks for each new outbound connection of the sandbox.
const MaxPolicyEntries = 256

// defaultFloor is what no sandbox reaches, whatever its policy: the host's
// LAN (private ranges), carrier-grade NAT, link-local (the cloud metadata
// address 169.254.169.254), loopback, "this network", IETF protocol
// assignments, multicast and reserved space; in IPv6 ::/96 (the
// unspecified and loopback addresses, and the deprecated IPv4-compatible
// ones), IPv4-mapped and IPv4-translated addresses, Teredo (2001::/32: it
// tunnels to an IPv4 address it embeds), discard-only, the local-use
// NAT64 prefix, unique local (the LAN's and the cloud metadata's
// fd00:ec2::254), site-local, link-local and multicast. DefaultFloor adds
// each IPv4 entry's forms under the well-known NAT64 prefix and 6to4
// (ipv6Forms). The benchmarking ranges 198.18.0.0/15 and 2001:2::/48 are
// deliberately not here: the tests' outside hosts live there.
var defaultFloor = []string{
	"0.0.0.0/8", "10.0.0.0/8", "100.64.0.0/10", "127.0.0.0/8", "169.254.0.0/16",
	"172.16.0.0/12", "192.0.0.0/24", "192.168.0.0/16", "224.0.0.0/4", "240.0.0.0/4",
	"::/96", "::ffff:0:0/96", "::ffff:0:0:0/96", "2001::/32", "64:ff9b:1::/48", "100::/64",
	"fc00::/7", "fec0::/10", "fe80::/10", "ff00::/8",
}

// DefaultFloor returns the default operator floor (see Config.Floor),
// the IPv6 forms of its IPv4 entries included.
func DefaultFloor() []netip.Prefix {
	out := make([]netip.Prefix, len(defaultFloor))
	for i, s := range defaultFloor {
		out[i] = netip.MustParsePrefix(s)
	}
	return withIPv6Forms(out)
}

// nat64Prefix is NAT64's well-known prefix (RFC 6052): 64:ff9b::a.b.c.d
// is translated to the IPv4 address a.b.c.d, private ones included when a
// NAT64 on the path does not refuse them (RFC 6052 says it must; not all
// do). The prefix as a whole is not floored: on an IPv6-only host it is
// the way to the IPv4 internet.
var nat64Prefix = netip.MustParsePrefix("64:ff9b::/96")

// ipv6Forms returns the IPv6 prefixes that reach the IPv4 prefix p by
// another road: its translation under the NAT64 well-known prefix
// (64:ff9b::a.b.c.d/96+n) and its 6to4 prefix (2002:aabb:ccdd::/16+n,
// routed by a 6to4 relay to the IPv4 address). IPv4-mapped addresses
// need no entry per prefix: the floor holds ::ffff:0:0/96 whole.
func ipv6Forms(p netip.Prefix) []netip.Prefix {
	if !p.Addr().Is4() {
		return nil
	}
	p = p.Masked()
	v4 := p.Addr().As4()
	nat64 := nat64Prefix.Addr().As16()
	copy(nat64[12:], v4[:])
	var sixToFour [16]byte
	sixToFour[0], sixToFour[1] = 0x20, 0x02
	copy(sixToFour[2:], v4[:])
	return []netip.Prefix{
		netip.PrefixFrom(netip.AddrFrom16(nat64), 96+p.Bits()),
		netip.PrefixFrom(netip.AddrFrom16(sixToFour), 16+p.Bits()),
	}
}

// withIPv6Forms returns list with the IPv6 forms (ipv6Forms) of its IPv4
// prefixes that list does not cover already.
func withIPv6Forms(list []netip.Prefix) []netip.Prefix {
	out := slices.Clone(list)
	for _, p := range list {
		for _, f := range ipv6Forms(p) {
			if !covers(out, f) {
				out = append(out, f)
			}
		}
	}
	return out
}

// covers says whether one prefix of list holds all of p.
func covers(list []netip.Prefix, p netip.Prefix) bool {
	return slices.ContainsFunc(list, func(q netip.Prefix) bool { return q.Bits() <= p.Bits() && q.Contains(p.Addr()) })
}

// ParsePrefixes parses CIDRs or single addresses (an operator's list).
func ParsePrefixes(list []string) ([]netip.Prefix, error) {
	var out []netip.Prefix
	for _, s := range list {
		s = strings.TrimSpace(s)
		if s == "" {
			continue
		}
		if p, err := netip.ParsePrefix(s); err == nil {
			out = append(out, p.Masked())
			continue
		}
		if a, err := netip.ParseAddr(s); err == nil {
			out = append(out, netip.PrefixFrom(a, a.BitLen()))
			continue
		}
		return nil, errdefs.Invalidf("%q is not an address or CIDR", s)
	}
	return out, nil
}

// Validate checks a user policy: addresses and CIDRs (IPv4 or IPv6),
// domains in egress.ParseDomain's form, at most MaxPolicyEntries in each
// list (addresses and domains together).
func (p Policy) Validate() error {
	if err := egress.ValidateInjections(p.Inject); err != nil {
		return err
	}
	if len(p.Inject) > 0 {
		if p.CA == nil {
			return errdefs.Invalidf("network rules need the sandbox's egress CA")
		}
		if err := p.CA.Validate(); err != nil {
			return errdefs.Invalidf("%v", err)
		}
	}
	for _, l := range []struct {
		name    string
		domains []string
		others  int
	}{{"allow", p.AllowDomains, len(p.Allow)}, {"deny", p.DenyDomains, len(p.Deny)}} {
		if len(l.domains)+l.others > MaxPolicyEntries {
			return errdefs.Invalidf("%s list has %d entries, at most %d", l.name, len(l.domains)+l.others, MaxPolicyEntries)
		}
		for _, d := range l.domains {
			if got, err := egress.ParseDomain(d); err != nil || got != d {
				return errdefs.Invalidf("%s entry %q is not a normalized domain", l.name, d)
			}
		}
	}
	for _, l := range []struct {
		name string
		list []netip.Prefix
	}{{"allow", p.Allow}, {"deny", p.Deny}} {
		if len(l.list) > MaxPolicyEntries {
			return errdefs.Invalidf("%s list has %d entries, at most %d", l.name, len(l.list), MaxPolicyEntries)
		}
		for _, e := range l.list {
			if !e.IsValid() || e.Addr().Is4In6() || e.Addr().Zone() != "" {
				return errdefs.Invalidf("%s entry %v is not an IPv4 or IPv6 address or CIDR", l.name, e)
			}
		}
	}
	return nil
}

// buildFloor returns the floor the gateways enforce (IPv4 and IPv6): the
// configured prefixes (DefaultFloor when nil) and the host's own
// addresses, outside the sandbox spaces (which the floor's 10.0.0.0/8 and
// fc00::/7 cover by default and the root namespace's rules cover anyway),
// with the NAT64 and 6to4 forms of every IPv4 entry (an operator's own
// and the host's included: a floored address is floored by any name).
func buildFloor(cfg []netip.Prefix, host map[netip.Addr]bool) []netip.Prefix {
	if cfg == nil {
		cfg = DefaultFloor()
	}
	var out []netip.Prefix
	for _, p := range cfg {
		out = append(out, p.Masked())
	}
	for a := range host {
		if a.Zone() != "" || sandboxSpace.Contains(a) || sandboxSpace6.Contains(a) {
			continue
		}
		if !slices.ContainsFunc(out, func(p netip.Prefix) bool { return p.Contains(a) }) {
			out = append(out, netip.PrefixFrom(a, a.BitLen()))
		}
	}
	out = withIPv6Forms(out)
	slices.SortFunc(out, func(a, b netip.Prefix) int { return a.Addr().Compare(b.Addr()) })
	return out
}

// Floor returns the prefixes no sandbox of this manager reaches.
func (m *Manager) Floor() []netip.Prefix { return slices.Clone(m.floor) }

// DNSVerdict says what the node's DNS forwarder does with a query from a
// source address.
type DNSVerdict int

const (
	// DNSDrop: not a sandbox of this manager; ignore the packet.
	DNSDrop DNSVerdict = iota
	// DNSRefuse: a sandbox whose policy keeps it off the internet; answer
	// REFUSED at once (so resolvers fail fast, and a name lookup is no
	// channel out of a closed sandbox).
	DNSRefuse
	// DNSForward: forward to the operator's upstream.
	DNSForward
)

func (v DNSVerdict) String() string {
	switch v {
	case DNSRefuse:
		return "refuse"
	case DNSForward:
		return "forward"
	}
	return "drop"
}

// DNSVerdictFor decides on a query arriving from src: the gateway address
// (up0, 10.200.S.2) a sandbox's packets leave with. A sandbox with
// internet access resolves names, and so does one whose allow list names
// domains (it must look them up to reach them); one without either does
// not, whatever its allow list of addresses (DNS would be a way out).
func (m *Manager) DNSVerdictFor(src netip.Addr) DNSVerdict {
	m.idxMu.RLock()
	p, ok := m.byAddr[src.Unmap()]
	m.idxMu.RUnlock()
	switch {
	case !ok:
		return DNSDrop
	case p.Internet || len(p.AllowDomains) > 0:
		return DNSForward
	}
	return DNSRefuse
}

func (m *Manager) index(n Net) {
	m.idxMu.Lock()
	m.byAddr[n.Addr] = n.Policy
	m.idxMu.Unlock()
}

func (m *Manager) unindex(addr netip.Addr) {
	m.idxMu.Lock()
	delete(m.byAddr, addr)
	m.idxMu.Unlock()
}

// holdSlot records that instance's record holds slot; freeSlot that it no
// longer does.
func (m *Manager) holdSlot(slot int, instance string) {
	m.idxMu.Lock()
	m.slots[slot] = instance
	m.idxMu.Unlock()
}

func (m *Manager) freeSlot(slot int, instance string) {
	m.idxMu.Lock()
	if m.slots[slot] == instance {
		delete(m.slots, slot)
	}
	m.idxMu.Unlock()
}

// usedSlots returns the slots this manager's records hold.
func (m *Manager) usedSlots() map[int]bool {
	m.idxMu.RLock()
	defer m.idxMu.RUnlock()
	used := make(map[int]bool, len(m.slots))
	for s := range m.slots {
		used[s] = true
	}
	return used
}

// loadIndex fills the address index from the records (a restarted server
// re-attaches to running sandboxes).
func (m *Manager) loadIndex() error {
	ids, err := m.List()
	if err != nil {
		return err
	}
	for _, id := range ids {
		n, err := m.Get(id)
		if err != nil {
			m.cfg.Logger.Warn("network record unreadable; its sandbox gets no DNS", "instance", id, "err", err)
			continue
		}
		m.index(n)
		m.holdSlot(n.Slot, id)
	}
	return nil
}

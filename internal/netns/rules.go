package netns

import (
	"context"
	"encoding/binary"
	"encoding/json"
	"fmt"
	"net/netip"
	"os"

	"github.com/google/nftables"
	"github.com/google/nftables/expr"
	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"
)

// Rule building blocks (nftables expressions).

func ifname(key expr.MetaKey, name string, op expr.CmpOp) []expr.Any {
	data := []byte(name)
	if name[len(name)-1] == '*' { // prefix match, like nft's "name*"
		data = data[:len(data)-1]
	} else {
		data = append(data, 0)
	}
	return []expr.Any{
		&expr.Meta{Key: key, Register: 1},
		&expr.Cmp{Op: op, Register: 1, Data: data},
	}
}

func ctEstablished() []expr.Any {
	mask := make([]byte, 4)
	binary.NativeEndian.PutUint32(mask, expr.CtStateBitESTABLISHED|expr.CtStateBitRELATED)
	return []expr.Any{
		&expr.Ct{Register: 1, Key: expr.CtKeySTATE},
		&expr.Bitwise{SourceRegister: 1, DestRegister: 1, Len: 4, Mask: mask, Xor: make([]byte, 4)},
		&expr.Cmp{Op: expr.CmpOpNeq, Register: 1, Data: make([]byte, 4)},
	}
}

// inPrefix matches the IPv4 source (offset 12) or destination (16) against
// a prefix.
func inPrefix(offset uint32, p netip.Prefix, op expr.CmpOp) []expr.Any {
	p = p.Masked()
	mask := make([]byte, 4)
	binary.BigEndian.PutUint32(mask, ^uint32(0)<<(32-p.Bits()))
	if p.Bits() == 0 {
		mask = make([]byte, 4)
	}
	a := p.Addr().As4()
	return []expr.Any{
		&expr.Payload{DestRegister: 1, Base: expr.PayloadBaseNetworkHeader, Offset: offset, Len: 4},
		&expr.Bitwise{SourceRegister: 1, DestRegister: 1, Len: 4, Mask: mask, Xor: make([]byte, 4)},
		&expr.Cmp{Op: op, Register: 1, Data: a[:]},
	}
}

func verdict(k expr.VerdictKind) expr.Any { return &expr.Verdict{Kind: k} }

func rule(parts ...any) []expr.Any {
	var out []expr.Any
	for _, p := range parts {
		switch v := p.(type) {
		case expr.Any:
			out = append(out, v)
		case []expr.Any:
			out = append(out, v...)
		}
	}
	return out
}

const (
	offSrc = 12
	offDst = 16
)

var policyAccept = nftables.ChainPolicyAccept
var policyDrop = nftables.ChainPolicyDrop

// hostRules installs (replacing) the root namespace's table: no new
// connections from sandboxes to the host, none between sandboxes, and
// masquerading of sandbox egress.
func (m *Manager) hostRules() error {
	c, err := nftables.New()
	if err != nil {
		return err
	}
	t := &nftables.Table{Family: nftables.TableFamilyIPv4, Name: m.cfg.Prefix + "-host"}
	c.AddTable(t)
	c.DelTable(t) // replace whatever an earlier run left
	c.AddTable(t)
	input := c.AddChain(&nftables.Chain{Name: "input", Table: t, Type: nftables.ChainTypeFilter, Hooknum: nftables.ChainHookInput, Priority: nftables.ChainPriorityFilter, Policy: &policyAccept})
	sb := m.hostIfPrefix() + "*"
	c.AddRule(&nftables.Rule{Table: t, Chain: input, Exprs: rule(ifname(expr.MetaKeyIIFNAME, sb, expr.CmpOpEq), ctEstablished(), verdict(expr.VerdictAccept))})
	c.AddRule(&nftables.Rule{Table: t, Chain: input, Exprs: rule(ifname(expr.MetaKeyIIFNAME, sb, expr.CmpOpEq), verdict(expr.VerdictDrop))})
	fwd := c.AddChain(&nftables.Chain{Name: "forward", Table: t, Type: nftables.ChainTypeFilter, Hooknum: nftables.ChainHookForward, Priority: nftables.ChainPriorityFilter, Policy: &policyAccept})
	c.AddRule(&nftables.Rule{Table: t, Chain: fwd, Exprs: rule(ifname(expr.MetaKeyIIFNAME, sb, expr.CmpOpEq), ifname(expr.MetaKeyOIFNAME, sb, expr.CmpOpEq), verdict(expr.VerdictDrop))})
	post := c.AddChain(&nftables.Chain{Name: "postrouting", Table: t, Type: nftables.ChainTypeNAT, Hooknum: nftables.ChainHookPostrouting, Priority: nftables.ChainPriorityNATSource})
	c.AddRule(&nftables.Rule{Table: t, Chain: post, Exprs: rule(inPrefix(offSrc, netip.MustParsePrefix("10.200.0.0/16"), expr.CmpOpEq), ifname(expr.MetaKeyOIFNAME, sb, expr.CmpOpNeq), &expr.Masq{})})
	return c.Flush()
}

// RemoveHostRules deletes the root namespace's table (tests).
func (m *Manager) RemoveHostRules() error {
	c, err := nftables.New()
	if err != nil {
		return err
	}
	t := &nftables.Table{Family: nftables.TableFamilyIPv4, Name: m.cfg.Prefix + "-host"}
	c.DelTable(t)
	return c.Flush()
}

// gatewayRules installs the gateway namespace's table: DNAT of the host's
// connections to the sandbox, SNAT both ways, a default-drop forward chain
// and the egress policy.
func (m *Manager) gatewayRules(gw netns.NsHandle, n Net) error {
	c, err := nftables.New(nftables.WithNetNSFd(int(gw)))
	if err != nil {
		return err
	}
	t := c.AddTable(&nftables.Table{Family: nftables.TableFamilyIPv4, Name: "spore"})
	pre := c.AddChain(&nftables.Chain{Name: "prerouting", Table: t, Type: nftables.ChainTypeNAT, Hooknum: nftables.ChainHookPrerouting, Priority: nftables.ChainPriorityNATDest})
	sbAddr := SandboxIP.As4()
	c.AddRule(&nftables.Rule{Table: t, Chain: pre, Exprs: rule(
		ifname(expr.MetaKeyIIFNAME, "up0", expr.CmpOpEq),
		inPrefix(offDst, netip.PrefixFrom(n.Addr, 32), expr.CmpOpEq),
		&expr.Immediate{Register: 1, Data: sbAddr[:]},
		&expr.NAT{Type: expr.NATTypeDestNAT, Family: unix.NFPROTO_IPV4, RegAddrMin: 1, RegAddrMax: 1},
	)})
	post := c.AddChain(&nftables.Chain{Name: "postrouting", Table: t, Type: nftables.ChainTypeNAT, Hooknum: nftables.ChainHookPostrouting, Priority: nftables.ChainPriorityNATSource})
	// Toward the sandbox everything comes from its gateway; outward
	// everything leaves from up0's address.
	c.AddRule(&nftables.Rule{Table: t, Chain: post, Exprs: rule(ifname(expr.MetaKeyOIFNAME, "gw0", expr.CmpOpEq), &expr.Masq{})})
	c.AddRule(&nftables.Rule{Table: t, Chain: post, Exprs: rule(ifname(expr.MetaKeyOIFNAME, "up0", expr.CmpOpEq), &expr.Masq{})})
	fwd := c.AddChain(&nftables.Chain{Name: "forward", Table: t, Type: nftables.ChainTypeFilter, Hooknum: nftables.ChainHookForward, Priority: nftables.ChainPriorityFilter, Policy: &policyDrop})
	egress := c.AddChain(&nftables.Chain{Name: "egress", Table: t})
	c.AddRule(&nftables.Rule{Table: t, Chain: fwd, Exprs: rule(ctEstablished(), verdict(expr.VerdictAccept))})
	c.AddRule(&nftables.Rule{Table: t, Chain: fwd, Exprs: rule(ifname(expr.MetaKeyIIFNAME, "up0", expr.CmpOpEq), ifname(expr.MetaKeyOIFNAME, "gw0", expr.CmpOpEq), verdict(expr.VerdictAccept))})
	c.AddRule(&nftables.Rule{Table: t, Chain: fwd, Exprs: rule(ifname(expr.MetaKeyIIFNAME, "gw0", expr.CmpOpEq), ifname(expr.MetaKeyOIFNAME, "up0", expr.CmpOpEq), &expr.Verdict{Kind: expr.VerdictJump, Chain: "egress"})})
	egressRules(c, t, egress, n.Policy)
	return c.Flush()
}

// egressRules fills the egress chain: deny list, allow list, then the
// default. Private, link-local and loopback ranges are refused unless
// allowed explicitly: a sandbox reaches the internet, not the host's LAN.
func egressRules(c *nftables.Conn, t *nftables.Table, ch *nftables.Chain, p Policy) {
	for _, d := range p.Deny {
		c.AddRule(&nftables.Rule{Table: t, Chain: ch, Exprs: rule(inPrefix(offDst, d, expr.CmpOpEq), verdict(expr.VerdictDrop))})
	}
	for _, a := range p.Allow {
		c.AddRule(&nftables.Rule{Table: t, Chain: ch, Exprs: rule(inPrefix(offDst, a, expr.CmpOpEq), verdict(expr.VerdictAccept))})
	}
	if !p.Internet {
		c.AddRule(&nftables.Rule{Table: t, Chain: ch, Exprs: rule(verdict(expr.VerdictDrop))})
		return
	}
	for _, r := range []string{"10.0.0.0/8", "172.16.0.0/12", "192.168.0.0/16", "169.254.0.0/16", "127.0.0.0/8", "100.64.0.0/10"} {
		c.AddRule(&nftables.Rule{Table: t, Chain: ch, Exprs: rule(inPrefix(offDst, netip.MustParsePrefix(r), expr.CmpOpEq), verdict(expr.VerdictDrop))})
	}
	c.AddRule(&nftables.Rule{Table: t, Chain: ch, Exprs: rule(verdict(expr.VerdictAccept))})
}

// SetPolicy changes a running instance's egress policy (atomically: the
// chain is flushed and refilled in one transaction).
func (m *Manager) SetPolicy(ctx context.Context, instance string, p Policy) error {
	n, err := m.Get(instance)
	if err != nil {
		return err
	}
	gw, err := netns.GetFromName(m.gwName(instance))
	if err != nil {
		return fmt.Errorf("network of %s: %w", instance, err)
	}
	defer gw.Close()
	c, err := nftables.New(nftables.WithNetNSFd(int(gw)))
	if err != nil {
		return err
	}
	t := &nftables.Table{Family: nftables.TableFamilyIPv4, Name: "spore"}
	ch := &nftables.Chain{Name: "egress", Table: t}
	c.FlushChain(ch)
	egressRules(c, t, ch, p)
	if err := c.Flush(); err != nil {
		return fmt.Errorf("network of %s: set policy: %w", instance, err)
	}
	n.Policy = p
	b, _ := json.Marshal(n)
	return os.WriteFile(m.statePath(instance), b, 0o600)
}

// Package nftexpr holds the nftables expression building blocks Spore's
// rules are made of (sandbox networks in netns, the local fleet's host
// table in fleet).
package nftexpr

import (
	"encoding/binary"
	"net/netip"

	"github.com/google/nftables/binaryutil"
	"github.com/google/nftables/expr"
	"golang.org/x/sys/unix"
)

// IfName matches an interface name (key: IIFNAME or OIFNAME); a trailing
// '*' matches a prefix, like nft's "name*".
func IfName(key expr.MetaKey, name string, op expr.CmpOp) []expr.Any {
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

// CtEstablished matches connections already established or related.
func CtEstablished() []expr.Any {
	mask := make([]byte, 4)
	binary.NativeEndian.PutUint32(mask, expr.CtStateBitESTABLISHED|expr.CtStateBitRELATED)
	return []expr.Any{
		&expr.Ct{Register: 1, Key: expr.CtKeySTATE},
		&expr.Bitwise{SourceRegister: 1, DestRegister: 1, Len: 4, Mask: mask, Xor: make([]byte, 4)},
		&expr.Cmp{Op: expr.CmpOpNeq, Register: 1, Data: make([]byte, 4)},
	}
}

// CtNew matches a packet that opens a flow (conntrack state new): not a
// reply, not a later packet of one.
func CtNew() []expr.Any {
	mask := make([]byte, 4)
	binary.NativeEndian.PutUint32(mask, expr.CtStateBitNEW)
	return []expr.Any{
		&expr.Ct{Register: 1, Key: expr.CtKeySTATE},
		&expr.Bitwise{SourceRegister: 1, DestRegister: 1, Len: 4, Mask: mask, Xor: make([]byte, 4)},
		&expr.Cmp{Op: expr.CmpOpNeq, Register: 1, Data: make([]byte, 4)},
	}
}

// InPrefix matches the address at offset of the network header against
// a prefix: IPv4 source (offset 12) or destination (16), IPv6 source (8)
// or destination (24); the prefix's family sets the length compared.
func InPrefix(offset uint32, p netip.Prefix, op expr.CmpOp) []expr.Any {
	p = p.Masked()
	a := p.Addr().AsSlice()
	mask := make([]byte, len(a))
	for i := range mask {
		switch bits := p.Bits() - 8*i; {
		case bits >= 8:
			mask[i] = 0xff
		case bits > 0:
			mask[i] = byte(0xff << (8 - bits))
		}
	}
	return []expr.Any{
		&expr.Payload{DestRegister: 1, Base: expr.PayloadBaseNetworkHeader, Offset: offset, Len: uint32(len(a))},
		&expr.Bitwise{SourceRegister: 1, DestRegister: 1, Len: uint32(len(a)), Mask: mask, Xor: make([]byte, len(a))},
		&expr.Cmp{Op: op, Register: 1, Data: a},
	}
}

// Verdict is a rule's final statement.
func Verdict(k expr.VerdictKind) expr.Any { return &expr.Verdict{Kind: k} }

// Dport matches a transport protocol and destination port.
func Dport(proto byte, port uint16) []expr.Any {
	return []expr.Any{
		&expr.Meta{Key: expr.MetaKeyL4PROTO, Register: 1},
		&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: []byte{proto}},
		&expr.Payload{DestRegister: 1, Base: expr.PayloadBaseTransportHeader, Offset: 2, Len: 2},
		&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: binaryutil.BigEndian.PutUint16(port)},
	}
}

// Rule flattens expressions and lists of them into one rule body.
func Rule(parts ...any) []expr.Any {
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

// NDP matches IPv6 neighbour discovery (ICMPv6 types 133-137: router
// and neighbour solicitations and advertisements, redirects), which
// connection tracking does not follow.
func NDP() []expr.Any {
	return []expr.Any{
		&expr.Meta{Key: expr.MetaKeyL4PROTO, Register: 1},
		&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: []byte{unix.IPPROTO_ICMPV6}},
		&expr.Payload{DestRegister: 1, Base: expr.PayloadBaseTransportHeader, Offset: 0, Len: 1},
		&expr.Cmp{Op: expr.CmpOpGte, Register: 1, Data: []byte{133}},
		&expr.Cmp{Op: expr.CmpOpLte, Register: 1, Data: []byte{137}},
	}
}

// IPv4 matches IPv4 packets (in an inet table).
func IPv4() []expr.Any {
	return []expr.Any{
		&expr.Meta{Key: expr.MetaKeyNFPROTO, Register: 1},
		&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: []byte{unix.NFPROTO_IPV4}},
	}
}

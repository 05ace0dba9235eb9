package netaudit

import (
	"encoding/binary"
	"fmt"
	"net/netip"
	"strings"

	"github.com/mdlayher/netlink"
	"github.com/ti-mo/netfilter"
	"golang.org/x/sys/unix"
)

// Group is the NFLOG group the gateway's drop rules log to (each gateway
// namespace has its own groups, so one number serves every sandbox).
const Group = 7311

// PrefixMark starts every log prefix Spore's rules write; the rest names
// the rule kind ("floor", "deny", "internet off").
const PrefixMark = "spore:"

// SnapLen is how much of a dropped packet is logged: the IPv4 header
// (with options) or the IPv6 one (40 bytes), and the ports.
const SnapLen = 64

// The NFLOG protocol (linux/netfilter/nfnetlink_log.h).
const (
	nfulnlMsgPacket = 0
	nfulnlMsgConfig = 1

	nfulaCfgCmd     = 1
	nfulaCfgMode    = 2
	nfulaCfgQthresh = 5

	nfulnlCfgCmdBind = 1
	nfulnlCopyPacket = 2
	nfulaPayload     = 9
	nfulaPrefix      = 10
)

// Denied is one dropped connection attempt, as logged.
type Denied struct {
	Rule    string
	Proto   uint8
	Dst     netip.AddrPort // port 0 for protocols without ports
	SrcPort uint16         // the client's port (a retransmission keeps it)
}

// nflogReader reads a namespace's NFLOG group.
type nflogReader struct {
	c *netfilter.Conn
}

// openNFLOG binds Group in the namespace whose descriptor is nsFD, copying
// SnapLen bytes of each packet, delivered at once.
func openNFLOG(nsFD int) (*nflogReader, error) {
	c, err := netfilter.Dial(&netlink.Config{NetNS: nsFD})
	if err != nil {
		return nil, fmt.Errorf("nflog: %w", err)
	}
	cfg := func(attrs []netfilter.Attribute) error {
		m, err := netfilter.MarshalNetlink(netfilter.Header{SubsystemID: netfilter.NFSubsysULOG, MessageType: nfulnlMsgConfig,
			Family: netfilter.ProtoUnspec, ResourceID: Group}, attrs)
		if err != nil {
			return err
		}
		m.Header.Flags = netlink.Request | netlink.Acknowledge
		_, err = c.Query(m)
		return err
	}
	mode := make([]byte, 6)
	binary.BigEndian.PutUint32(mode, SnapLen)
	mode[4] = nfulnlCopyPacket
	qthresh := binary.BigEndian.AppendUint32(nil, 1)
	for _, attrs := range [][]netfilter.Attribute{
		{{Type: nfulaCfgCmd, Data: []byte{nfulnlCfgCmdBind}}},
		{{Type: nfulaCfgMode, Data: mode}},
		{{Type: nfulaCfgQthresh, Data: qthresh}},
	} {
		if err := cfg(attrs); err != nil {
			c.Close()
			return nil, fmt.Errorf("nflog: bind group %d: %w", Group, err)
		}
	}
	return &nflogReader{c: c}, nil
}

// next blocks for the next batch of Spore's log messages; an error ends
// the reader (net.ErrClosed-like after close).
func (r *nflogReader) next() ([]Denied, error) {
	msgs, err := r.c.Receive()
	if err != nil {
		return nil, err
	}
	var out []Denied
	for _, m := range msgs {
		h, attrs, err := netfilter.UnmarshalNetlink(m)
		if err != nil || h.SubsystemID != netfilter.NFSubsysULOG || h.MessageType != nfulnlMsgPacket {
			continue
		}
		if d, ok := parseLogged(attrs); ok {
			out = append(out, d)
		}
	}
	return out, nil
}

func (r *nflogReader) close() error { return r.c.Close() }

// parseLogged reads a logged packet's prefix and IP header.
func parseLogged(attrs []netfilter.Attribute) (Denied, bool) {
	var prefix string
	var payload []byte
	for _, a := range attrs {
		switch a.Type {
		case nfulaPrefix:
			prefix = strings.TrimRight(string(a.Data), "\x00")
		case nfulaPayload:
			payload = a.Data
		}
	}
	rule, ok := strings.CutPrefix(prefix, PrefixMark)
	if !ok {
		return Denied{}, false
	}
	proto, dst, hl, ok := parseIPv4(payload)
	if !ok {
		if proto, dst, hl, ok = parseIPv6(payload); !ok {
			return Denied{}, false
		}
	}
	d := Denied{Rule: rule, Proto: proto, Dst: dst}
	if dst.Port() != 0 {
		d.SrcPort = binary.BigEndian.Uint16(payload[hl : hl+2])
	}
	return d, true
}

// parseIPv6 returns an IPv6 packet's protocol, destination (with the port
// for TCP, UDP and SCTP directly after the fixed header) and header
// length. A packet whose first header is an extension header is given by
// that header's number, without a port.
func parseIPv6(p []byte) (uint8, netip.AddrPort, int, bool) {
	const hl = 40
	if len(p) < hl || p[0]>>4 != 6 {
		return 0, netip.AddrPort{}, 0, false
	}
	proto := p[6]
	dst := netip.AddrFrom16([16]byte(p[24:40]))
	return proto, netip.AddrPortFrom(dst, transportPort(proto, p, hl)), hl, true
}

// transportPort is the destination port of a TCP, UDP or SCTP header at
// offset hl of p (0 for other protocols or a packet cut short).
func transportPort(proto uint8, p []byte, hl int) uint16 {
	switch proto {
	case unix.IPPROTO_TCP, unix.IPPROTO_UDP, unix.IPPROTO_SCTP:
		if len(p) >= hl+4 {
			return binary.BigEndian.Uint16(p[hl+2 : hl+4])
		}
	}
	return 0
}

// parseIPv4 returns an IPv4 packet's protocol, destination (with the
// port for TCP, UDP and SCTP) and header length.
func parseIPv4(p []byte) (uint8, netip.AddrPort, int, bool) {
	if len(p) < 20 || p[0]>>4 != 4 {
		return 0, netip.AddrPort{}, 0, false
	}
	ihl := int(p[0]&0x0f) * 4
	if ihl < 20 || len(p) < ihl {
		return 0, netip.AddrPort{}, 0, false
	}
	proto := p[9]
	dst := netip.AddrFrom4([4]byte(p[16:20]))
	return proto, netip.AddrPortFrom(dst, transportPort(proto, p, ihl)), ihl, true
}

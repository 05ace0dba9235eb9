package nftexpr

import (
	"bytes"
	"net/netip"
	"testing"

	"github.com/google/nftables/expr"
)

// InPrefix compares as many bytes as the prefix's family has, under a
// mask of its length.
func TestInPrefix(t *testing.T) {
	for _, c := range []struct {
		prefix string
		mask   []byte
	}{
		{"10.0.0.0/8", []byte{0xff, 0, 0, 0}},
		{"10.200.0.4/30", []byte{0xff, 0xff, 0xff, 0xfc}},
		{"0.0.0.0/0", []byte{0, 0, 0, 0}},
		{"198.19.1.2/32", []byte{0xff, 0xff, 0xff, 0xff}},
		{"::/0", make([]byte, 16)},
		{"fc00::/7", append([]byte{0xfe}, make([]byte, 15)...)},
		{"2001:2:0:6::/64", append(bytes.Repeat([]byte{0xff}, 8), make([]byte, 8)...)},
		{"2001:2:0:6::2/128", bytes.Repeat([]byte{0xff}, 16)},
		{"2001:2::/127", append(bytes.Repeat([]byte{0xff}, 15), 0xfe)},
	} {
		p := netip.MustParsePrefix(c.prefix)
		es := InPrefix(24, p, expr.CmpOpEq)
		pl, bw, cmp := es[0].(*expr.Payload), es[1].(*expr.Bitwise), es[2].(*expr.Cmp)
		n := uint32(len(c.mask))
		if pl.Offset != 24 || pl.Len != n || bw.Len != n || !bytes.Equal(bw.Mask, c.mask) || len(bw.Xor) != int(n) {
			t.Errorf("%s: payload %+v, mask %x (want %x)", c.prefix, pl, bw.Mask, c.mask)
		}
		if !bytes.Equal(cmp.Data, p.Masked().Addr().AsSlice()) {
			t.Errorf("%s: compares with %x", c.prefix, cmp.Data)
		}
	}
}

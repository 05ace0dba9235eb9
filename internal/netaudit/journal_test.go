package netaudit

import (
	"encoding/binary"
	"net/netip"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/ti-mo/netfilter"
	"golang.org/x/sys/unix"

	"github.com/spore-run/spore/internal/errdefs"
)

func TestJournalAppendQuery(t *testing.T) {
	j, err := OpenJournal(t.TempDir(), time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	const sb = "iaudit0000000000001"
	if _, err := j.Query(sb, time.Time{}, 0); !errdefs.IsNotFound(err) {
		t.Fatalf("no journal yet: %v", err)
	}
	t0 := time.Date(2026, 11, 30, 12, 0, 0, 0, time.UTC)
	var es []Entry
	for i := range 5 {
		es = append(es, Entry{At: t0.Add(time.Duration(i) * time.Second), Proto: "tcp", Dst: "198.19.1.2:443", Allowed: i%2 == 0, BytesIn: int64(i)})
	}
	if err := j.Append(sb, es[:3]...); err != nil {
		t.Fatal(err)
	}
	if err := j.Append(sb, es[3:]...); err != nil {
		t.Fatal(err)
	}
	got, err := j.Query(sb, time.Time{}, 0)
	if err != nil || len(got) != 5 || got[4].BytesIn != 4 || !got[0].Allowed || got[1].Allowed {
		t.Fatalf("all: %v %+v", err, got)
	}
	if got, _ := j.Query(sb, t0.Add(2*time.Second), 0); len(got) != 3 || !got[0].At.Equal(t0.Add(2*time.Second)) {
		t.Fatalf("since: %+v", got)
	}
	if got, _ := j.Query(sb, time.Time{}, 2); len(got) != 2 || got[1].BytesIn != 4 {
		t.Fatalf("limit keeps the newest: %+v", got)
	}
	// A torn last line (a crash mid-write) is skipped, the rest read.
	f, _ := os.OpenFile(filepath.Join(j.dir, sb+".jsonl"), os.O_WRONLY|os.O_APPEND, 0)
	f.WriteString(`{"at":"2026-11-30T12:00:09Z","pro`)
	f.Close()
	if got, err := j.Query(sb, time.Time{}, 0); err != nil || len(got) != 5 {
		t.Fatalf("after a torn line: %v %d", err, len(got))
	}
	// Open connections come from the live source, after the journal's.
	remove := j.Live(sb, func() []Entry {
		return []Entry{{At: t0.Add(time.Minute), Proto: "udp", Dst: "198.19.1.2:53", Allowed: true, Open: true}}
	})
	if got, _ := j.Query(sb, time.Time{}, 0); len(got) != 6 || !got[5].Open {
		t.Fatalf("with the live source: %+v", got)
	}
	remove()
	if got, _ := j.Query(sb, time.Time{}, 0); len(got) != 5 {
		t.Fatalf("after remove: %d", len(got))
	}
	for _, bad := range []string{"", "../x", "a/b"} {
		if err := j.Append(bad, es[0]); !errdefs.IsInvalidArgument(err) {
			t.Errorf("append %q: %v", bad, err)
		}
		if _, err := j.Query(bad, time.Time{}, 0); !errdefs.IsInvalidArgument(err) {
			t.Errorf("query %q: %v", bad, err)
		}
	}
}

// A journal outlives its sandbox by the retention, counted from its last
// entry; one with a live source (a sandbox still running) is kept.
func TestJournalSweep(t *testing.T) {
	j, err := OpenJournal(t.TempDir(), time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	now := time.Now()
	j.now = func() time.Time { return now }
	for _, sb := range []string{"iold0000000000000001", "inew0000000000000001", "ilive000000000000001"} {
		if err := j.Append(sb, Entry{At: now, Proto: "tcp", Dst: "198.19.1.2:80"}); err != nil {
			t.Fatal(err)
		}
	}
	old := now.Add(-2 * time.Hour)
	for _, sb := range []string{"iold0000000000000001", "ilive000000000000001"} {
		os.Chtimes(filepath.Join(j.dir, sb+".jsonl"), old, old)
	}
	defer j.Live("ilive000000000000001", func() []Entry { return nil })()
	n, err := j.Sweep()
	if err != nil || n != 1 {
		t.Fatalf("sweep: %d %v", n, err)
	}
	if _, err := j.Query("iold0000000000000001", time.Time{}, 0); !errdefs.IsNotFound(err) {
		t.Fatalf("expired journal: %v", err)
	}
	for _, sb := range []string{"inew0000000000000001", "ilive000000000000001"} {
		if got, err := j.Query(sb, time.Time{}, 0); err != nil || len(got) != 1 {
			t.Fatalf("%s kept: %v %+v", sb, err, got)
		}
	}
}

func TestParseLogged(t *testing.T) {
	pkt := make([]byte, 24)
	pkt[0] = 0x45 // IPv4, 20-byte header
	pkt[9] = 6    // TCP
	copy(pkt[16:20], []byte{198, 19, 1, 2})
	binary.BigEndian.PutUint16(pkt[22:24], 443)
	d, ok := parseLogged([]netfilter.Attribute{{Type: nfulaPrefix, Data: []byte("spore:deny\x00")}, {Type: nfulaPayload, Data: pkt}})
	if !ok || d.Rule != "deny" || d.Proto != 6 || d.Dst != netip.MustParseAddrPort("198.19.1.2:443") {
		t.Fatalf("parsed %+v %v", d, ok)
	}
	if _, ok := parseLogged([]netfilter.Attribute{{Type: nfulaPrefix, Data: []byte("other:x")}, {Type: nfulaPayload, Data: pkt}}); ok {
		t.Fatal("a prefix not Spore's was taken")
	}
	for _, bad := range [][]byte{nil, pkt[:10], append([]byte{0x65}, pkt[1:]...), append([]byte{0x4f}, pkt[1:]...)} {
		if _, _, _, ok := parseIPv4(bad); ok {
			t.Errorf("parsed a bad packet %x", bad)
		}
	}
	icmp := append([]byte(nil), pkt[:20]...)
	icmp[9] = 1
	if p, dst, _, ok := parseIPv4(icmp); !ok || p != 1 || dst.Port() != 0 || dstString(p, dst.Addr(), dst.Port()) != "198.19.1.2" {
		t.Fatalf("icmp: %d %v %v", p, dst, ok)
	}

	// IPv6: a TCP SYN to [2001:2::5]:443 from port 40000, and ICMPv6.
	pkt6 := make([]byte, 44)
	pkt6[0] = 0x60
	pkt6[6] = 6
	copy(pkt6[24:40], netip.MustParseAddr("2001:2::5").AsSlice())
	binary.BigEndian.PutUint16(pkt6[40:42], 40000)
	binary.BigEndian.PutUint16(pkt6[42:44], 443)
	d, ok = parseLogged([]netfilter.Attribute{{Type: nfulaPrefix, Data: []byte("spore:floor\x00")}, {Type: nfulaPayload, Data: pkt6}})
	if !ok || d.Rule != "floor" || d.Proto != 6 || d.Dst != netip.MustParseAddrPort("[2001:2::5]:443") || d.SrcPort != 40000 {
		t.Fatalf("parsed IPv6 %+v %v", d, ok)
	}
	icmp6 := append([]byte(nil), pkt6[:40]...)
	icmp6[6] = unix.IPPROTO_ICMPV6
	if p, dst, _, ok := parseIPv6(icmp6); !ok || p != unix.IPPROTO_ICMPV6 || dst.Port() != 0 || dstString(p, dst.Addr(), dst.Port()) != "2001:2::5" {
		t.Fatalf("icmpv6: %d %v %v", p, dst, ok)
	}
	for _, bad := range [][]byte{pkt6[:39], append([]byte{0x40}, pkt6[1:]...)} {
		if _, _, _, ok := parseIPv6(bad); ok {
			t.Errorf("parsed a bad IPv6 packet %x", bad)
		}
	}
}

package dnsfwd_test

import (
	"bytes"
	"encoding/binary"
	"io"
	"net"
	"net/netip"
	"sync/atomic"
	"testing"
	"time"

	"github.com/spore-run/spore/internal/dnsfwd"
	"github.com/spore-run/spore/internal/dnsfwd/dnstest"
)

const typeA = 1

// listenPair opens UDP and TCP on one loopback port (DNS serves both on
// the same port).
func listenPair(t *testing.T) (*net.UDPConn, net.Listener, netip.AddrPort) {
	t.Helper()
	u, l, err := dnsfwd.Listen(netip.AddrFrom4([4]byte{127, 0, 0, 1}), 0)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { u.Close(); l.Close() })
	ap := u.LocalAddr().(*net.UDPAddr).AddrPort()
	return u, l, netip.AddrPortFrom(ap.Addr().Unmap(), ap.Port())
}

func upstream(t *testing.T, names map[string]netip.Addr) (*dnstest.Server, netip.AddrPort) {
	u, l, ap := listenPair(t)
	s := dnstest.Serve(u, l, names)
	t.Cleanup(s.Close)
	return s, ap
}

func forwarder(t *testing.T, cfg dnsfwd.Config) netip.AddrPort {
	t.Helper()
	u, l, ap := listenPair(t)
	f, err := dnsfwd.Serve(cfg, u, l)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { f.Close() })
	return ap
}

func always(v dnsfwd.Verdict) func(netip.Addr) dnsfwd.Verdict {
	return func(netip.Addr) dnsfwd.Verdict { return v }
}

// askUDP sends q and returns the answer, or nil when none comes within
// wait.
func askUDP(t *testing.T, to netip.AddrPort, q []byte, wait time.Duration) []byte {
	t.Helper()
	c, err := net.DialUDP("udp", nil, net.UDPAddrFromAddrPort(to))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	c.SetDeadline(time.Now().Add(wait))
	if _, err := c.Write(q); err != nil {
		t.Fatal(err)
	}
	buf := make([]byte, 65535)
	n, err := c.Read(buf)
	if err != nil {
		return nil
	}
	return buf[:n]
}

func askTCP(t *testing.T, c net.Conn, q []byte) []byte {
	t.Helper()
	c.SetDeadline(time.Now().Add(10 * time.Second))
	if _, err := c.Write(append(binary.BigEndian.AppendUint16(nil, uint16(len(q))), q...)); err != nil {
		t.Fatal(err)
	}
	var l [2]byte
	if _, err := io.ReadFull(c, l[:]); err != nil {
		t.Fatal(err)
	}
	resp := make([]byte, binary.BigEndian.Uint16(l[:]))
	if _, err := io.ReadFull(c, resp); err != nil {
		t.Fatal(err)
	}
	return resp
}

var testAddr = netip.MustParseAddr("198.18.7.7")

func TestForwardsOverUDPAndTCP(t *testing.T) {
	_, up := upstream(t, map[string]netip.Addr{"myname.test": testAddr})
	fwd := forwarder(t, dnsfwd.Config{Upstreams: []netip.AddrPort{up}, Policy: always(dnsfwd.Forward)})

	resp := askUDP(t, fwd, dnsfwd.Query(0x1234, "MyName.test", typeA), 10*time.Second)
	if a, ok := dnstest.AnswerAddr(resp); !ok || a != testAddr || dnsfwd.ID(resp) != 0x1234 {
		t.Fatalf("udp answer %x: %v %v", resp, a, ok)
	}
	if resp := askUDP(t, fwd, dnsfwd.Query(7, "other.test", typeA), 10*time.Second); dnsfwd.Rcode(resp) != dnsfwd.RcodeNXDomain {
		t.Fatalf("unknown name: rcode %d", dnsfwd.Rcode(resp))
	}
	c, err := net.Dial("tcp", fwd.String())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	for id := range uint16(3) { // several queries on one connection
		resp := askTCP(t, c, dnsfwd.Query(id, "myname.test", typeA))
		if a, ok := dnstest.AnswerAddr(resp); !ok || a != testAddr || dnsfwd.ID(resp) != id {
			t.Fatalf("tcp answer %d %x", id, resp)
		}
	}
}

// A refused client gets REFUSED with its question, at once, and nothing
// reaches the upstream; a dropped one gets nothing.
func TestRefuseAndDrop(t *testing.T) {
	srv, up := upstream(t, map[string]netip.Addr{"myname.test": testAddr})
	var verdict atomic.Int32
	verdict.Store(int32(dnsfwd.Refuse))
	fwd := forwarder(t, dnsfwd.Config{Upstreams: []netip.AddrPort{up}, Policy: func(netip.Addr) dnsfwd.Verdict { return dnsfwd.Verdict(verdict.Load()) }})
	q := dnsfwd.Query(42, "myname.test", typeA)
	resp := askUDP(t, fwd, q, 10*time.Second)
	if dnsfwd.Rcode(resp) != dnsfwd.RcodeRefused || dnsfwd.ID(resp) != 42 || !bytes.Equal(resp[12:], q[12:]) || resp[2]&0x80 == 0 {
		t.Fatalf("refused answer %x", resp)
	}
	c, err := net.Dial("tcp", fwd.String())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if resp := askTCP(t, c, q); dnsfwd.Rcode(resp) != dnsfwd.RcodeRefused {
		t.Fatalf("tcp refused: rcode %d", dnsfwd.Rcode(resp))
	}
	// The policy is asked per query: the same connection forwards once
	// the client may resolve.
	verdict.Store(int32(dnsfwd.Forward))
	if a, ok := dnstest.AnswerAddr(askTCP(t, c, q)); !ok || a != testAddr {
		t.Fatal("tcp query after the policy allowed it was not forwarded")
	}
	if n := srv.Queries(); n != 1 {
		t.Fatalf("upstream saw %d queries, want 1 (refused ones must not reach it)", n)
	}
	verdict.Store(int32(dnsfwd.Drop))
	if resp := askUDP(t, fwd, q, 300*time.Millisecond); resp != nil {
		t.Fatalf("dropped client got an answer: %x", resp)
	}
}

// Only the configured upstream is ever asked: nothing in a query chooses
// the server.
func TestOnlyTheUpstream(t *testing.T) {
	other, _ := upstream(t, map[string]netip.Addr{"elsewhere.test": testAddr})
	srv, up := upstream(t, nil)
	fwd := forwarder(t, dnsfwd.Config{Upstreams: []netip.AddrPort{up}, Policy: always(dnsfwd.Forward)})
	if resp := askUDP(t, fwd, dnsfwd.Query(1, "elsewhere.test", typeA), 10*time.Second); dnsfwd.Rcode(resp) != dnsfwd.RcodeNXDomain {
		t.Fatalf("rcode %d", dnsfwd.Rcode(resp))
	}
	if other.Queries() != 0 || srv.Queries() != 1 {
		t.Fatalf("queries: other %d, upstream %d", other.Queries(), srv.Queries())
	}
}

// A silent upstream yields SERVFAIL; the next upstream is tried first;
// past MaxInFlight a query fails at once instead of queueing.
func TestUpstreamFailures(t *testing.T) {
	silentUpstream := func() (*net.UDPConn, netip.AddrPort) {
		c, err := net.ListenUDP("udp", &net.UDPAddr{IP: net.IPv4(127, 0, 0, 1)})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { c.Close() })
		return c, c.LocalAddr().(*net.UDPAddr).AddrPort()
	}
	_, silentAP := silentUpstream()
	_, up := upstream(t, map[string]netip.Addr{"myname.test": testAddr})

	fwd := forwarder(t, dnsfwd.Config{Upstreams: []netip.AddrPort{silentAP, up}, Policy: always(dnsfwd.Forward), Timeout: 200 * time.Millisecond})
	if a, ok := dnstest.AnswerAddr(askUDP(t, fwd, dnsfwd.Query(1, "myname.test", typeA), 10*time.Second)); !ok || a != testAddr {
		t.Fatal("second upstream not asked after the first timed out")
	}

	silent, silentAP := silentUpstream()
	one := forwarder(t, dnsfwd.Config{Upstreams: []netip.AddrPort{silentAP}, Policy: always(dnsfwd.Forward), Timeout: 3 * time.Second, MaxInFlight: 1})
	first := make(chan []byte)
	go func() {
		c, _ := net.DialUDP("udp", nil, net.UDPAddrFromAddrPort(one))
		defer c.Close()
		c.SetDeadline(time.Now().Add(10 * time.Second))
		c.Write(dnsfwd.Query(1, "a.test", typeA))
		buf := make([]byte, 512)
		n, _ := c.Read(buf)
		first <- buf[:n]
	}()
	// Wait until the first query is held by the silent upstream.
	buf := make([]byte, 512)
	silent.SetReadDeadline(time.Now().Add(10 * time.Second))
	if _, _, err := silent.ReadFrom(buf); err != nil {
		t.Fatal(err)
	}
	if resp := askUDP(t, one, dnsfwd.Query(2, "b.test", typeA), 2*time.Second); dnsfwd.Rcode(resp) != dnsfwd.RcodeServFail || dnsfwd.ID(resp) != 2 {
		t.Fatalf("query past the in-flight bound: %x", resp)
	}
	if resp := <-first; dnsfwd.Rcode(resp) != dnsfwd.RcodeServFail || dnsfwd.ID(resp) != 1 {
		t.Fatalf("query to a silent upstream: %x", resp)
	}
}

// Responses sent to the forwarder are not forwarded (no loops, no
// poisoning through it).
func TestIgnoresResponses(t *testing.T) {
	srv, up := upstream(t, nil)
	fwd := forwarder(t, dnsfwd.Config{Upstreams: []netip.AddrPort{up}, Policy: always(dnsfwd.Forward)})
	resp := dnsfwd.Reply(dnsfwd.Query(1, "x.test", typeA), 0)
	if got := askUDP(t, fwd, resp, 300*time.Millisecond); got != nil {
		t.Fatalf("answered a response: %x", got)
	}
	if srv.Queries() != 0 {
		t.Fatal("a response was forwarded")
	}
}

func TestReply(t *testing.T) {
	q := dnsfwd.Query(0xbeef, "a.b.test", 28)
	r := dnsfwd.Reply(q, dnsfwd.RcodeRefused)
	if dnsfwd.ID(r) != 0xbeef || dnsfwd.Rcode(r) != dnsfwd.RcodeRefused || r[2]&0x80 == 0 || r[2]&0x01 == 0 || r[3]&0x80 == 0 {
		t.Fatalf("header %x", r[:4])
	}
	if name, qtype, ok := dnsfwd.Question(r); !ok || name != "a.b.test" || qtype != 28 {
		t.Fatalf("question %q %d %v", name, qtype, ok)
	}
	// A query with an EDNS record: the reply keeps the question only.
	withOpt := append(bytes.Clone(q), 0, 0, 41, 4, 0, 0, 0, 0, 0, 0, 0)
	binary.BigEndian.PutUint16(withOpt[10:], 1)
	if r := dnsfwd.Reply(withOpt, dnsfwd.RcodeServFail); len(r) != len(q) || binary.BigEndian.Uint16(r[10:]) != 0 {
		t.Fatalf("reply to an EDNS query: %x", r)
	}
	// A question that runs off the end: the header alone.
	if r := dnsfwd.Reply(q[:15], dnsfwd.RcodeServFail); len(r) != 12 || binary.BigEndian.Uint16(r[4:]) != 0 {
		t.Fatalf("reply to a truncated query: %x", r)
	}
	if dnsfwd.Reply(q[:5], 0) != nil {
		t.Fatal("reply to less than a header")
	}
}

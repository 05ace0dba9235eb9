package egress

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// testProxy serves sandboxes on loopback listeners: no gateway redirects
// their connections, so each listener's connections are taken as headed
// for the destination it was served with.
type testProxy struct {
	*Proxy
	mu     sync.Mutex
	dsts   map[string]netip.AddrPort // by listener address
	audits []Record
}

func newTestProxy(t testing.TB, cfg Config) *testProxy {
	tp := &testProxy{dsts: map[string]netip.AddrPort{}}
	cfg.Audit = func(_ string, r Record) {
		tp.mu.Lock()
		tp.audits = append(tp.audits, r)
		tp.mu.Unlock()
	}
	tp.Proxy = New(cfg)
	tp.origDst = func(c *net.TCPConn) (netip.AddrPort, error) {
		tp.mu.Lock()
		defer tp.mu.Unlock()
		return tp.dsts[c.LocalAddr().String()], nil
	}
	t.Cleanup(func() { tp.Close() })
	return tp
}

// serve serves instance with r; its connections are headed for dst. It
// returns the address the sandbox dials.
func (tp *testProxy) serve(t testing.TB, instance string, r Rules, dst netip.AddrPort) string {
	t.Helper()
	l, err := net.Listen("tcp4", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	tp.mu.Lock()
	tp.dsts[l.Addr().String()] = dst
	tp.mu.Unlock()
	tp.Serve(instance, r, l)
	return l.Addr().String()
}

// audited waits for an audit record that ok accepts.
func (tp *testProxy) audited(t *testing.T, what string, ok func(Record) bool) Record {
	t.Helper()
	for deadline := time.Now().Add(10 * time.Second); time.Now().Before(deadline); time.Sleep(10 * time.Millisecond) {
		tp.mu.Lock()
		i := slices.IndexFunc(tp.audits, ok)
		var r Record
		if i >= 0 {
			r = tp.audits[i]
		}
		tp.mu.Unlock()
		if i >= 0 {
			return r
		}
	}
	tp.mu.Lock()
	defer tp.mu.Unlock()
	t.Fatalf("no audit record for %s in %+v", what, tp.audits)
	return Record{}
}

// upstream is a test server that counts its connections and serves each
// with handle (default: echo until the client half-closes).
type upstream struct {
	l       net.Listener
	accepts atomic.Int64
}

func newUpstream(t testing.TB, addr string, handle func(net.Conn)) *upstream {
	t.Helper()
	l, err := net.Listen("tcp4", addr)
	if err != nil {
		t.Fatal(err)
	}
	if handle == nil {
		handle = func(c net.Conn) { io.Copy(c, c) }
	}
	u := &upstream{l: l}
	go func() {
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			u.accepts.Add(1)
			go func() {
				defer c.Close()
				handle(c)
			}()
		}
	}()
	t.Cleanup(func() { l.Close() })
	return u
}

func (u *upstream) addr() netip.AddrPort { return netip.MustParseAddrPort(u.l.Addr().String()) }

// echoed writes msg on c and says whether it comes back (through the
// proxy to an echoing upstream) within 10 s.
func echoed(c net.Conn, msg []byte) bool {
	c.SetDeadline(time.Now().Add(10 * time.Second))
	defer c.SetDeadline(time.Time{})
	if _, err := c.Write(msg); err != nil {
		return false
	}
	got := make([]byte, len(msg))
	_, err := io.ReadFull(c, got)
	return err == nil && bytes.Equal(got, msg)
}

// refused says whether the proxy ended c without an answer (a reset or a
// close), rather than leaving it hanging for 10 s.
func refused(c net.Conn) bool {
	c.SetReadDeadline(time.Now().Add(10 * time.Second))
	n, err := c.Read(make([]byte, 1))
	return n == 0 && err != nil && !errors.Is(err, os.ErrDeadlineExceeded)
}

func dial(t *testing.T, addr string) net.Conn {
	t.Helper()
	c, err := net.Dial("tcp4", addr)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

// An allowed name whose DNS answer holds floor addresses is never dialled
// there: an answer of floor addresses only is refused (reason resolve),
// and of a floor and a public address reaches the public one only. The
// floor here is 127.0.0.2 (an upstream listens there too, to see a
// dial), the public address 127.0.0.1, the sandbox's destination a third.
func TestResolvedFloorAddressesNeverDialled(t *testing.T) {
	public := newUpstream(t, "127.0.0.1:0", nil)
	port := public.addr().Port()
	floorUp := newUpstream(t, netip.AddrPortFrom(netip.MustParseAddr("127.0.0.2"), port).String(), nil)
	floorAddr, publicAddr := netip.MustParseAddr("127.0.0.2"), netip.MustParseAddr("127.0.0.1")
	answers := map[string][]netip.Addr{"floor.allowed.test": {floorAddr}, "mixed.allowed.test": {floorAddr, publicAddr}}
	tp := newTestProxy(t, Config{Resolve: func(_ context.Context, name string) ([]netip.Addr, error) {
		return slices.Clone(answers[name]), nil
	}})
	rules := Rules{AllowDomains: []string{"*.allowed.test"}, Floor: []netip.Prefix{netip.PrefixFrom(floorAddr, 32)}}
	dst := netip.AddrPortFrom(netip.MustParseAddr("198.51.100.7"), port)
	addr := tp.serve(t, "i-floor", rules, dst)

	c := dial(t, addr)
	c.Write(clientHello(t, "floor.allowed.test", nil))
	if !refused(c) {
		t.Error("a name resolving to the floor only was not refused")
	}
	if n := floorUp.accepts.Load(); n != 0 {
		t.Fatalf("the proxy dialled the floor address (answer of the floor only) %d times", n)
	}
	tp.audited(t, "the floor-only name", func(r Record) bool {
		return r.Domain == "floor.allowed.test" && !r.Allowed && r.Reason == "resolve"
	})

	c = dial(t, addr)
	hello := clientHello(t, "mixed.allowed.test", nil)
	if !echoed(c, hello) {
		t.Error("a name resolving to a floor and a public address did not reach the public one")
	}
	c.Close()
	r := tp.audited(t, "the mixed name", func(r Record) bool { return r.Domain == "mixed.allowed.test" })
	if r.Upstream != netip.AddrPortFrom(publicAddr, port) || !r.Allowed {
		t.Errorf("mixed answer: %+v", r)
	}
	if n := floorUp.accepts.Load(); n != 0 {
		t.Fatalf("the proxy dialled the floor address (mixed answer) %d times", n)
	}
	if n := public.accepts.Load(); n != 1 {
		t.Fatalf("the public address was dialled %d times, want 1", n)
	}
	// The totals (metrics) count both, and the relayed bytes.
	tot := tp.Totals()
	if tot.Connections["resolve"] != 1 || tot.Connections["allowed"] != 1 || tot.BytesOut != int64(len(hello)) || tot.BytesIn != int64(len(hello)) {
		t.Fatalf("totals = %+v, want 1 refused (resolve), 1 allowed, %d bytes each way", tot, len(hello))
	}
}

// Totals count each final record once: allowed or by the refusal's
// reason, injections and host mismatches, bytes both ways.
func TestTotalsCount(t *testing.T) {
	p := &Proxy{}
	for _, r := range []Record{
		{Allowed: true, BytesOut: 10, BytesIn: 100},
		{Allowed: true, Injected: true, BytesOut: 5, BytesIn: 7},
		{Allowed: true, Injected: true, Reason: "host-mismatch", BytesOut: 1},
		{Reason: "deny"}, {Reason: "deny"}, {Reason: "floor"}, {},
	} {
		p.totals.count(r)
	}
	got := p.Totals()
	want := map[string]int64{"allowed": 3, "deny": 3, "floor": 1}
	if fmt.Sprint(got.Connections) != fmt.Sprint(want) || got.Injected != 2 || got.HostMismatch != 1 || got.BytesOut != 16 || got.BytesIn != 107 {
		t.Fatalf("totals = %+v", got)
	}
	got.Connections["deny"] = 0 // a copy: the proxy's stay
	if p.Totals().Connections["deny"] != 3 {
		t.Fatal("Totals returned the proxy's own map")
	}
}

// A sandbox holds at most MaxConnsPerSandbox connections through the
// proxy: the next one is reset at once (reason limit) while another
// sandbox's is served, and a connection that ends makes room.
func TestConnLimitPerSandbox(t *testing.T) {
	const limit = 3
	up := newUpstream(t, "127.0.0.1:0", nil)
	tp := newTestProxy(t, Config{MaxConnsPerSandbox: limit})
	a := tp.serve(t, "i-a", Rules{Internet: true}, up.addr())
	b := tp.serve(t, "i-b", Rules{Internet: true}, up.addr())
	var held []net.Conn
	for i := range limit {
		c := dial(t, a)
		if !echoed(c, []byte{'a', byte('0' + i)}) {
			t.Fatalf("connection %d of %d not served", i+1, limit)
		}
		held = append(held, c)
	}
	// Reset at once: even the dial may see it.
	if over, err := net.Dial("tcp4", a); err == nil {
		defer over.Close()
		over.Write([]byte("over"))
		if !refused(over) {
			t.Fatal("the connection over the cap was not refused")
		}
	}
	tp.audited(t, "the connection over the cap", func(r Record) bool { return !r.Allowed && r.Reason == "limit" })
	if !echoed(dial(t, b), []byte("b")) {
		t.Fatal("another sandbox's connection was not served while the first is at its cap")
	}
	for i, c := range held {
		if !echoed(c, []byte("still")) {
			t.Fatalf("held connection %d broke", i)
		}
	}
	held[0].Close()
	served := false
	for deadline := time.Now().Add(10 * time.Second); !served && time.Now().Before(deadline); time.Sleep(20 * time.Millisecond) {
		if c, err := net.Dial("tcp4", a); err == nil {
			served = echoed(c, []byte("room"))
			c.Close()
		}
	}
	if !served {
		t.Fatal("a closed connection made no room")
	}
}

// A relayed connection that moves no byte either way for IdleTimeout is
// closed both ways (reason idle); one that keeps talking, and one whose
// bytes only come from the upstream (a download: the sandbox's side
// reads nothing), stay up well past it.
func TestIdleRelayClosed(t *testing.T) {
	const idle = 300 * time.Millisecond
	up := newUpstream(t, "127.0.0.1:0", func(c net.Conn) {
		first := make([]byte, 1)
		if _, err := io.ReadFull(c, first); err != nil {
			return
		}
		if first[0] != 's' {
			c.Write(first)
			io.Copy(c, c)
			return
		}
		for { // stream a byte every 20 ms
			if _, err := c.Write([]byte{'.'}); err != nil {
				return
			}
			time.Sleep(20 * time.Millisecond)
		}
	})
	tp := newTestProxy(t, Config{IdleTimeout: idle})
	addr := tp.serve(t, "i-idle", Rules{Internet: true}, up.addr())

	quiet, talker, download := dial(t, addr), dial(t, addr), dial(t, addr)
	if !echoed(quiet, []byte("q")) || !echoed(talker, []byte("t")) {
		t.Fatal("not served")
	}
	download.Write([]byte("s"))
	var wg sync.WaitGroup
	var talkErr, downloadErr error
	wg.Go(func() {
		for end := time.Now().Add(4 * idle); time.Now().Before(end); time.Sleep(20 * time.Millisecond) {
			if !echoed(talker, []byte("x")) {
				talkErr = errors.New("the talking connection broke")
				return
			}
		}
	})
	wg.Go(func() {
		buf := make([]byte, 64)
		for end := time.Now().Add(4 * idle); time.Now().Before(end); {
			download.SetReadDeadline(time.Now().Add(10 * time.Second))
			if _, err := download.Read(buf); err != nil {
				downloadErr = err
				return
			}
		}
	})
	if !refused(quiet) {
		t.Error("the idle connection was not closed")
	}
	wg.Wait()
	if talkErr != nil || downloadErr != nil {
		t.Fatalf("active connections: talker %v, download %v", talkErr, downloadErr)
	}
	tp.audited(t, "the idle connection", func(r Record) bool { return r.Allowed && r.Reason == "idle" && r.BytesOut == 1 })
	// Silent now, the talker goes too.
	if !refused(talker) {
		t.Error("the talker, silent, was not closed")
	}
}

// BenchmarkSandboxDescriptors: a sandbox opens 10,000 connections through
// the proxy and holds them, silent, to an upstream that holds them too
// (both Python processes, so that this process holds the proxy's
// descriptors only); proxy-fds is the descriptors the proxy then holds
// beyond those it held before, relayed the connections it relays. A
// silent relayed connection holds six: its two sockets and a splice pipe
// (two descriptors) for each direction waiting in io.Copy. Uncapped
// (MaxConnsPerSandbox above 10,000: the proxy before the cap) the
// process's RLIMIT_NOFILE stops it first.
//
//	go test -run '^$' -bench SandboxDescriptors -benchtime 1x ./internal/egress/
func BenchmarkSandboxDescriptors(b *testing.B) {
	const conns = 10000
	for _, c := range []struct {
		name  string
		limit int
	}{{"cap=" + strconv.Itoa(DefaultMaxConnsPerSandbox), 0}, {"uncapped", 2 * conns}} {
		b.Run(c.name, func(b *testing.B) {
			for range b.N {
				fds, relayed := sandboxDescriptors(b, conns, c.limit)
				b.ReportMetric(float64(fds), "proxy-fds")
				b.ReportMetric(float64(relayed), "relayed")
			}
		})
	}
}

// holder is the sandbox and the upstream of BenchmarkSandboxDescriptors.
// "serve": listen on loopback, print the port, hold every connection.
// "open HOST PORT N": once a line comes on stdin, open N connections,
// write a byte on each, hold them, print how many opened (stopping after
// 20 connects in a row that time out: a listener no longer accepting).
// Both hold until stdin closes.
const holder = `import socket, sys, threading
held = []
if sys.argv[1] == "serve":
    l = socket.socket()
    l.bind(("127.0.0.1", 0))
    l.listen(4096)
    print(l.getsockname()[1], flush=True)
    def loop():
        while True:
            try:
                held.append(l.accept()[0])
            except OSError:
                pass
    threading.Thread(target=loop, daemon=True).start()
else:
    sys.stdin.readline()
    stuck = 0
    for i in range(int(sys.argv[4])):
        s = socket.socket()
        s.settimeout(2)
        try:
            s.connect((sys.argv[2], int(sys.argv[3])))
            s.send(b"x")
            held.append(s)
            stuck = 0
        except OSError as e:
            s.close()
            stuck = stuck + 1 if isinstance(e, socket.timeout) else 0
            if stuck == 20:
                break
    print(len(held), flush=True)
sys.stdin.read()
`

// startHolder runs holder with args; the number it prints is read by
// calling the function returned, after a line to its stdin.
func startHolder(b *testing.B, args ...string) func() int {
	cmd := exec.Command("python3", append([]string{"-c", holder}, args...)...)
	stdin, _ := cmd.StdinPipe()
	out, _ := cmd.StdoutPipe()
	cmd.Stderr = os.Stderr
	if err := cmd.Start(); err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() {
		stdin.Close()
		cmd.Wait()
	})
	return func() int {
		io.WriteString(stdin, "go\n")
		var n int
		if _, err := fmt.Fscan(out, &n); err != nil {
			b.Fatalf("holder %v: %v", args, err)
		}
		return n
	}
}

func sandboxDescriptors(b *testing.B, conns, limit int) (fds, relayed int) {
	port := startHolder(b, "serve")()
	tp := newTestProxy(b, Config{MaxConnsPerSandbox: limit})
	addr := netip.MustParseAddrPort(tp.serve(b, "i-many", Rules{Internet: true}, netip.AddrPortFrom(netip.MustParseAddr("127.0.0.1"), uint16(port))))
	dir, err := os.Open("/proc/self/fd") // opened now: at the limit no open would work
	if err != nil {
		b.Fatal(err)
	}
	defer dir.Close()
	count := func() int {
		dir.Seek(0, io.SeekStart)
		names, err := dir.Readdirnames(-1)
		if err != nil {
			b.Fatal(err)
		}
		return len(names)
	}
	open := startHolder(b, "open", addr.Addr().String(), strconv.Itoa(int(addr.Port())), strconv.Itoa(conns))
	base := count()
	opened := open()
	// Settled: the count holds still for a second.
	for last, still := -1, 0; still < 10; time.Sleep(100 * time.Millisecond) {
		n := count()
		if n == last {
			still++
		} else {
			last, still = n, 0
		}
	}
	fds = count() - base
	tp.Proxy.mu.Lock()
	sb := tp.sbs["i-many"]
	tp.Proxy.mu.Unlock()
	sb.mu.Lock()
	relayed = sb.open[1]
	sb.mu.Unlock()
	b.Logf("the sandbox opened %d of %d connections", opened, conns)
	return fds, relayed
}

// failingListener fails its first accepts as a process out of
// descriptors does, then accepts for real.
type failingListener struct {
	net.Listener
	fails atomic.Int32
}

func (l *failingListener) Accept() (net.Conn, error) {
	if l.fails.Add(-1) >= 0 {
		return nil, &net.OpError{Op: "accept", Net: "tcp", Err: os.NewSyscallError("accept4", unix.EMFILE)}
	}
	return l.Listener.Accept()
}

// A listener that runs out of descriptors (EMFILE) keeps being served once
// they are back: the accept loop waits and retries instead of ending.
func TestAcceptSurvivesEMFILE(t *testing.T) {
	up := newUpstream(t, "127.0.0.1:0", nil)
	tp := newTestProxy(t, Config{})
	l, err := net.Listen("tcp4", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	tp.mu.Lock()
	tp.dsts[l.Addr().String()] = up.addr()
	tp.mu.Unlock()
	fl := &failingListener{Listener: l}
	fl.fails.Store(3)
	tp.Serve("i-emfile", Rules{Internet: true}, fl)
	if !echoed(dial(t, l.Addr().String()), []byte("after EMFILE")) {
		t.Fatal("not served after the listener ran out of descriptors")
	}
}

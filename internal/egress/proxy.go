package egress

import (
	"context"
	"crypto/x509"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"maps"
	"net"
	"net/netip"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"golang.org/x/sys/unix"
)

// ListenPort is the proxy's port in every gateway namespace (each has its
// own; the gateway redirects the sandbox's connections to ports 80 and
// 443 there).
const ListenPort = 15443

// Config configures a Proxy.
type Config struct {
	// Upstreams are the resolvers the proxy asks for the addresses of an
	// allowed name (the node's DNS forwarder's upstreams).
	Upstreams []netip.AddrPort
	// Resolve, when set, replaces the resolver (tests).
	Resolve func(ctx context.Context, name string) ([]netip.Addr, error)
	// PeekTimeout bounds the wait for a client's first bytes (default
	// 10 s): a client that sends nothing is judged without a name.
	PeekTimeout time.Duration
	// RootCAs verify the upstreams of intercepted HTTPS connections (those
	// with an injection); nil: the host's roots.
	RootCAs *x509.CertPool
	// MaxConnsPerSandbox caps the connections of one sandbox the proxy
	// holds at once, intercepted and relayed (default 256): past it a new
	// one is reset at once and audited with reason "limit". The upstream
	// connections the proxy opens for the sandbox are capped at the same
	// number. A relayed connection also holds a splice pipe (two
	// descriptors) for each direction while it waits in io.Copy, so one
	// sandbox holds at most six times that many of the node's descriptors,
	// whatever it opens (BenchmarkSandboxDescriptors: 1,536 at 256).
	MaxConnsPerSandbox int
	// IdleTimeout closes a connection through the proxy (relayed or
	// intercepted) both ways once no byte moved either way for that long
	// (default 10 minutes; checked once per period, so it closes between
	// one and two periods after its last byte).
	IdleTimeout time.Duration
	// Audit, when set, gets each connection's record once it is final
	// (refused, failed, or ended with its bytes), with the instance.
	Audit  func(instance string, r Record)
	Logger *slog.Logger
}

// Defaults of Config.
const (
	DefaultMaxConnsPerSandbox = 256
	DefaultIdleTimeout        = 10 * time.Minute
)

// Proxy serves the listeners of every sandbox with domain rules.
type Proxy struct {
	cfg     Config
	resolve func(ctx context.Context, name string) ([]netip.Addr, error)
	mu      sync.Mutex
	sbs     map[string]*sandbox // by instance
	cache   map[string]cached
	// origDst finds where a redirected connection was headed
	// (OriginalDst; tests without a gateway's redirect replace it).
	origDst func(*net.TCPConn) (netip.AddrPort, error)

	totals totals
}

// totals are what every sandbox's connections through the proxy came to
// since it started (Totals).
type totals struct {
	mu sync.Mutex
	t  Totals
}

// Totals are a proxy's connections since it started, once each was final
// (refused, failed or ended), for metrics.
type Totals struct {
	// Connections by outcome: "allowed", or the refusal's reason
	// ("deny", "floor", "limit", "resolve", "dial", "internet off", ...).
	Connections map[string]int64
	// Injected counts the allowed connections whose requests got an
	// injection's headers; HostMismatch those refused a request naming
	// another host than the TLS server name.
	Injected, HostMismatch int64
	BytesOut, BytesIn      int64 // sandbox -> upstream, upstream -> sandbox
}

// Totals returns the proxy's totals now (a copy).
func (p *Proxy) Totals() Totals {
	p.totals.mu.Lock()
	defer p.totals.mu.Unlock()
	t := p.totals.t
	t.Connections = maps.Clone(t.Connections)
	return t
}

// count adds a final record to the totals.
func (t *totals) count(r Record) {
	outcome := "allowed"
	if !r.Allowed {
		outcome = r.Reason
		if outcome == "" {
			outcome = "deny"
		}
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.t.Connections == nil {
		t.t.Connections = map[string]int64{}
	}
	t.t.Connections[outcome]++
	if r.Injected && r.Allowed {
		t.t.Injected++
	}
	if r.Reason == "host-mismatch" {
		t.t.HostMismatch++
	}
	t.t.BytesOut += r.BytesOut
	t.t.BytesIn += r.BytesIn
}

type cached struct {
	addrs []netip.Addr
	until time.Time
}

// sandbox is one instance's listener, rules, connections and log.
type sandbox struct {
	instance string
	ls       []net.Listener
	rules    atomic.Pointer[Rules]
	log      *ring
	mu       sync.Mutex
	conns    map[net.Conn]bool // true: an upstream connection the proxy opened
	open     [2]int            // len(conns) by side: the sandbox's, upstream
	done     bool
	leaves   leaves // certificates signed for intercepted names
}

// New returns a proxy serving nothing yet.
func New(cfg Config) *Proxy {
	if cfg.PeekTimeout == 0 {
		cfg.PeekTimeout = 10 * time.Second
	}
	if cfg.MaxConnsPerSandbox <= 0 {
		cfg.MaxConnsPerSandbox = DefaultMaxConnsPerSandbox
	}
	if cfg.IdleTimeout <= 0 {
		cfg.IdleTimeout = DefaultIdleTimeout
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	p := &Proxy{cfg: cfg, sbs: map[string]*sandbox{}, cache: map[string]cached{}, origDst: OriginalDst}
	p.resolve = cfg.Resolve
	if p.resolve == nil {
		p.resolve = p.lookup
	}
	return p
}

// Serve takes ls (listeners in the instance's gateway namespace: one per
// address family) and serves them with rules until Stop; earlier
// listeners of the instance are closed. The instance's log is kept
// across.
func (p *Proxy) Serve(instance string, r Rules, ls ...net.Listener) {
	sb := &sandbox{instance: instance, ls: ls, conns: map[net.Conn]bool{}}
	sb.rules.Store(&r)
	p.mu.Lock()
	old := p.sbs[instance]
	if old != nil {
		sb.log = old.log
	} else {
		sb.log = &ring{}
	}
	p.sbs[instance] = sb
	p.mu.Unlock()
	if old != nil {
		old.stop()
	}
	for _, l := range ls {
		go p.accept(instance, sb, l)
	}
}

// Update replaces an instance's rules; connections opened from now on
// are judged by them (open ones keep going).
func (p *Proxy) Update(instance string, r Rules) {
	p.mu.Lock()
	sb := p.sbs[instance]
	p.mu.Unlock()
	if sb != nil {
		sb.rules.Store(&r)
	}
}

// Stop closes an instance's listener and connections and forgets it.
func (p *Proxy) Stop(instance string) {
	p.mu.Lock()
	sb := p.sbs[instance]
	delete(p.sbs, instance)
	p.mu.Unlock()
	if sb != nil {
		sb.stop()
	}
}

// Close stops every instance.
func (p *Proxy) Close() error {
	p.mu.Lock()
	sbs := p.sbs
	p.sbs = map[string]*sandbox{}
	p.mu.Unlock()
	for _, sb := range sbs {
		sb.stop()
	}
	return nil
}

// Log returns an instance's recent decisions, oldest first (nil when the
// proxy serves no such instance).
func (p *Proxy) Log(instance string) []Record {
	p.mu.Lock()
	sb := p.sbs[instance]
	p.mu.Unlock()
	if sb == nil {
		return nil
	}
	return sb.log.list()
}

func (sb *sandbox) stop() {
	for _, l := range sb.ls {
		l.Close()
	}
	sb.mu.Lock()
	sb.done = true
	conns := sb.conns
	sb.conns = nil
	sb.mu.Unlock()
	for c := range conns {
		c.Close()
	}
}

// errLimit: the sandbox holds Config.MaxConnsPerSandbox connections on
// that side already.
var errLimit = errors.New("egress: the sandbox's connection limit")

// track adds c to the sandbox's set (upstream: a connection the proxy
// opened for it), so that stop closes it: net.ErrClosed when the sandbox
// has stopped, errLimit when it holds limit connections on that side.
func (sb *sandbox) track(c net.Conn, upstream bool, limit int) error {
	side := sideOf(upstream)
	sb.mu.Lock()
	defer sb.mu.Unlock()
	switch {
	case sb.done:
		return net.ErrClosed
	case sb.open[side] >= limit:
		return errLimit
	}
	sb.conns[c] = upstream
	sb.open[side]++
	return nil
}

func (sb *sandbox) untrack(c net.Conn) {
	sb.mu.Lock()
	if upstream, ok := sb.conns[c]; ok {
		delete(sb.conns, c)
		sb.open[sideOf(upstream)]--
	}
	sb.mu.Unlock()
}

func sideOf(upstream bool) int {
	if upstream {
		return 1
	}
	return 0
}

func (p *Proxy) accept(instance string, sb *sandbox, l net.Listener) {
	var backoff time.Duration
	for {
		c, err := l.Accept()
		switch {
		case err == nil:
			backoff = 0
			go p.handle(sb, c.(*net.TCPConn))
		case errors.Is(err, net.ErrClosed):
			return
		case outOfResources(err):
			// The node is out of descriptors (or memory) for now: wait
			// and accept again, as net/http does; giving up would leave
			// the sandbox's connections unanswered for good.
			if backoff == 0 {
				p.cfg.Logger.Warn("egress proxy: accept: out of resources; retrying", "instance", instance, "err", err)
			}
			backoff = min(max(2*backoff, 5*time.Millisecond), time.Second)
			time.Sleep(backoff)
		default:
			p.cfg.Logger.Warn("egress proxy: accept", "instance", instance, "err", err)
			return
		}
	}
}

// outOfResources says whether an accept failed for want of descriptors
// or memory, which later accepts may find again.
func outOfResources(err error) bool {
	return errors.Is(err, unix.EMFILE) || errors.Is(err, unix.ENFILE) || errors.Is(err, unix.ENOBUFS) || errors.Is(err, unix.ENOMEM)
}

// ip6tSOOriginalDst is IP6T_SO_ORIGINAL_DST (linux/netfilter_ipv6/
// ip6_tables.h): SO_ORIGINAL_DST's IPv6 twin, at level SOL_IPV6.
const ip6tSOOriginalDst = 80

// OriginalDst returns where a redirected connection was headed (the
// gateway's connection tracking keeps it), IPv4 or IPv6 after the
// connection's own family.
func OriginalDst(c *net.TCPConn) (netip.AddrPort, error) {
	raw, err := c.SyscallConn()
	if err != nil {
		return netip.AddrPort{}, err
	}
	if la, ok := c.LocalAddr().(*net.TCPAddr); ok && la.IP.To4() == nil {
		var info *unix.IPv6MTUInfo // its head is a struct sockaddr_in6
		var gerr error
		if err := raw.Control(func(fd uintptr) {
			info, gerr = unix.GetsockoptIPv6MTUInfo(int(fd), unix.IPPROTO_IPV6, ip6tSOOriginalDst)
		}); err != nil {
			return netip.AddrPort{}, err
		}
		if gerr != nil {
			return netip.AddrPort{}, fmt.Errorf("IP6T_SO_ORIGINAL_DST: %w", gerr)
		}
		port := binary.BigEndian.Uint16(binary.NativeEndian.AppendUint16(nil, info.Addr.Port)) // stored in network byte order
		return netip.AddrPortFrom(netip.AddrFrom16(info.Addr.Addr), port), nil
	}
	var m *unix.IPv6Mreq
	var gerr error
	if err := raw.Control(func(fd uintptr) {
		m, gerr = unix.GetsockoptIPv6Mreq(int(fd), unix.IPPROTO_IP, unix.SO_ORIGINAL_DST)
	}); err != nil {
		return netip.AddrPort{}, err
	}
	if gerr != nil {
		return netip.AddrPort{}, fmt.Errorf("SO_ORIGINAL_DST: %w", gerr)
	}
	b := m.Multiaddr // struct sockaddr_in: family, port (big endian), address
	return netip.AddrPortFrom(netip.AddrFrom4([4]byte{b[4], b[5], b[6], b[7]}), uint16(b[2])<<8|uint16(b[3])), nil
}

// reset closes a connection with a TCP reset: the client fails at once
// rather than reading an empty answer.
func reset(c *net.TCPConn) {
	c.SetLinger(0)
	c.Close()
}

func (p *Proxy) handle(sb *sandbox, c *net.TCPConn) {
	if err := sb.track(c, false, p.cfg.MaxConnsPerSandbox); err != nil {
		if !errors.Is(err, errLimit) {
			c.Close()
			return
		}
		// Refused before reading a byte: a sandbox opening connections
		// in a loop costs a descriptor only for the moment of the reset.
		dst, _ := p.origDst(c)
		p.refuse(sb, c, Record{At: time.Now().UTC(), Dst: dst, Reason: "limit"})
		return
	}
	defer sb.untrack(c)
	dst, err := p.origDst(c)
	local, _ := netip.ParseAddrPort(c.LocalAddr().String())
	if err != nil || dst == local {
		reset(c) // not redirected: someone dialled the listener itself
		return
	}
	head, name := p.peek(c, dst.Port())
	rules := sb.rules.Load()
	d := rules.Decide(dst.Addr(), name)
	rec := Record{At: time.Now().UTC(), Dst: dst, Domain: name, Allowed: d.Allow, Reason: d.Reason, Rule: d.Rule}
	if !d.Allow {
		p.refuse(sb, c, rec)
		return
	}
	up := dst
	if d.ByDomain {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		addrs, err := p.resolve(ctx, name)
		cancel()
		addrs = slices.DeleteFunc(addrs, func(a netip.Addr) bool { return inAny(rules.Floor, a) })
		switch {
		case err != nil || len(addrs) == 0:
			rec.Allowed, rec.Reason = false, "resolve"
			p.refuse(sb, c, rec)
			return
		case !slices.Contains(addrs, dst.Addr()):
			// The sandbox asked for a name at an address that is not
			// the name's: go where the name is, never to an address
			// the rules did not allow; in the family the sandbox used
			// when the name has one there.
			up = netip.AddrPortFrom(pickFamily(addrs, dst.Addr().Is6()), dst.Port())
		}
	}
	rec.Upstream = up
	seq := sb.log.add(rec)
	final := func(f func(r *Record)) {
		sb.log.update(seq, f)
		f(&rec)
		p.audit(sb, rec)
	}
	if in := injectionFor(rules.Inject, name); in != nil && rules.CA != nil && isHTTPS(dst.Port(), head) {
		// Headers to inject: the proxy speaks TLS with the sandbox
		// itself (the sandbox trusts its CA) and with the upstream.
		out, inb, reason := p.intercept(sb, c, head, name, dst.Port(), up, in, rules.CA)
		final(func(r *Record) {
			r.BytesOut, r.BytesIn, r.Injected = out, inb, true
			if reason != "" {
				r.Reason = reason
			}
		})
		return
	}
	u, err := net.DialTimeout("tcp", up.String(), 10*time.Second)
	if err != nil {
		final(func(r *Record) { r.Allowed, r.Reason = false, "dial" })
		reset(c)
		return
	}
	if err := sb.track(u, true, p.cfg.MaxConnsPerSandbox); err != nil {
		u.Close()
		if !errors.Is(err, errLimit) {
			c.Close() // the sandbox stopped
			return
		}
		final(func(r *Record) { r.Allowed, r.Reason = false, "limit" })
		reset(c)
		return
	}
	defer sb.untrack(u)
	var out, in atomic.Int64
	if _, err := u.Write(head); err != nil {
		u.Close()
		reset(c)
		return
	}
	out.Add(int64(len(head)))
	idled := relay(c, u.(*net.TCPConn), &out, &in, p.cfg.IdleTimeout)
	final(func(r *Record) {
		r.BytesOut, r.BytesIn = out.Load(), in.Load()
		if idled {
			r.Reason = "idle"
		}
	})
}

// refuse logs and audits a refused connection and resets it.
func (p *Proxy) refuse(sb *sandbox, c *net.TCPConn, rec Record) {
	rec.Allowed = false
	sb.log.add(rec)
	p.audit(sb, rec)
	reset(c)
}

func (p *Proxy) audit(sb *sandbox, r Record) {
	p.totals.count(r)
	if p.cfg.Audit != nil {
		p.cfg.Audit(sb.instance, r)
	}
}

// peek reads the client's first bytes until the name it asks for is
// known (or cannot be), returning them for replay.
func (p *Proxy) peek(c *net.TCPConn, port uint16) ([]byte, string) {
	parse := HTTPHost
	if port != 80 {
		parse = ServerName
	}
	c.SetReadDeadline(time.Now().Add(p.cfg.PeekTimeout))
	defer c.SetReadDeadline(time.Time{})
	buf := make([]byte, 0, 4096)
	for len(buf) < MaxPeek {
		if len(buf) == cap(buf) {
			buf = slices.Grow(buf, len(buf))
		}
		n, err := c.Read(buf[len(buf):min(cap(buf), MaxPeek)])
		buf = buf[:len(buf)+n]
		if n > 0 {
			name, perr := parse(buf)
			if perr == nil {
				return buf, name
			}
			if !errors.Is(perr, ErrNeedMore) {
				return buf, ""
			}
		}
		if err != nil {
			return buf, ""
		}
	}
	return buf, ""
}

// relay copies both ways until both are done, passing half-closes on, or
// until no byte moved either way for idle: then it closes both and
// reports it. io.Copy between the two sockets splices (no copy through
// user space), so the bytes are counted by the kernel's TCP_INFO of the
// sandbox's side, read once per idle period.
func relay(c, u *net.TCPConn, out, in *atomic.Int64, idle time.Duration) (idled bool) {
	w := watchIdle(idle, tcpProgress(c), func() {
		c.Close()
		u.Close()
	})
	var wg sync.WaitGroup
	wg.Add(2)
	go func() {
		defer wg.Done()
		n, _ := io.Copy(u, c)
		out.Add(n)
		u.CloseWrite()
	}()
	go func() {
		defer wg.Done()
		n, _ := io.Copy(c, u)
		in.Add(n)
		c.CloseWrite()
	}()
	wg.Wait()
	c.Close()
	u.Close()
	return w.stop()
}

// pickFamily returns the first of addrs in IPv6 (six) or IPv4, or the
// first of all when none is.
func pickFamily(addrs []netip.Addr, six bool) netip.Addr {
	for _, a := range addrs {
		if a.Is6() == six {
			return a
		}
	}
	return addrs[0]
}

// lookup resolves a name's IPv4 and IPv6 addresses through the
// upstreams, keeping answers for 10 s (each allowed HTTPS connection
// would otherwise cost a lookup).
func (p *Proxy) lookup(ctx context.Context, name string) ([]netip.Addr, error) {
	p.mu.Lock()
	e, ok := p.cache[name]
	p.mu.Unlock()
	if ok && time.Now().Before(e.until) {
		return slices.Clone(e.addrs), nil
	}
	if len(p.cfg.Upstreams) == 0 {
		return nil, errors.New("egress: no DNS upstream")
	}
	r := &net.Resolver{PreferGo: true, Dial: func(ctx context.Context, network, _ string) (net.Conn, error) {
		var d net.Dialer
		var err error
		for _, up := range p.cfg.Upstreams {
			var c net.Conn
			if c, err = d.DialContext(ctx, network, up.String()); err == nil {
				return c, nil
			}
		}
		return nil, err
	}}
	addrs, err := r.LookupNetIP(ctx, "ip", name+".")
	if err != nil {
		return nil, err
	}
	for i := range addrs {
		addrs[i] = addrs[i].Unmap()
	}
	p.mu.Lock()
	if len(p.cache) > 4096 {
		clear(p.cache)
	}
	p.cache[name] = cached{addrs: addrs, until: time.Now().Add(10 * time.Second)}
	p.mu.Unlock()
	return slices.Clone(addrs), nil
}

// Package dnsfwd is the node's DNS forwarder for sandboxes: it takes
// queries over UDP and TCP, asks a policy whether their source may
// resolve names, and passes allowed queries byte for byte to the
// operator's upstream resolvers, and only to those: the query's own
// destination is never used, so no name can be turned into a way past the
// egress rules. Refused queries are answered REFUSED at once, and a query
// no upstream answers gets SERVFAIL, so resolvers inside sandboxes fail
// fast instead of timing out.
package dnsfwd

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/netip"
	"sync"
	"time"
)

// Verdict is what the forwarder does with a query.
type Verdict int

const (
	// Drop ignores the query (not from a client the forwarder serves).
	Drop Verdict = iota
	// Refuse answers REFUSED.
	Refuse
	// Forward passes the query to the upstream.
	Forward
)

// Config configures a forwarder.
type Config struct {
	// Upstreams are asked in order until one answers. None: every allowed
	// query gets SERVFAIL.
	Upstreams []netip.AddrPort
	// Policy decides on each query by its source address. Required.
	Policy func(src netip.Addr) Verdict
	// Timeout is how long one upstream gets to answer (default 2s).
	Timeout time.Duration
	// MaxInFlight bounds the UDP queries being forwarded plus the TCP
	// connections being served (default 512): past it UDP queries get
	// SERVFAIL and TCP connections are closed, so a flood costs neither
	// unbounded goroutines nor file descriptors.
	MaxInFlight int
	// IdleTimeout closes a quiet TCP connection (default 10s).
	IdleTimeout time.Duration
	Logger      *slog.Logger
}

// Forwarder serves DNS on a UDP socket and a TCP listener.
type Forwarder struct {
	cfg  Config
	udp  net.PacketConn
	tcp  net.Listener
	sem  chan struct{}
	wg   sync.WaitGroup
	done chan struct{}

	mu    sync.Mutex
	conns map[net.Conn]struct{}
}

// Serve starts serving on udp and tcp (either may be nil) and returns at
// once; Close stops it.
func Serve(cfg Config, udp net.PacketConn, tcp net.Listener) (*Forwarder, error) {
	if cfg.Policy == nil {
		return nil, errors.New("dnsfwd: no policy")
	}
	if cfg.Timeout <= 0 {
		cfg.Timeout = 2 * time.Second
	}
	if cfg.MaxInFlight <= 0 {
		cfg.MaxInFlight = 512
	}
	if cfg.IdleTimeout <= 0 {
		cfg.IdleTimeout = 10 * time.Second
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	f := &Forwarder{cfg: cfg, udp: udp, tcp: tcp, sem: make(chan struct{}, cfg.MaxInFlight), done: make(chan struct{}), conns: map[net.Conn]struct{}{}}
	if udp != nil {
		f.wg.Add(1)
		go f.serveUDP()
	}
	if tcp != nil {
		f.wg.Add(1)
		go f.serveTCP()
	}
	return f, nil
}

// Close stops serving and waits for queries in flight (each is bounded
// by the upstream timeout).
func (f *Forwarder) Close() error {
	select {
	case <-f.done:
		return nil
	default:
	}
	close(f.done)
	var errs []error
	if f.udp != nil {
		errs = append(errs, f.udp.Close())
	}
	if f.tcp != nil {
		errs = append(errs, f.tcp.Close())
	}
	f.mu.Lock()
	for c := range f.conns {
		c.Close()
	}
	f.mu.Unlock()
	f.wg.Wait()
	return errors.Join(errs...)
}

func (f *Forwarder) closing() bool {
	select {
	case <-f.done:
		return true
	default:
		return false
	}
}

func addrOf(a net.Addr) netip.Addr {
	switch a := a.(type) {
	case *net.UDPAddr:
		return a.AddrPort().Addr().Unmap()
	case *net.TCPAddr:
		return a.AddrPort().Addr().Unmap()
	}
	return netip.Addr{}
}

func (f *Forwarder) serveUDP() {
	defer f.wg.Done()
	buf := make([]byte, 65535)
	for {
		n, from, err := f.udp.ReadFrom(buf)
		if err != nil {
			if f.closing() {
				return
			}
			var ne net.Error
			if errors.As(err, &ne) && ne.Timeout() {
				continue
			}
			f.cfg.Logger.Error("dns forwarder: udp read", "err", err)
			return
		}
		q := buf[:n]
		if !isQuery(q) {
			continue
		}
		switch f.cfg.Policy(addrOf(from)) {
		case Drop:
			continue
		case Refuse:
			f.udp.WriteTo(Reply(q, RcodeRefused), from)
			continue
		}
		select {
		case f.sem <- struct{}{}:
		default:
			f.udp.WriteTo(Reply(q, RcodeServFail), from)
			continue
		}
		msg := bytes.Clone(q)
		f.wg.Add(1)
		go func() {
			defer f.wg.Done()
			defer func() { <-f.sem }()
			f.udp.WriteTo(f.exchange(msg, f.exchangeUDP), from)
		}()
	}
}

func (f *Forwarder) serveTCP() {
	defer f.wg.Done()
	for {
		c, err := f.tcp.Accept()
		if err != nil {
			if f.closing() {
				return
			}
			var ne net.Error
			if errors.As(err, &ne) && ne.Timeout() {
				continue
			}
			f.cfg.Logger.Error("dns forwarder: tcp accept", "err", err)
			return
		}
		if f.cfg.Policy(addrOf(c.RemoteAddr())) == Drop {
			c.Close()
			continue
		}
		select {
		case f.sem <- struct{}{}:
		default:
			c.Close()
			continue
		}
		f.mu.Lock()
		f.conns[c] = struct{}{}
		f.mu.Unlock()
		f.wg.Add(1)
		go func() {
			defer f.wg.Done()
			defer func() { <-f.sem }()
			defer func() {
				f.mu.Lock()
				delete(f.conns, c)
				f.mu.Unlock()
				c.Close()
			}()
			f.serveConn(c)
		}()
	}
}

// serveConn answers length-prefixed queries on one TCP connection; the
// policy is asked again for each (it may change while the connection
// idles).
func (f *Forwarder) serveConn(c net.Conn) {
	src := addrOf(c.RemoteAddr())
	for {
		c.SetDeadline(time.Now().Add(f.cfg.IdleTimeout))
		q, err := readMsg(c)
		if err != nil || !isQuery(q) {
			return
		}
		var resp []byte
		switch f.cfg.Policy(src) {
		case Drop:
			return
		case Refuse:
			resp = Reply(q, RcodeRefused)
		default:
			resp = f.exchange(q, f.exchangeTCP)
		}
		c.SetDeadline(time.Now().Add(f.cfg.IdleTimeout))
		if err := writeMsg(c, resp); err != nil {
			return
		}
	}
}

// exchange asks each upstream in turn; SERVFAIL when none answers.
func (f *Forwarder) exchange(q []byte, ask func(netip.AddrPort, []byte) ([]byte, error)) []byte {
	for _, up := range f.cfg.Upstreams {
		resp, err := ask(up, q)
		if err == nil {
			return resp
		}
		f.cfg.Logger.Debug("dns forwarder: upstream failed", "upstream", up, "err", err)
	}
	return Reply(q, RcodeServFail)
}

// exchangeUDP sends q from a fresh socket (a random source port, against
// spoofed answers) and waits for the answer with q's ID.
func (f *Forwarder) exchangeUDP(up netip.AddrPort, q []byte) ([]byte, error) {
	c, err := net.DialUDP("udp", nil, net.UDPAddrFromAddrPort(up))
	if err != nil {
		return nil, err
	}
	defer c.Close()
	c.SetDeadline(time.Now().Add(f.cfg.Timeout))
	if _, err := c.Write(q); err != nil {
		return nil, err
	}
	buf := make([]byte, 65535)
	for {
		n, err := c.Read(buf)
		if err != nil {
			return nil, err
		}
		if n >= headerLen && ID(buf[:n]) == ID(q) && buf[2]&0x80 != 0 {
			return bytes.Clone(buf[:n]), nil
		}
	}
}

func (f *Forwarder) exchangeTCP(up netip.AddrPort, q []byte) ([]byte, error) {
	c, err := net.DialTimeout("tcp", up.String(), f.cfg.Timeout)
	if err != nil {
		return nil, err
	}
	defer c.Close()
	c.SetDeadline(time.Now().Add(f.cfg.Timeout))
	if err := writeMsg(c, q); err != nil {
		return nil, err
	}
	resp, err := readMsg(c)
	if err != nil {
		return nil, err
	}
	if len(resp) < headerLen || ID(resp) != ID(q) {
		return nil, fmt.Errorf("%w: answer does not match the query", errMalformed)
	}
	return resp, nil
}

func readMsg(r io.Reader) ([]byte, error) {
	var l [2]byte
	if _, err := io.ReadFull(r, l[:]); err != nil {
		return nil, err
	}
	msg := make([]byte, binary.BigEndian.Uint16(l[:]))
	if _, err := io.ReadFull(r, msg); err != nil {
		return nil, err
	}
	return msg, nil
}

func writeMsg(w io.Writer, msg []byte) error {
	b := make([]byte, 2+len(msg))
	binary.BigEndian.PutUint16(b, uint16(len(msg)))
	copy(b[2:], msg)
	_, err := w.Write(b)
	return err
}

// Listen opens a DNS server's UDP socket and TCP listener on one port of
// ip (IPv4). Port 0 picks a port free for both: the kernel picks the UDP
// one, and when the TCP port of that number is taken the pick is retried,
// up to 20 times.
func Listen(ip netip.Addr, port uint16) (*net.UDPConn, *net.TCPListener, error) {
	tries := 1
	if port == 0 {
		tries = 20
	}
	var err error
	for range tries {
		var u *net.UDPConn
		u, err = net.ListenUDP("udp4", net.UDPAddrFromAddrPort(netip.AddrPortFrom(ip, port)))
		if err != nil {
			return nil, nil, err
		}
		p := u.LocalAddr().(*net.UDPAddr).AddrPort().Port()
		var t *net.TCPListener
		t, err = net.ListenTCP("tcp4", net.TCPAddrFromAddrPort(netip.AddrPortFrom(ip, p)))
		if err == nil {
			return u, t, nil
		}
		u.Close()
	}
	return nil, nil, fmt.Errorf("no port free for both UDP and TCP on %s: %w", ip, err)
}

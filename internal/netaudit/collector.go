package netaudit

import (
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/netip"
	"os"
	"slices"
	"strconv"
	"sync"
	"time"

	"github.com/mdlayher/netlink"
	"github.com/ti-mo/conntrack"
	"github.com/ti-mo/netfilter"
	"golang.org/x/sys/unix"
)

// Collector gathers one gateway namespace's connection attempts into a
// sandbox's journal (see the package comment).
type Collector struct {
	j       *Journal
	sandbox string
	src     []netip.Addr // the sandbox's addresses (IPv4, IPv6), as the gateway sees them
	gw      []netip.Addr // the gateway's own addresses (traffic to them is not egress)
	log     *slog.Logger
	nsFD    int

	ct     *conntrack.Conn // events
	events chan conntrack.Event
	errs   chan error
	q      *conntrack.Conn // queries (a listening socket takes none)
	nf     *nflogReader
	done   chan struct{}
	wg     sync.WaitGroup
	unreg  func()

	mu     sync.Mutex
	open   map[uint32]Entry     // allowed flows not ended yet, by conntrack ID
	ended  map[uint32]time.Time // TCP flows written at their close, whose DESTROY is still to come
	pruned time.Time

	lastDenied map[string]time.Time // by proto, client port and destination: a SYN's retransmissions are one attempt
}

// deniedWindow is how long after its last packet a dropped attempt's
// repeats (a client's SYN retransmissions, same client port: 1 s, 2 s,
// 4 s ... apart) count as the same attempt.
const deniedWindow = 30 * time.Second

// endedKeep is how long a TCP flow journaled at its close is remembered,
// so that its DESTROY (when the tracking drops it, TIME_WAIT later: 120 s
// by default) is not journaled again.
const endedKeep = 3 * time.Minute

// TCP states of connection tracking (enum tcp_conntrack).
const (
	tcpTimeWait = 7
	tcpClose    = 8
)

// Start begins collecting in the namespace whose descriptor is nsFD (the
// caller keeps it open until Stop) for the sandbox whose address there is
// one of src (one address per family), whose gateway is at one of gw. The
// caller readies the namespace first (PrepareNamespace).
func Start(j *Journal, sandboxID string, nsFD int, src, gw []netip.Addr, log *slog.Logger) (*Collector, error) {
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	// A descriptor of our own: Stop reads the namespace's table again.
	fd, err := unix.Dup(nsFD)
	if err != nil {
		return nil, fmt.Errorf("egress audit: %w", err)
	}
	c := &Collector{j: j, sandbox: sandboxID, src: src, gw: gw, log: log, nsFD: fd, done: make(chan struct{}),
		open: map[uint32]Entry{}, ended: map[uint32]time.Time{}, lastDenied: map[string]time.Time{}}
	ct, err := conntrack.Dial(&netlink.Config{NetNS: fd})
	if err != nil {
		unix.Close(fd)
		return nil, fmt.Errorf("egress audit: conntrack: %w", err)
	}
	if err := ct.SetReadBuffer(1 << 20); err != nil {
		log.Debug("egress audit: conntrack read buffer", "err", err)
	}
	events := make(chan conntrack.Event, 256)
	errs, err := ct.Listen(events, 1, []netfilter.NetlinkGroup{netfilter.GroupCTNew, netfilter.GroupCTUpdate, netfilter.GroupCTDestroy})
	if err != nil {
		ct.Close()
		unix.Close(fd)
		return nil, fmt.Errorf("egress audit: conntrack events: %w", err)
	}
	q, err := conntrack.Dial(&netlink.Config{NetNS: fd})
	if err != nil {
		ct.Close()
		unix.Close(fd)
		return nil, fmt.Errorf("egress audit: conntrack: %w", err)
	}
	nf, err := openNFLOG(fd)
	if err != nil {
		ct.Close()
		q.Close()
		unix.Close(fd)
		return nil, err
	}
	c.ct, c.q, c.nf, c.events, c.errs = ct, q, nf, events, errs
	c.unreg = j.Live(sandboxID, c.openEntries)
	c.wg.Add(3)
	go c.flows(events)
	go func() { // the library's workers block on errors: drain them
		defer c.wg.Done()
		for {
			select {
			case err := <-errs:
				c.log.Warn("egress audit: conntrack events ended", "sandbox_id", sandboxID, "err", err)
			case <-c.done:
				return
			}
		}
	}()
	go c.denials()
	return c, nil
}

// PrepareNamespace readies connection tracking in the calling thread's
// namespace (run it inside the gateway's): byte counters on (a setting of
// that namespace alone).
func PrepareNamespace() error {
	return writeSysctl("/proc/sys/net/netfilter/nf_conntrack_acct", "1")
}

func (c *Collector) flows(events <-chan conntrack.Event) {
	defer c.wg.Done()
	for {
		select {
		case <-c.done:
			return
		case ev := <-events:
			if ev.Flow == nil || !c.ours(ev.Flow) {
				continue
			}
			switch ev.Type {
			case conntrack.EventNew:
				c.mu.Lock()
				c.open[ev.Flow.ID] = flowEntry(ev.Flow, time.Now().UTC())
				c.mu.Unlock()
			case conntrack.EventUpdate:
				// A TCP connection closed (both FINs, or a reset): its
				// tracking entry lingers; its counters are final now.
				if tcp := ev.Flow.ProtoInfo.TCP; tcp == nil || (tcp.State != tcpTimeWait && tcp.State != tcpClose) {
					continue
				}
				c.mu.Lock()
				e, ok := c.open[ev.Flow.ID]
				c.mu.Unlock()
				if !ok {
					continue
				}
				f, err := c.q.Get(*ev.Flow)
				if err != nil {
					// Gone meanwhile: its DESTROY carries the counters.
					c.log.Debug("egress audit: read a closed flow's counters", "sandbox_id", c.sandbox, "err", err)
					continue
				}
				c.mu.Lock()
				_, still := c.open[ev.Flow.ID]
				delete(c.open, ev.Flow.ID)
				if still {
					c.ended[ev.Flow.ID] = time.Now()
				}
				c.mu.Unlock()
				if still {
					c.finish(e, &f, "")
				}
			case conntrack.EventDestroy:
				c.mu.Lock()
				e, ok := c.open[ev.Flow.ID]
				delete(c.open, ev.Flow.ID)
				_, done := c.ended[ev.Flow.ID]
				delete(c.ended, ev.Flow.ID)
				c.mu.Unlock()
				if done {
					continue
				}
				if !ok {
					e = flowEntry(ev.Flow, time.Now().UTC()) // began before the collector
				}
				c.finish(e, ev.Flow, "")
			}
			c.pruneEnded()
		}
	}
}

// finish writes an allowed flow's entry, ended now, with f's counters.
func (c *Collector) finish(e Entry, f *conntrack.Flow, reason string) {
	end := time.Now().UTC()
	e.End, e.Open = &end, false
	e.BytesOut, e.BytesIn = int64(f.CountersOrig.Bytes), int64(f.CountersReply.Bytes)
	if reason != "" {
		e.Reason = reason
	}
	c.append(e)
}

// pruneEnded forgets closed flows whose DESTROY should have come by now.
func (c *Collector) pruneEnded() {
	c.mu.Lock()
	defer c.mu.Unlock()
	if len(c.ended) < 256 && time.Since(c.pruned) < time.Minute {
		return
	}
	c.pruned = time.Now()
	for id, t := range c.ended {
		if time.Since(t) > endedKeep {
			delete(c.ended, id)
		}
	}
}

// ours says whether a flow is one the sandbox opened and the tracking
// should report: not the egress proxy's redirected ones (the proxy
// reports those, with the name), not the gateway's own.
func (c *Collector) ours(f *conntrack.Flow) bool {
	return slices.Contains(c.src, f.TupleOrig.IP.SourceAddress) && !slices.Contains(c.gw, f.TupleOrig.IP.DestinationAddress) && !f.Status.DstNAT()
}

func flowEntry(f *conntrack.Flow, at time.Time) Entry {
	return Entry{At: at, Proto: protoName(f.TupleOrig.Proto.Protocol),
		Dst: dstString(f.TupleOrig.Proto.Protocol, f.TupleOrig.IP.DestinationAddress, f.TupleOrig.Proto.DestinationPort), Allowed: true, Open: true}
}

func (c *Collector) denials() {
	defer c.wg.Done()
	for {
		ds, err := c.nf.next()
		if err != nil {
			select {
			case <-c.done:
			default:
				if !errors.Is(err, net.ErrClosed) {
					c.log.Warn("egress audit: denied connections no longer logged", "sandbox_id", c.sandbox, "err", err)
				}
			}
			return
		}
		now := time.Now().UTC()
		es := make([]Entry, 0, len(ds))
		for _, d := range ds {
			e := Entry{At: now, Proto: protoName(d.Proto), Dst: dstString(d.Proto, d.Dst.Addr(), d.Dst.Port()), Rule: d.Rule, Reason: "denied by rule"}
			key := e.Proto + " " + strconv.Itoa(int(d.SrcPort)) + " " + e.Dst
			last, seen := c.lastDenied[key]
			c.lastDenied[key] = now
			if seen && now.Sub(last) < deniedWindow {
				continue // the same attempt, retried by the client's stack
			}
			es = append(es, e)
		}
		if len(c.lastDenied) > 1024 {
			for k, t := range c.lastDenied {
				if now.Sub(t) >= deniedWindow {
					delete(c.lastDenied, k)
				}
			}
		}
		c.append(es...)
	}
}

func (c *Collector) append(es ...Entry) {
	if err := c.j.Append(c.sandbox, es...); err != nil {
		c.log.Warn("egress audit: journal", "sandbox_id", c.sandbox, "err", err)
	}
}

// openEntries lists the allowed connections still open.
func (c *Collector) openEntries() []Entry {
	c.mu.Lock()
	defer c.mu.Unlock()
	out := make([]Entry, 0, len(c.open))
	for _, e := range c.open {
		out = append(out, e)
	}
	return out
}

// Stop ends the collector. With final (the namespace is about to go) it
// first writes the flows still open, with their bytes so far read from
// the tracking table; without (the node is closing, the sandbox goes on
// running) it writes nothing more: the next collector takes over.
func (c *Collector) Stop(final bool) {
	close(c.done)
	c.nf.close()
	// The library's worker may be blocked handing over an event or an
	// error, and its Close waits for it: take them until it is closed.
	closed := make(chan struct{})
	go func() {
		for {
			select {
			case <-c.events:
			case <-c.errs:
			case <-closed:
				return
			}
		}
	}()
	c.ct.Close()
	close(closed)
	c.q.Close()
	c.wg.Wait()
	c.unreg()
	defer unix.Close(c.nsFD)
	if !final {
		return
	}
	// The events are all in: the flows still open are known. Their bytes
	// so far are read from the tracking table, a walk of the host's whole
	// table (~10 ms of CPU, whatever the namespace holds), so only when
	// there is one.
	c.mu.Lock()
	defer c.mu.Unlock()
	var flows []conntrack.Flow
	if len(c.open) > 0 {
		if d, err := conntrack.Dial(&netlink.Config{NetNS: c.nsFD}); err == nil {
			flows, _ = d.Dump(nil)
			d.Close()
		}
	}
	now := time.Now().UTC()
	var es []Entry
	for i := range flows {
		f := &flows[i]
		e, ok := c.open[f.ID]
		if !ok {
			continue
		}
		delete(c.open, f.ID)
		e.End, e.Open = &now, false
		e.BytesOut, e.BytesIn = int64(f.CountersOrig.Bytes), int64(f.CountersReply.Bytes)
		e.Reason = "open when the sandbox's network went"
		es = append(es, e)
	}
	for _, e := range c.open { // not in the table any more: ended unseen
		e.End, e.Open = &now, false
		e.Reason = "open when the sandbox's network went"
		es = append(es, e)
	}
	c.open = map[uint32]Entry{}
	c.append(es...)
}

func protoName(p uint8) string {
	switch p {
	case unix.IPPROTO_TCP:
		return "tcp"
	case unix.IPPROTO_UDP:
		return "udp"
	case unix.IPPROTO_ICMP:
		return "icmp"
	case unix.IPPROTO_ICMPV6:
		return "icmpv6"
	case unix.IPPROTO_SCTP:
		return "sctp"
	}
	return strconv.Itoa(int(p))
}

func dstString(proto uint8, a netip.Addr, port uint16) string {
	switch proto {
	case unix.IPPROTO_TCP, unix.IPPROTO_UDP, unix.IPPROTO_SCTP:
		return netip.AddrPortFrom(a, port).String()
	}
	return a.String()
}

func writeSysctl(path, v string) error {
	return os.WriteFile(path, []byte(v), 0o644)
}

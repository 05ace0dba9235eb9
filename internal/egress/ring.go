package egress

import (
	"net/netip"
	"sync"
	"time"
)

// RingSize is how many decisions each sandbox keeps (the oldest go).
const RingSize = 1024

// Record is one connection the proxy judged.
type Record struct {
	At       time.Time
	Dst      netip.AddrPort // where the sandbox connected
	Upstream netip.AddrPort // where the proxy connected (allowed only)
	Domain   string         // the SNI or Host ("" when none was sent)
	Allowed  bool
	// Reason is Decision.Reason, or why the proxy refused or ended one:
	// "limit" (the sandbox's connection cap), "resolve" (the name has no
	// address outside the floor), "dial", "idle" (closed after
	// Config.IdleTimeout without a byte either way).
	Reason   string
	Rule     string
	BytesOut int64 // sandbox -> upstream, the replayed peek included
	BytesIn  int64 // upstream -> sandbox
	// Injected: the connection's requests got an injection's headers (the
	// proxy terminated its TLS); Reason then says "tls" when the sandbox
	// refused the proxy's certificate, "upstream-tls" when the upstream's
	// did not verify, "host-mismatch" when a request named another host
	// than the TLS server name (refused with 421), "limit" when an
	// upstream connection was over the cap (503).
	Injected bool
}

// ring is a bounded log of records; slots are updated in place while
// their connection lives (bytes, a failure).
type ring struct {
	mu   sync.Mutex
	recs []Record
	seq  []uint64 // sequence number of each slot
	next uint64
}

// add stores r and returns its sequence number for update.
func (g *ring) add(r Record) uint64 {
	g.mu.Lock()
	defer g.mu.Unlock()
	n := g.next
	g.next++
	if len(g.recs) < RingSize {
		g.recs = append(g.recs, r)
		g.seq = append(g.seq, n)
	} else {
		g.recs[n%RingSize] = r
		g.seq[n%RingSize] = n
	}
	return n
}

// update changes record n if it is still kept.
func (g *ring) update(n uint64, f func(*Record)) {
	g.mu.Lock()
	defer g.mu.Unlock()
	i := int(n % RingSize)
	if i < len(g.recs) && g.seq[i] == n {
		f(&g.recs[i])
	}
}

// list returns the records, oldest first.
func (g *ring) list() []Record {
	g.mu.Lock()
	defer g.mu.Unlock()
	out := make([]Record, 0, len(g.recs))
	if len(g.recs) < RingSize {
		return append(out, g.recs...)
	}
	start := int(g.next % RingSize)
	out = append(out, g.recs[start:]...)
	return append(out, g.recs[:start]...)
}

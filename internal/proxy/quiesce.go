package proxy

import (
	"context"
	"time"
)

// QuiesceHold bounds how long a quiesce mark outlives its Quiesce when
// nothing releases it (the hibernation it readied never came): traffic
// then flows again.
const QuiesceHold = time.Minute

// quiesce is a node-side proxy's record of what it forwards to each
// sandbox, and which sandboxes take nothing new (a drain readies their
// hibernation). Guarded by Proxy.mu.
type quiesce struct {
	inflight map[string]int
	marked   map[string]time.Time     // until
	idle     map[string]chan struct{} // closed when inflight reaches 0
}

// admit counts a request to sandbox id as in flight, unless the sandbox
// is quiesced: then it reports false and the request is answered as one
// in transition (a replica sends it again). release ends the count.
func (p *Proxy) admit(id string) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	if until, ok := p.q.marked[id]; ok {
		if time.Now().Before(until) {
			return false
		}
		delete(p.q.marked, id)
	}
	p.q.inflight[id]++
	return true
}

func (p *Proxy) release(id string) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.q.inflight[id]--; p.q.inflight[id] > 0 {
		return
	}
	delete(p.q.inflight, id)
	if ch, ok := p.q.idle[id]; ok {
		close(ch)
		delete(p.q.idle, id)
	}
}

// Quiesce readies sandbox id for a hibernation that must not cut the
// requests it is answering: from now on the proxy forwards it nothing new
// (each new request gets the transition 503, which the replica in front
// sends again once the sandbox has moved or woken), and Quiesce waits
// until the requests already forwarded there have ended, grace has passed
// or ctx has ended. It returns how many were still in flight (0: none
// will be cut). The mark stays until Unquiesce, or QuiesceHold after the
// wait. Only a node-side proxy counts; on another Quiesce returns 0 at
// once.
func (p *Proxy) Quiesce(ctx context.Context, id string, grace time.Duration) int {
	if !p.nodeSide {
		return 0
	}
	timer := time.NewTimer(grace)
	defer timer.Stop()
	for {
		p.mu.Lock()
		p.q.marked[id] = time.Now().Add(grace + QuiesceHold)
		n := p.q.inflight[id]
		if n == 0 {
			p.mu.Unlock()
			return 0
		}
		ch, ok := p.q.idle[id]
		if !ok {
			ch = make(chan struct{})
			p.q.idle[id] = ch
		}
		p.mu.Unlock()
		select {
		case <-ch:
		case <-timer.C:
			return p.inflightOf(id)
		case <-ctx.Done():
			return p.inflightOf(id)
		}
	}
}

// Unquiesce lets requests through to sandbox id again (its hibernation
// was done, or failed and it still runs).
func (p *Proxy) Unquiesce(id string) {
	p.mu.Lock()
	defer p.mu.Unlock()
	delete(p.q.marked, id)
}

func (p *Proxy) inflightOf(id string) int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.q.inflight[id]
}

package control

import (
	"context"
	"sync"
)

// sandboxLocks serializes the decisions about one sandbox's lifetime: the
// reaper's (is it still expired? then kill or hibernate it) against a
// client's connect or new timeout. Without it the reaper acted on a list
// read before a connect extended the sandbox, and killed or hibernated it
// right after the connect had answered "running"
// (TestConnectNeverLosesToReaper). The lock is a per-sandbox semaphore
// taken with a context and held across the engine call, as the engine's
// own per-sandbox lock is; the map's mutex is never held while waiting.
type sandboxLocks struct {
	mu sync.Mutex
	m  map[string]*sandboxLock
}

type sandboxLock struct {
	ch   chan struct{}
	refs int // holders and waiters; the entry goes when it drops to 0
}

// lock takes id's lock, or fails when ctx ends first.
func (l *sandboxLocks) lock(ctx context.Context, id string) (unlock func(), err error) {
	l.mu.Lock()
	if l.m == nil {
		l.m = map[string]*sandboxLock{}
	}
	e := l.m[id]
	if e == nil {
		e = &sandboxLock{ch: make(chan struct{}, 1)}
		l.m[id] = e
	}
	e.refs++
	l.mu.Unlock()
	release := func() {
		l.mu.Lock()
		if e.refs--; e.refs == 0 {
			delete(l.m, id)
		}
		l.mu.Unlock()
	}
	select {
	case e.ch <- struct{}{}:
		return func() { <-e.ch; release() }, nil
	case <-ctx.Done():
		release()
		return nil, ctx.Err()
	}
}

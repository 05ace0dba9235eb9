package netaudit

import "sync"

// keyedLocks is a mutex per key (a sandbox's journal file) whose entry
// lives only while someone holds or waits for it. Before, the journal
// kept one mutex per sandbox ever seen until Sweep removed the file, a
// week later by default, and Sweep deleted the entry while others could
// still hold or wait for that mutex: the next caller made a second one,
// and two goroutines held "the" lock of one file at once.
type keyedLocks struct {
	mu sync.Mutex
	m  map[string]*keyedLock
}

type keyedLock struct {
	sync.Mutex
	refs int // holders and waiters; the entry goes when it drops to 0
}

// lock takes key's lock and returns its release.
func (l *keyedLocks) lock(key string) (unlock func()) {
	l.mu.Lock()
	if l.m == nil {
		l.m = map[string]*keyedLock{}
	}
	e := l.m[key]
	if e == nil {
		e = &keyedLock{}
		l.m[key] = e
	}
	e.refs++
	l.mu.Unlock()
	e.Lock()
	return func() {
		e.Unlock()
		l.mu.Lock()
		if e.refs--; e.refs == 0 {
			delete(l.m, key)
		}
		l.mu.Unlock()
	}
}

// len is how many keys have an entry (tests).
func (l *keyedLocks) len() int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return len(l.m)
}

package egress

import (
	"net"
	"sync"
	"time"

	"golang.org/x/sys/unix"
)

// idleWatch closes a connection that moved no byte either way for a
// period: a timer checks a byte count once per period and calls expire
// when it did not change. No goroutine waits meanwhile, and the copies
// pay nothing per read (a relayed connection's bytes are spliced, out of
// the proxy's sight; the kernel counts them).
type idleWatch struct {
	period   time.Duration
	progress func() int64
	expire   func()
	t        *time.Timer

	mu      sync.Mutex
	last    int64
	stopped bool
	fired   bool
}

// watchIdle starts watching: progress returns a count that grows with
// every byte moved either way.
func watchIdle(period time.Duration, progress func() int64, expire func()) *idleWatch {
	w := &idleWatch{period: period, progress: progress, expire: expire, last: progress()}
	w.mu.Lock()
	w.t = time.AfterFunc(period, w.check)
	w.mu.Unlock()
	return w
}

func (w *idleWatch) check() {
	n := w.progress()
	w.mu.Lock()
	if w.stopped {
		w.mu.Unlock()
		return
	}
	if n != w.last {
		w.last = n
		w.t.Reset(w.period)
		w.mu.Unlock()
		return
	}
	w.fired = true
	w.mu.Unlock()
	w.expire()
}

// stop ends the watch and reports whether it expired the connection.
func (w *idleWatch) stop() bool {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.stopped = true
	w.t.Stop()
	return w.fired
}

// tcpProgress counts the bytes a TCP connection received and had
// acknowledged (TCP_INFO, Linux 4.2 and later): both directions of the
// sandbox's side of a relay.
func tcpProgress(c *net.TCPConn) func() int64 {
	raw, err := c.SyscallConn()
	if err != nil {
		return func() int64 { return 0 }
	}
	return func() int64 {
		var n int64
		raw.Control(func(fd uintptr) {
			if info, err := unix.GetsockoptTCPInfo(int(fd), unix.IPPROTO_TCP, unix.TCP_INFO); err == nil {
				n = int64(info.Bytes_received + info.Bytes_acked)
			}
		})
		return n
	}
}

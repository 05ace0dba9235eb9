package gvisor

// The host kernel's log, followed for the OOM killer's records.
//
// When a sandbox process dies, its exit is explained by the host's OOM
// killer if the kernel logged "Killed process <pid>" for it. Reading
// /dev/kmsg from its start at every death cost ~3.5 ms of CPU per death
// here (a 130 KB log, one read per record; a host whose log ring is full
// pays more): 40 % of the server's CPU in a kill of 100 sandboxes. One
// follower per driver keeps its descriptor open instead, and each look
// reads only the records logged since the last.
//
// A record counts for a process only if it was logged after the watch of
// that process began (its sequence number is past the mark taken then), so
// an old kill of a process whose PID the kernel has since given to a
// sandbox is not taken for the sandbox's.

import (
	"bytes"
	"errors"
	"strconv"
	"sync"

	"golang.org/x/sys/unix"
)

// hostKmsg follows the host's kernel log for every driver of the process.
var hostKmsg = newKmsgFollower("/dev/kmsg")

// kmsgKillsKept bounds the kills remembered (the newest are kept).
const kmsgKillsKept = 4096

// kmsgReadMax bounds one look's reading, against a log flooded faster
// than it is read.
const kmsgReadMax = 16 << 20

type kmsgKill struct {
	pid int
	seq int64
}

// kmsgFollower reads a kernel log device (/dev/kmsg) incrementally and
// remembers the PIDs the OOM killer killed, with their records' sequence
// numbers. Safe for concurrent use.
type kmsgFollower struct {
	path string

	mu      sync.Mutex
	fd      int // -1: not open
	last    int64
	pending []byte // a record cut by a read's end (a regular file; /dev/kmsg gives whole records)
	kills   map[int]int64
	order   []kmsgKill // arrival order, to drop the oldest
}

func newKmsgFollower(path string) *kmsgFollower {
	return &kmsgFollower{path: path, fd: -1, last: -1, kills: map[int]int64{}}
}

// mark reads what was logged so far and returns the sequence number of
// the last record: a kill logged later has a greater one. -1 when the log
// cannot be read (then any kill counts).
func (k *kmsgFollower) mark() int64 {
	k.mu.Lock()
	defer k.mu.Unlock()
	k.readLocked()
	return k.last
}

// killedAfter reports whether the log has a kill of pid whose record came
// after mark.
func (k *kmsgFollower) killedAfter(pid int, mark int64) bool {
	k.mu.Lock()
	defer k.mu.Unlock()
	k.readLocked()
	seq, ok := k.kills[pid]
	return ok && seq > mark
}

// readLocked reads every record logged since the last read.
func (k *kmsgFollower) readLocked() {
	if k.fd < 0 {
		// Raw syscalls: an os.File would park a non-blocking read in Go's
		// poller until the next kernel message instead of returning EAGAIN.
		fd, err := unix.Open(k.path, unix.O_RDONLY|unix.O_NONBLOCK|unix.O_CLOEXEC, 0)
		if err != nil {
			return
		}
		k.fd = fd
	}
	buf := make([]byte, 8192) // /dev/kmsg: one record per read
	for total := 0; total < kmsgReadMax; {
		n, err := unix.Read(k.fd, buf)
		if errors.Is(err, unix.EPIPE) || errors.Is(err, unix.EINTR) { // records overwritten before read: go on
			continue
		}
		if err != nil || n <= 0 {
			return // EAGAIN (or a file's end): all read
		}
		total += n
		k.pending = append(k.pending, buf[:n]...)
		k.scanLocked()
	}
}

// scanLocked takes the whole lines of k.pending as records (a
// continuation line, " KEY=value", has no header: record skips it).
func (k *kmsgFollower) scanLocked() {
	rest := k.pending
	for {
		i := bytes.IndexByte(rest, '\n')
		if i < 0 {
			break
		}
		k.record(rest[:i])
		rest = rest[i+1:]
	}
	k.pending = append(k.pending[:0], rest...)
}

// record takes one line: "prio,seq,usec,flags[,...];message".
func (k *kmsgFollower) record(line []byte) {
	head, msg, ok := bytes.Cut(line, []byte(";"))
	if !ok {
		return
	}
	fields := bytes.SplitN(head, []byte(","), 3)
	if len(fields) < 3 {
		return
	}
	seq, err := strconv.ParseInt(string(fields[1]), 10, 64)
	if err != nil {
		return
	}
	k.last = max(k.last, seq)
	pid, ok := killedPID(msg)
	if !ok {
		return
	}
	k.kills[pid] = seq
	k.order = append(k.order, kmsgKill{pid, seq})
	if len(k.order) > kmsgKillsKept {
		old := k.order[0]
		k.order = k.order[1:]
		if k.kills[old.pid] == old.seq {
			delete(k.kills, old.pid)
		}
	}
}

// killedPID parses the OOM killer's "... Killed process 1234 (comm) ...".
func killedPID(msg []byte) (int, bool) {
	_, rest, ok := bytes.Cut(msg, []byte("Killed process "))
	if !ok {
		return 0, false
	}
	end := bytes.IndexByte(rest, ' ')
	if end <= 0 {
		return 0, false
	}
	pid, err := strconv.Atoi(string(rest[:end]))
	if err != nil || pid <= 0 {
		return 0, false
	}
	return pid, true
}

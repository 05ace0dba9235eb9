package gvisor

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/spore-run/spore/internal/ids"
	"github.com/spore-run/spore/internal/testenv"
)

// kmsgLog is a file standing in for /dev/kmsg: records appended as the
// kernel formats them.
type kmsgLog struct {
	t    *testing.T
	path string
	seq  int
}

func newKmsgLog(t *testing.T) *kmsgLog {
	l := &kmsgLog{t: t, path: filepath.Join(t.TempDir(), "kmsg")}
	l.write("")
	return l
}

func (l *kmsgLog) write(s string) {
	l.t.Helper()
	f, err := os.OpenFile(l.path, os.O_CREATE|os.O_APPEND|os.O_WRONLY, 0o600)
	if err != nil {
		l.t.Fatal(err)
	}
	defer f.Close()
	if _, err := f.WriteString(s); err != nil {
		l.t.Fatal(err)
	}
}

// add logs msg as the next record.
func (l *kmsgLog) add(msg string) {
	l.t.Helper()
	l.seq++
	l.write(fmt.Sprintf("6,%d,%d,-;%s\n", l.seq, 1000*l.seq, msg))
}

func oomRecord(pid int) string {
	return fmt.Sprintf("Memory cgroup out of memory: Killed process %d (runsc-sandbox) total-vm:2097152kB, anon-rss:1024kB, file-rss:0kB, shmem-rss:0kB, UID:0 pgtables:800kB oom_score_adj:0", pid)
}

// TestKmsgKillsAfterMark: a kill logged before a watch's mark is an
// earlier holder of the PID's and does not count for it; one logged after
// does; other records and a kill's continuation lines are no kills.
func TestKmsgKillsAfterMark(t *testing.T) {
	l := newKmsgLog(t)
	l.add("gw0: renamed from spab421")
	l.add(oomRecord(4242))
	l.write(" SUBSYSTEM=memory\n DEVICE=+memory:x\n")
	l.add("Killed processes are listed above") // no PID
	k := newKmsgFollower(l.path)

	if !k.killedAfter(4242, -1) {
		t.Error("a kill anywhere in the log does not count with no mark")
	}
	m := k.mark()
	if m != 3 {
		t.Errorf("mark %d, want 3 (the last record's sequence number)", m)
	}
	if k.killedAfter(4242, m) {
		t.Error("a kill logged before the mark counts")
	}
	l.add("eth0: renamed from spaa422")
	l.add(oomRecord(4242))
	l.add("Out of memory: Killed process 77 (python3) total-vm:1kB")
	if !k.killedAfter(4242, m) {
		t.Error("a kill logged after the mark does not count")
	}
	if !k.killedAfter(77, m) {
		t.Error("the global OOM killer's record does not count")
	}
	if k.killedAfter(4243, m) || k.killedAfter(424, m) || k.killedAfter(42, m) {
		t.Error("a kill counts for another PID")
	}
	if got := k.mark(); got != 6 {
		t.Errorf("mark %d, want 6", got)
	}
}

// TestKmsgRecordCutByARead: a record whose end comes in a later read is
// taken whole, once.
func TestKmsgRecordCutByARead(t *testing.T) {
	l := newKmsgLog(t)
	k := newKmsgFollower(l.path)
	m := k.mark()
	rec := fmt.Sprintf("6,1,1000,-;%s\n", oomRecord(31337))
	l.write(rec[:40])
	if k.killedAfter(31337, m) {
		t.Error("half a record counts")
	}
	l.write(rec[40:])
	if !k.killedAfter(31337, m) {
		t.Error("the record, once whole, does not count")
	}
}

// TestKmsgKillsBounded: the oldest kills are dropped past kmsgKillsKept;
// the newest stay.
func TestKmsgKillsBounded(t *testing.T) {
	l := newKmsgLog(t)
	var b strings.Builder
	for i := range kmsgKillsKept + 10 {
		fmt.Fprintf(&b, "3,%d,%d,-;%s\n", i+1, i+1, oomRecord(1000+i))
	}
	l.write(b.String())
	k := newKmsgFollower(l.path)
	if k.killedAfter(1000, -1) {
		t.Error("the oldest kill is still kept")
	}
	if !k.killedAfter(1000+kmsgKillsKept+9, -1) {
		t.Error("the newest kill is not kept")
	}
	if len(k.kills) != kmsgKillsKept || len(k.order) != kmsgKillsKept {
		t.Errorf("%d kills and %d in order kept, want %d", len(k.kills), len(k.order), kmsgKillsKept)
	}
}

// TestKmsgUnreadable: with no log, nothing is a kill and the mark is -1.
func TestKmsgUnreadable(t *testing.T) {
	k := newKmsgFollower(filepath.Join(t.TempDir(), "none"))
	if m := k.mark(); m != -1 {
		t.Errorf("mark %d, want -1", m)
	}
	if k.killedAfter(1, -1) {
		t.Error("a kill without a log")
	}
}

// TestKmsgFollowsTheHostLog: on the host's /dev/kmsg (one record per read,
// EAGAIN at its end), the follower reads the whole log once, then only
// what comes after: a record logged by the test is past the last mark, and
// the next mark is at least its sequence number. (The record is an
// ordinary notice, not an OOM kill.)
func TestKmsgFollowsTheHostLog(t *testing.T) {
	testenv.RequireRoot(t)
	k := newKmsgFollower("/dev/kmsg")
	first := k.mark()
	if first < 0 {
		t.Fatalf("mark %d on /dev/kmsg: the log was not read", first)
	}
	f, err := os.OpenFile("/dev/kmsg", os.O_WRONLY, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if _, err := fmt.Fprintf(f, "<6>spore test: kernel log follower check %s\n", ids.New('t')); err != nil {
		t.Fatal(err)
	}
	if next := k.mark(); next <= first {
		t.Fatalf("mark %d after a record was logged, want more than %d", next, first)
	}
	if n := len(k.pending); n != 0 {
		t.Errorf("%d bytes of a record left unread: /dev/kmsg gives whole records", n)
	}
}

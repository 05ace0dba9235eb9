package netaudit

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/spore-run/spore/internal/errdefs"
)

var boundT0 = time.Date(2026, 11, 30, 12, 0, 0, 0, time.UTC)

// entryN is the n-th entry of a test journal: its number in BytesIn.
func entryN(n int) Entry {
	return Entry{At: boundT0.Add(time.Duration(n) * time.Millisecond), Proto: "tcp", Dst: "198.19.1.2:443", Allowed: true, BytesIn: int64(n)}
}

func openBounded(t testing.TB, max int64) *Journal {
	t.Helper()
	j, err := OpenJournalConfig(t.TempDir(), JournalConfig{Retention: time.Hour, MaxBytes: max})
	if err != nil {
		t.Fatal(err)
	}
	return j
}

// checkSuffix checks that a query's answer is a marker saying how many
// of total entries were dropped, then exactly the newest others, in order.
func checkSuffix(t *testing.T, got []Entry, total int) {
	t.Helper()
	if len(got) < 2 || got[0].Rule != DroppedRule {
		t.Fatalf("no marker first: %d entries, first %+v", len(got), got[0])
	}
	kept := got[1:]
	if got[0].Dropped != int64(total-len(kept)) || !strings.Contains(got[0].Reason, fmt.Sprint(total-len(kept))) {
		t.Fatalf("marker says %d dropped (%q); %d of %d kept", got[0].Dropped, got[0].Reason, len(kept), total)
	}
	if got[0].At.After(kept[0].At) {
		t.Fatalf("the marker (%v) sorts after the first kept entry (%v)", got[0].At, kept[0].At)
	}
	for i, e := range kept {
		if want := total - len(kept) + i; e.BytesIn != int64(want) || !e.At.Equal(entryN(want).At) {
			t.Fatalf("kept entry %d is #%d, want #%d (the newest, in order)", i, e.BytesIn, want)
		}
	}
}

// A journal that reaches its bound stays under it: the oldest entries go
// (the oldest half at each rewrite), the newest stay in order, and the
// first line says how many went in all, across rewrites. A batch larger
// than half the bound keeps its newest entries. Before, the file grew
// without bound.
func TestJournalStaysUnderItsBound(t *testing.T) {
	const max = 8 << 10
	j := openBounded(t, max)
	const sb = "ibound0000000000001"
	total := 0
	for i := 0; total < 2000; i++ {
		batch := make([]Entry, 1+i%7)
		for k := range batch {
			batch[k] = entryN(total)
			total++
		}
		if err := j.Append(sb, batch...); err != nil {
			t.Fatal(err)
		}
		fi, err := os.Stat(j.path(sb))
		if err != nil {
			t.Fatal(err)
		}
		if fi.Size() > max {
			t.Fatalf("after %d entries the journal is %d bytes, over its bound of %d", total, fi.Size(), max)
		}
	}
	got, err := j.Query(sb, time.Time{}, 0)
	if err != nil {
		t.Fatal(err)
	}
	checkSuffix(t, got, total)
	if len(got) < 20 {
		t.Fatalf("only %d entries kept in %d bytes", len(got), max)
	}
	// since after the drop: the marker is not part of the answer.
	if late, _ := j.Query(sb, got[2].At, 0); len(late) != len(got)-2 || late[0].Rule == DroppedRule {
		t.Fatalf("since past the marker: %d entries, first %+v", len(late), late[0])
	}
	// One batch bigger than half the bound.
	big := make([]Entry, 200)
	for k := range big {
		big[k] = entryN(total)
		total++
	}
	if err := j.Append(sb, big...); err != nil {
		t.Fatal(err)
	}
	if fi, _ := os.Stat(j.path(sb)); fi.Size() > max {
		t.Fatalf("after a big batch the journal is %d bytes", fi.Size())
	}
	got, _ = j.Query(sb, time.Time{}, 0)
	checkSuffix(t, got, total)
}

// A rewrite at the bound is crash-safe: it goes to a temporary file
// renamed over the journal, and what a crash leaves (the temporary file)
// goes when the journal is opened again, the journal whole. A torn last
// line (a crash mid-append) swallows no later entry, whether the next
// append rewrites the file or not (before, the first entry appended
// after it was lost in the torn line).
func TestJournalRewriteAndTornLines(t *testing.T) {
	const max = 8 << 10
	dir := t.TempDir()
	j, err := OpenJournalConfig(dir, JournalConfig{MaxBytes: max})
	if err != nil {
		t.Fatal(err)
	}
	const sb = "itorn00000000000001"
	tear := func() {
		f, err := os.OpenFile(j.path(sb), os.O_WRONLY|os.O_APPEND, 0)
		if err != nil {
			t.Fatal(err)
		}
		f.WriteString(`{"at":"2026-11-30T12:00:09Z","pro`)
		f.Close()
	}
	if err := j.Append(sb, entryN(0), entryN(1)); err != nil {
		t.Fatal(err)
	}
	tear()
	if err := j.Append(sb, entryN(2)); err != nil {
		t.Fatal(err)
	}
	if got, _ := j.Query(sb, time.Time{}, 0); len(got) != 3 || got[2].BytesIn != 2 {
		t.Fatalf("after a torn line and an append: %+v", got)
	}
	// A journal written before that fix holds a torn line merged with the
	// next entry: skipped without taking the place of a whole entry.
	const merged = "imerged000000000001"
	var lines []string
	for _, e := range []Entry{entryN(0), entryN(1), entryN(2)} {
		b, _ := json.Marshal(e)
		lines = append(lines, string(b))
	}
	if err := os.WriteFile(j.path(merged), []byte(lines[0]+"\n"+`{"at":"2026-11-30T12:00:09Z","pro`+lines[1]+"\n"+lines[2]+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	if got, err := j.Query(merged, time.Time{}, 2); err != nil || len(got) != 2 || got[0].BytesIn != 0 || got[1].BytesIn != 2 {
		t.Fatalf("a merged torn line among the newest 2: %v %+v", err, got)
	}
	n := 3
	for ; ; n++ { // up to the edge of the bound
		fi, _ := os.Stat(j.path(sb))
		if fi.Size() > max-300 {
			break
		}
		if err := j.Append(sb, entryN(n)); err != nil {
			t.Fatal(err)
		}
	}
	tear()
	if err := j.Append(sb, entryN(n), entryN(n+1)); err != nil { // rewrites
		t.Fatal(err)
	}
	got, _ := j.Query(sb, time.Time{}, 0)
	if last := got[len(got)-1]; got[0].Rule != DroppedRule || last.BytesIn != int64(n+1) || got[len(got)-2].BytesIn != int64(n) {
		t.Fatalf("after a torn line and a rewrite: first %+v, last two %+v", got[0], got[len(got)-2:])
	}
	// A crash mid-rewrite leaves a temporary file beside a whole journal.
	stray := filepath.Join(dir, "."+sb+tempMark+"123")
	if err := os.WriteFile(stray, []byte(`{"at":"2026-`), 0o600); err != nil {
		t.Fatal(err)
	}
	j2, err := OpenJournalConfig(dir, JournalConfig{MaxBytes: max})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(stray); !os.IsNotExist(err) {
		t.Fatalf("a rewrite's temporary file outlived the reopen: %v", err)
	}
	if again, err := j2.Query(sb, time.Time{}, 0); err != nil || len(again) != len(got) {
		t.Fatalf("after the reopen: %v, %d entries, want %d", err, len(again), len(got))
	}
	if n, err := j2.Sweep(); err != nil || n != 0 {
		t.Fatalf("sweep of a fresh journal: %d %v", n, err)
	}
}

// A bound too small to hold anything is refused, naming it; none is the
// default.
func TestJournalConfig(t *testing.T) {
	if _, err := OpenJournalConfig(t.TempDir(), JournalConfig{MaxBytes: 100}); !errdefs.IsInvalidArgument(err) || !strings.Contains(err.Error(), "100") {
		t.Fatalf("a 100-byte bound: %v", err)
	}
	j, err := OpenJournalConfig(t.TempDir(), JournalConfig{})
	if err != nil || j.maxBytes != DefaultMaxBytes || j.retention != DefaultRetention {
		t.Fatalf("defaults: %v %+v", err, j)
	}
}

// Appends, rewrites at the bound and queries of several sandboxes at
// once (run under -race): every query sees a journal that reads whole
// (a marker, then entries in order), and at the end each journal has
// kept the newest entries and counted every other one. The per-sandbox
// locks are then all freed. Before, an entry stayed per sandbox until
// its journal was swept.
func TestJournalConcurrentUse(t *testing.T) {
	j := openBounded(t, 8<<10)
	const sandboxes, each = 3, 400
	var wg sync.WaitGroup
	for s := range sandboxes {
		id := fmt.Sprintf("iconc%014d", s)
		wg.Go(func() {
			for n := range each {
				if err := j.Append(id, entryN(n)); err != nil {
					t.Error(err)
					return
				}
			}
		})
		wg.Go(func() {
			for range 50 {
				got, err := j.Query(id, time.Time{}, 0)
				if errdefs.IsNotFound(err) {
					continue
				}
				if err != nil {
					t.Error(err)
					return
				}
				for i := 1; i < len(got); i++ {
					if got[i].BytesIn != got[i-1].BytesIn+1 && got[i-1].Rule != DroppedRule {
						t.Errorf("%s: entry #%d follows #%d", id, got[i].BytesIn, got[i-1].BytesIn)
						return
					}
				}
			}
		})
	}
	wg.Wait()
	for s := range sandboxes {
		got, err := j.Query(fmt.Sprintf("iconc%014d", s), time.Time{}, 0)
		if err != nil {
			t.Fatal(err)
		}
		checkSuffix(t, got, each)
	}
	if n := j.locks.len(); n != 0 {
		t.Fatalf("%d per-sandbox locks left after every append and query ended", n)
	}
}

// Journals of many sandboxes appended to, queried and swept leave no
// lock behind (before, each stayed until its journal was swept, a week
// after its last entry by default); the locks exclude per key, and not
// across keys (-race).
func TestJournalLocksAreFreed(t *testing.T) {
	j := openBounded(t, 8<<10)
	for s := range 100 {
		id := fmt.Sprintf("ifree%014d", s)
		if err := j.Append(id, entryN(s)); err != nil {
			t.Fatal(err)
		}
		if _, err := j.Query(id, time.Time{}, 0); err != nil {
			t.Fatal(err)
		}
	}
	if n := j.locks.len(); n != 0 {
		t.Fatalf("%d per-sandbox locks left for 100 sandboxes no one appends to or reads", n)
	}
	j.now = func() time.Time { return time.Now().Add(2 * time.Hour) }
	if n, err := j.Sweep(); err != nil || n != 100 {
		t.Fatalf("sweep: %d %v", n, err)
	}
	if n := j.locks.len(); n != 0 {
		t.Fatalf("%d per-sandbox locks left for 100 sandboxes whose journals are gone", n)
	}

	var l keyedLocks
	var inside [4]atomic.Int32
	var counts [4]int // written only under key k's lock: -race checks it
	var wg sync.WaitGroup
	for g := range 16 {
		wg.Go(func() {
			for i := range 200 {
				k := (g + i) % 4
				unlock := l.lock(fmt.Sprint(k))
				if inside[k].Add(1) != 1 {
					t.Errorf("two holders of key %d", k)
				}
				counts[k]++
				inside[k].Add(-1)
				unlock()
			}
		})
	}
	wg.Wait()
	if counts[0]+counts[1]+counts[2]+counts[3] != 16*200 {
		t.Fatalf("counts %v", counts)
	}
	if n := l.len(); n != 0 {
		t.Fatalf("%d lock entries left", n)
	}
}

// writeJournal appends n entries to a sandbox's journal, 500 at a time.
func writeJournal(t testing.TB, j *Journal, id string, n int) {
	t.Helper()
	for i := 0; i < n; i += 500 {
		batch := make([]Entry, 0, 500)
		for k := i; k < min(n, i+500); k++ {
			batch = append(batch, entryN(k))
		}
		if err := j.Append(id, batch...); err != nil {
			t.Fatal(err)
		}
	}
}

// A query's memory does not grow with the journal: the newest 10 of
// 2,000 entries and of 40,000 take the same allocations (the file is
// read line by line; only the lines returned are decoded). Before, the
// whole file was read and every line decoded: 20 times the allocations.
func TestQueryMemoryIsBoundedByLimit(t *testing.T) {
	j := openBounded(t, 64<<20)
	const small, big, limit = 2000, 40000, 10
	writeJournal(t, j, "ismall0000000000001", small)
	writeJournal(t, j, "ibig000000000000001", big)
	allocs := map[int]float64{}
	for id, n := range map[string]int{"ismall0000000000001": small, "ibig000000000000001": big} {
		var got []Entry
		allocs[n] = testing.AllocsPerRun(5, func() {
			var err error
			if got, err = j.Query(id, time.Time{}, limit); err != nil {
				t.Fatal(err)
			}
		})
		if len(got) != limit || got[0].BytesIn != int64(n-limit) || got[limit-1].BytesIn != int64(n-1) {
			t.Fatalf("%d entries: got %d, first #%d", n, len(got), got[0].BytesIn)
		}
	}
	t.Logf("allocations per query of the newest %d: %.0f (%d entries), %.0f (%d entries)", limit, allocs[small], small, allocs[big], big)
	if allocs[big] > allocs[small]+20 {
		t.Fatalf("a query of a journal 20x larger allocates %.0f times, against %.0f", allocs[big], allocs[small])
	}
	// since within the journal: only what is at or after it.
	if got, _ := j.Query("ibig000000000000001", entryN(big-3).At, limit); len(got) != 3 || got[0].BytesIn != big-3 {
		t.Fatalf("since: %+v", got)
	}
}

// BenchmarkQuery reads the newest entries of journals of growing size:
// with -benchmem, B/op and allocs/op stay flat as the journal grows
// (they follow the limit).
//
//	go test -run '^$' -bench BenchmarkQuery -benchmem ./internal/netaudit/
func BenchmarkQuery(b *testing.B) {
	j := openBounded(b, 64<<20)
	for _, n := range []int{1000, 10000, 100000} {
		id := fmt.Sprintf("ibench%013d", n)
		writeJournal(b, j, id, n)
		for _, limit := range []int{10, 1000} {
			b.Run(fmt.Sprintf("entries=%d/limit=%d", n, limit), func(b *testing.B) {
				b.ReportAllocs()
				for b.Loop() {
					if got, err := j.Query(id, time.Time{}, limit); err != nil || len(got) != limit {
						b.Fatal(err, len(got))
					}
				}
			})
		}
	}
}

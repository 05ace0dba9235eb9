package interp

import (
	"fmt"
	"io"
	"math/rand/v2"
	"os"
	"strconv"
	"strings"
	"testing"
	"time"
	"unicode/utf8"
)

// chunkReader returns its data a few bytes per read (1 to max).
type chunkReader struct {
	data []byte
	rng  *rand.Rand
	max  int
}

func (r *chunkReader) Read(p []byte) (int, error) {
	if len(r.data) == 0 {
		return 0, io.EOF
	}
	n := min(1+r.rng.IntN(r.max), len(r.data), len(p))
	copy(p, r.data[:n])
	r.data = r.data[n:]
	return n, nil
}

func testSeed(t *testing.T) uint64 {
	seed := uint64(time.Now().UnixNano())
	if s := os.Getenv("SPORE_TEST_SEED"); s != "" {
		seed, _ = strconv.ParseUint(s, 10, 64)
	}
	t.Logf("seed %d (replay: SPORE_TEST_SEED=%d)", seed, seed)
	return seed
}

// readRaw, fed a stream a few bytes per read, so that markers and
// multi-byte characters are split across reads at every possible place,
// forwards exactly the text between the markers, in order, each piece valid
// UTF-8, and one sync per marker after the text written before it. What
// only looks like a marker (another token, a partial prefix, no count, a
// prefix cut by the end of the stream) is text.
func TestReadRawSplitsMarkersAcrossReads(t *testing.T) {
	const token = "0123456789abcdef0123456789abcdef"
	marker := func(n uint64) string { return fmt.Sprintf("%s%s:%016x", syncPrefix, token, n) }
	segments := []string{
		"héllo wörld €uro 😀\n" + strings.Repeat("x", 50),
		"\x00spore-sync:ffffffffffffffffffffffffffffffff:0000000000000002" + // another token
			"\x00spore-sy" + "nc?" + // a partial prefix
			syncPrefix + token + ":zzzzzzzzzzzzzzzz" + // the token and no count
			"漢字",
		"",
		"tail 😀\x00spore-sync:" + token[:5], // cut by the end of the stream
	}
	counts := []uint64{1, 2, 0x7fffffff}
	var stream strings.Builder
	for i, s := range segments {
		stream.WriteString(s)
		if i < len(counts) {
			stream.WriteString(marker(counts[i]))
		}
	}
	rng := rand.New(rand.NewPCG(testSeed(t), 0))
	for round := 0; round < 300; round++ {
		k := &kernel{token: token, events: make(chan message, 1<<16), abandon: make(chan struct{})}
		k.readRaw(&chunkReader{data: []byte(stream.String()), rng: rng, max: 1 + round%9}, "stderr")
		close(k.events)
		var got []string
		var syncs []uint64
		var cur strings.Builder
		for m := range k.events {
			ev := m.ev
			if m.raw != "stderr" {
				t.Fatalf("round %d: %v not marked as raw stderr", round, m)
			}
			switch ev["type"] {
			case "stderr":
				s := ev["text"].(string)
				if !utf8.ValidString(s) || strings.Contains(s, syncPrefix+token+":0") {
					t.Fatalf("round %d: text %q is invalid UTF-8 or holds a marker", round, s)
				}
				cur.WriteString(s)
			case syncEvent:
				if ev["stream"] != "stderr" {
					t.Fatalf("round %d: sync %v", round, ev)
				}
				syncs = append(syncs, ev["count"].(uint64))
				got = append(got, cur.String())
				cur.Reset()
			default:
				t.Fatalf("round %d: event %v", round, ev)
			}
		}
		got = append(got, cur.String())
		if fmt.Sprint(syncs) != fmt.Sprint(counts) {
			t.Fatalf("round %d: syncs %v, want %v", round, syncs, counts)
		}
		if fmt.Sprintf("%q", got) != fmt.Sprintf("%q", segments) {
			t.Fatalf("round %d: segments\n%q\nwant\n%q", round, got, segments)
		}
	}
}

// The barrier waits for the end and for a marker of this execution on each
// stream the kernel marked; an earlier execution's marker does not count,
// neither for the end nor for where raw output belongs.
func TestBarrier(t *testing.T) {
	b := barrier{n: 2}
	steps := []struct {
		ev   Event
		done bool
	}{
		{Event{"type": syncEvent, "stream": "stdout", "count": uint64(1)}, false}, // a stale one
		{Event{"type": "number_of_executions", "execution_count": 2.0}, false},
		{Event{"type": "end_of_execution", "execution_count": 2.0, "synced": []any{"stdout", "stderr"}}, false},
		{Event{"type": syncEvent, "stream": "stderr", "count": uint64(2)}, false},
		{Event{"type": syncEvent, "stream": "stdout", "count": uint64(2)}, true},
	}
	for i, s := range steps {
		if !b.take(s.ev) {
			t.Fatalf("step %d: %v not taken", i, s.ev)
		}
		if b.done() != s.done {
			t.Fatalf("step %d: done = %v", i, !s.done)
		}
		if i == 0 && b.past("stdout") {
			t.Fatal("an earlier execution's marker passed the barrier")
		}
	}
	if !b.past("stdout") || !b.past("stderr") || b.past("other") {
		t.Fatal("past after both markers")
	}
	if b.take(Event{"type": "stdout", "text": "x"}) {
		t.Fatal("output taken by the barrier")
	}
	// A stream the kernel could not mark (its fd closed) is not waited for.
	c := barrier{n: 1}
	c.take(Event{"type": "end_of_execution", "execution_count": 1.0, "synced": []any{"stderr"}})
	c.take(Event{"type": syncEvent, "stream": "stderr", "count": uint64(1)})
	if !c.done() {
		t.Fatal("waits for an unmarked stream")
	}
}

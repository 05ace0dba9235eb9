package engine

import (
	"testing"
	"time"
)

// A sandbox's history keeps one sample per historyEvery (samples that
// come sooner are dropped) and the last historyLen of them, oldest
// first; prune drops the histories of sandboxes that are gone.
func TestHistoryKeepsAnHourAtFiveSeconds(t *testing.T) {
	h := history{per: map[string]*ring{}}
	t0 := time.Date(2026, 12, 5, 0, 0, 0, 0, time.UTC)
	for i := range historyLen + 80 {
		at := t0.Add(time.Duration(i) * historyEvery)
		h.record("a", StatsSample{At: at, MemoryBytes: int64(i)})
		h.record("a", StatsSample{At: at.Add(2 * time.Second), MemoryBytes: -1}) // sooner than historyEvery: dropped
	}
	got := h.per["a"].ordered()
	if len(got) != historyLen {
		t.Fatalf("%d samples kept, want %d", len(got), historyLen)
	}
	for i, s := range got {
		if want := int64(80 + i); s.MemoryBytes != want {
			t.Fatalf("sample %d holds %d, want %d (oldest first, the first 80 dropped)", i, s.MemoryBytes, want)
		}
	}
	if last, _ := h.per["a"].last(); last.MemoryBytes != historyLen+79 {
		t.Fatalf("the last sample holds %d", last.MemoryBytes)
	}
	h.record("b", StatsSample{At: t0})
	h.prune(func(id string) bool { return id == "b" })
	if _, ok := h.per["a"]; ok || h.per["b"] == nil {
		t.Fatalf("after pruning a: %v", h.per)
	}
}

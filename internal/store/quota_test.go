package store

import (
	"errors"
	"testing"
	"time"

	"github.com/spore-run/spore/internal/errdefs"
)

// The create rate is a sliding minute: the last fixed minute's creates
// weigh what of it still lies within the past 60 s.
func TestRateSlides(t *testing.T) {
	start := time.Unix(60*1000, 0) // the start of a minute
	var r Rate
	var err error
	for i := range 4 {
		if r, err = r.Take("t", start.Add(time.Duration(i)*time.Second), 1, 4); err != nil {
			t.Fatalf("create %d: %v", i, err)
		}
	}
	if _, err := r.Take("t", start.Add(50*time.Second), 1, 4); !errors.Is(err, errdefs.ErrResourceLimit) {
		t.Fatalf("the fifth create in a minute: %v", err)
	}
	// 45 s into the next minute, a quarter of the last one's 4 counts.
	at := start.Add(105 * time.Second)
	if est := r.At(at).Estimate(at); est != 1 {
		t.Fatalf("estimate 45 s into the next minute = %d, want 1", est)
	}
	if r, err = r.Take("t", at, 3, 4); err != nil {
		t.Fatalf("3 more once the last minute has mostly passed: %v", err)
	}
	if _, err := r.Take("t", at, 1, 4); err == nil {
		t.Fatal("a create past the sliding limit")
	}
	// Two minutes on, nothing counts.
	if r, err = r.Take("t", start.Add(200*time.Second), 4, 4); err != nil || r.Count != 4 || r.Prev != 0 {
		t.Fatalf("after two quiet minutes: %+v %v", r, err)
	}
	// No limit: counted, never refused.
	if _, err := (Rate{}).Take("t", start, 1000, 0); err != nil {
		t.Fatal(err)
	}
}

// Growth is what a write adds to its team's charge.
func TestGrows(t *testing.T) {
	run := Sandbox{TeamID: "a", State: StateRunning, CPUCount: 2, MemoryMB: 512}
	for _, tc := range []struct {
		name          string
		prev          *Sandbox
		next          Sandbox
		grows, create bool
	}{
		{"new row", nil, run, true, true},
		{"pooled row (nobody's)", nil, Sandbox{State: StatePooled}, false, false},
		{"claimed from the pool", &Sandbox{State: StatePooled}, run, true, true},
		{"same", &run, run, false, false},
		{"hibernated", &run, Sandbox{TeamID: "a", State: StateHibernated}, false, false},
		{"resumed", &Sandbox{TeamID: "a", State: StateHibernated, CPUCount: 2, MemoryMB: 512}, run, true, false},
		{"more memory", &run, Sandbox{TeamID: "a", State: StateRunning, CPUCount: 2, MemoryMB: 1024}, true, false},
		{"defaults named", &Sandbox{TeamID: "a", State: StateRunning}, Sandbox{TeamID: "a", State: StateRunning, CPUCount: 2, MemoryMB: 1024}, false, false},
		{"another team", &run, Sandbox{TeamID: "b", State: StateRunning}, true, true},
	} {
		g, c := Grows(tc.prev, tc.next)
		if g != tc.grows || c != tc.create {
			t.Errorf("%s: grows %v creates %v, want %v %v", tc.name, g, c, tc.grows, tc.create)
		}
	}
}

package engine_test

import (
	"slices"
	"sync/atomic"
	"testing"
	"time"
)

// The relief's order comes from activity: a launch counts as activity,
// and between two samples a sandbox whose CPU time grew by at least 2 % of
// the time between them counts as active at the second sample. A sandbox
// that used less (a watchdog's poll) stays as cold as it was.
func TestSampleActivityRanksByCPU(t *testing.T) {
	var avail atomic.Int64
	avail.Store(16 << 30)
	f := newMemFake(t, fixed(&avail), 200<<20)
	a, b, c := f.create(), f.create(), f.create()
	if got, want := f.eng.Coldest(), []string{a.ID, b.ID, c.ID}; !slices.Equal(got, want) {
		t.Fatalf("after three launches the order is %v, want the launch order %v", got, want)
	}
	f.eng.SampleActivity(fctx(t)) // the first sample only reads
	if got, want := f.eng.Coldest(), []string{a.ID, b.ID, c.ID}; !slices.Equal(got, want) {
		t.Fatalf("a first sample changed the order to %v, want %v", got, want)
	}
	time.Sleep(20 * time.Millisecond)
	if err := f.rt.AddCPU(a.Instance, time.Second); err != nil { // far above 2 % of any interval here
		t.Fatal(err)
	}
	if err := f.rt.AddCPU(b.Instance, 100*time.Microsecond); err != nil { // under 2 % of 20 ms
		t.Fatal(err)
	}
	f.eng.SampleActivity(fctx(t))
	if got, want := f.eng.Coldest(), []string{b.ID, c.ID, a.ID}; !slices.Equal(got, want) {
		t.Fatalf("after a used CPU the order is %v, want %v (a most recently active)", got, want)
	}
	f.eng.SampleActivity(fctx(t)) // no CPU since: nothing moves
	if got, want := f.eng.Coldest(), []string{b.ID, c.ID, a.ID}; !slices.Equal(got, want) {
		t.Fatalf("an idle sample changed the order to %v, want %v", got, want)
	}
}

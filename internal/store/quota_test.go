package store

import (
	"errors"
	"strings"
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

// ParseQuotas reads the CLI's names; anything else, a negative or a
// repeated quota is refused with an error naming it.
func TestParseQuotas(t *testing.T) {
	for spec, want := range map[string]Quotas{
		"":             {},
		"  ":           {},
		"sandboxes=20": {Sandboxes: 20},
		"sandboxes=20, vcpus=40,memory-mb=40960,snapshot-bytes=1073741824,volume-bytes=5,creates-per-minute=120": {
			Sandboxes: 20, VCPUs: 40, MemoryMB: 40960, SnapshotBytes: 1 << 30, VolumeBytes: 5, CreatesPerMinute: 120},
		"sandboxes=0": {},
	} {
		got, err := ParseQuotas(spec)
		if err != nil || got != want {
			t.Errorf("ParseQuotas(%q) = %+v, %v; want %+v", spec, got, err, want)
		}
	}
	for spec, says := range map[string]string{
		"sandboxes=-1":                   "sandboxes=-1",
		"sandboxes":                      "NAME=N",
		"sandboxes=x":                    "NAME=N",
		"cpus=2":                         `no quota "cpus"`,
		"vcpus=1,vcpus=2":                "vcpus given twice",
		"sandboxes=1,":                   "NAME=N",
		"memoryMB=1024":                  `no quota "memoryMB"`,
		"sandboxes=1;vcpus=2":            "NAME=N",
		"sandboxes=99999999999999999999": "NAME=N",
	} {
		q, err := ParseQuotas(spec)
		if !errdefs.IsInvalidArgument(err) || !strings.Contains(err.Error(), says) || q != (Quotas{}) {
			t.Errorf("ParseQuotas(%q) = %+v, %v; want an invalid-argument error saying %q", spec, q, err, says)
		}
	}
}

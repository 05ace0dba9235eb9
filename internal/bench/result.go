package bench

import (
	"encoding/json"
	"math"
	"slices"
	"time"
)

// SchemaVersion is the version of the JSON report's layout.
const SchemaVersion = 1

// Report is everything one `spore bench` run measured. It is written as
// JSON (report.json), as a Markdown table (report.md) and as PNG plots of
// its curves.
type Report struct {
	Schema    int       `json:"schema"`
	StartedAt time.Time `json:"startedAt"`
	TookSec   float64   `json:"tookSec"`
	Command   string    `json:"command"` // the exact command line that produced it
	Git       string    `json:"git"`     // revision of the spore binary (+"-dirty")
	Machine   Machine   `json:"machine"`
	Settings  Settings  `json:"settings"`
	Ops       []Op      `json:"ops"`
	Curves    []Curve   `json:"curves"`
	Density   *Density  `json:"density,omitempty"`
	Notes     []string  `json:"notes,omitempty"` // what was skipped and why, caveats
}

// Machine describes the host the numbers come from.
type Machine struct {
	Hostname    string `json:"hostname"`
	Kernel      string `json:"kernel"`
	CPUModel    string `json:"cpuModel"`
	CPUs        int    `json:"cpus"`
	MemoryBytes int64  `json:"memoryBytes"`
	GoVersion   string `json:"goVersion"`
	Runsc       string `json:"runsc"`    // runsc version
	Platform    string `json:"platform"` // gVisor platform (systrap)
	Cgroups     string `json:"cgroups"`  // v1 | v2
}

// Settings are the knobs of the run.
type Settings struct {
	Target   string `json:"target"` // API URL measured
	Local    bool   `json:"local"`  // the bench started its own server
	Count    int    `json:"count"`  // repetitions per latency op
	PoolSize int    `json:"poolSize,omitempty"`
	// RestoreTargets: sandboxes the server keeps booted per shape,
	// waiting for an image (0: none, or not known).
	RestoreTargets int `json:"restoreTargets,omitempty"`
	// RestoreTargetsBurst: the most targets kept per shape after a burst
	// of restores of it (0: no growth, or not known).
	RestoreTargetsBurst int `json:"restoreTargetsBurst,omitempty"`
	// ReservedNetworks: sandbox networks the server keeps set up ahead
	// (0: none, or not known).
	ReservedNetworks int `json:"reservedNetworks,omitempty"`
	// ForkGapMs is the pause before each fork (Config.ForkGap).
	ForkGapMs int64 `json:"forkGapMs,omitempty"`
	// ForkReps is Config.ForkReps (0: the defaults).
	ForkReps int  `json:"forkReps,omitempty"`
	Quick    bool `json:"quick"`
}

// Stats summarises samples (milliseconds unless Op.Unit says otherwise).
type Stats struct {
	N   int     `json:"n"`
	P50 float64 `json:"p50"`
	// P90 is absent (0) in reports written before it was added.
	P90  float64 `json:"p90,omitempty"`
	P95  float64 `json:"p95"`
	Max  float64 `json:"max"`
	Min  float64 `json:"min"`
	Mean float64 `json:"mean"`
}

// Op is one measured operation.
type Op struct {
	Name    string    `json:"name"`    // "snapshot", "fork n=10", ...
	Group   string    `json:"group"`   // lifecycle | fork | data | runtime
	Unit    string    `json:"unit"`    // "ms" or "MB/s"
	Samples []float64 `json:"samples"` // in Unit, in the order taken
	Stats   Stats     `json:"stats"`
	// Bare is the same operation done with bare runsc in the same run
	// (BareName says which command), and Ratio = Stats.P50 / Bare.P50.
	BareName string  `json:"bareName,omitempty"`
	Bare     *Stats  `json:"bare,omitempty"`
	Ratio    float64 `json:"ratio,omitempty"`
	// Parts break the operation down (server-side phases from the API's
	// Server-Timing header, the source's pause for a snapshot, ...).
	Parts map[string]Stats `json:"parts,omitempty"`
	// Goal is the target p50 in Unit (0: none); Met says whether p50 met it
	// (for MB/s higher is better, for ms lower).
	Goal float64 `json:"goal,omitempty"`
	Met  *bool   `json:"met,omitempty"`
	Note string  `json:"note,omitempty"`
}

// Curve is one scaling plot: one or more series of points.
type Curve struct {
	Name   string   `json:"name"` // file-name friendly: "snapshot-vs-memory"
	Title  string   `json:"title"`
	XLabel string   `json:"xLabel"`
	YLabel string   `json:"yLabel"`
	Series []Series `json:"series"`
}

// Series is one line of a curve.
type Series struct {
	Name   string  `json:"name"`
	Points []Point `json:"points"`
}

// Point is one x with the statistics of the samples taken there.
type Point struct {
	X     float64 `json:"x"`
	Stats Stats   `json:"stats"`
}

// Density is how many idle sandboxes the host holds.
type Density struct {
	// IdleRSSBytes is the resident memory one idle sandbox costs the host
	// (the drop in MemAvailable per sandbox while filling), and
	// CgroupBytes what its memory cgroup charged (mean).
	IdleRSSBytes int64 `json:"idleRSSBytes"`
	CgroupBytes  int64 `json:"cgroupBytes,omitempty"`
	// Held is how many idle sandboxes ran at once; Refused is the error of
	// the create that was turned away ("" when the run stopped at Max).
	Held    int    `json:"held"`
	Max     int    `json:"max"`
	Refused string `json:"refused,omitempty"`
	// MemAvailable before the fill, and its lowest: read with every
	// sandbox of the fill running (after they settle), the fill's fullest
	// point.
	// Reports before 2026-11-30 called the latter "memAvailablePeak";
	// UnmarshalJSON still reads it.
	MemAvailableStart int64   `json:"memAvailableStart"`
	MinMemAvailable   int64   `json:"minMemAvailable"`
	TookSec           float64 `json:"tookSec"`
	// Projected is how many would fit in the host's memory at IdleRSSBytes
	// each when the run stopped before a refusal.
	Projected int `json:"projected,omitempty"`
}

// UnmarshalJSON reads a density section, including one written under the
// old, misleading name of MinMemAvailable ("memAvailablePeak").
func (d *Density) UnmarshalJSON(b []byte) error {
	type plain Density // no methods: no recursion
	var v struct {
		plain
		OldMin *int64 `json:"memAvailablePeak"`
	}
	if err := json.Unmarshal(b, &v); err != nil {
		return err
	}
	*d = Density(v.plain)
	if v.OldMin != nil && d.MinMemAvailable == 0 {
		d.MinMemAvailable = *v.OldMin
	}
	return nil
}

// Summarize computes the statistics of samples (nearest-rank percentiles).
func Summarize(samples []float64) Stats {
	if len(samples) == 0 {
		return Stats{}
	}
	s := slices.Clone(samples)
	slices.Sort(s)
	var sum float64
	for _, v := range s {
		sum += v
	}
	return Stats{N: len(s), P50: rank(s, 0.50), P90: rank(s, 0.90), P95: rank(s, 0.95), Max: s[len(s)-1], Min: s[0], Mean: sum / float64(len(s))}
}

func rank(sorted []float64, p float64) float64 {
	i := int(math.Ceil(p*float64(len(sorted)))) - 1
	return sorted[max(0, min(i, len(sorted)-1))]
}

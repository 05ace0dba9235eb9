// Package bench measures Spore the way users meet it: every operation
// through the API (and the sandboxes' daemons through the proxy), each
// beside the bare runsc command it sits on, plus scaling curves and host
// density. `spore bench` drives it; the report is JSON, Markdown and PNG.
package bench

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"maps"
	"math"
	"net/http"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/spore-run/spore/internal/api"
	"github.com/spore-run/spore/internal/client"
	"github.com/spore-run/spore/internal/progress"
	"github.com/spore-run/spore/internal/timing"
)

// Sections a run can be limited to.
const (
	SectionOps        = "ops"        // latency of each operation
	SectionFork       = "fork"       // fork n = 1, 10, 50, 100
	SectionMemory     = "memory"     // snapshot/restore against memory dirtied
	SectionThroughput = "throughput" // create throughput with 1, 4, 16 clients
	SectionDensity    = "density"    // idle sandboxes until a create is refused
)

// AllSections in the order they run.
var AllSections = []string{SectionOps, SectionFork, SectionMemory, SectionThroughput, SectionDensity}

// Goals are the p50 targets of this 2-core machine (ms).
var Goals = map[string]float64{
	"create from template":                      50,
	"create from template: cold (no warm pool)": 80, // issue 15's goals from here
	"create from snapshot":                      80,
	"snapshot":                                  40,
	"snapshot: source paused":                   25,
	"restore":                                   150,
	"rollback":                                  100,
	"pause":                                     30,
	"resume":                                    30,
	`commands.run("true")`:                      10,
	`commands.run("true"), 100ms apart`:         10,
	"fork n=10":                                 600,
	"fork n=100":                                6000,
}

// Config configures a run.
type Config struct {
	Client *client.Client
	Target string // API URL, for the report
	Local  bool   // the bench started the server itself
	// Count is how many times each latency operation is repeated
	// (default 20). Quick shrinks counts and curves to a smoke test.
	Count int
	Quick bool
	// Bare enables the bare-runsc comparisons; they need this host's
	// runsc and the server's data directory. Nil skips them (noted).
	Bare *Bare
	// Sections to run (default AllSections).
	Sections []string
	// DensityMax stops the density fill after this many sandboxes
	// (0: until a create is refused, at most 4000).
	DensityMax int
	// ForkLevels are the fork section's n (default 1, 10, 50, 100).
	ForkLevels []int
	// ForkReps is how many forks of each n > 1 are timed (0: 3 for n ≤ 10,
	// 1 above). One fork of 100 is one sample: on a noisy machine several
	// make its p50 firmer.
	ForkReps int
	// ForkGap is the pause before each fork, so that the server's restore
	// targets are made again between forks (0: none, forks back to back).
	ForkGap time.Duration
	// CgroupParent of the server's sandboxes, for per-sandbox memory.
	CgroupParent string
	PoolSize     int
	// RestoreTargets is the server's restore targets per shape (0: none
	// or unknown), reported in the settings.
	RestoreTargets int
	// RestoreTargetsBurst is the most restore targets the server keeps per
	// shape after a burst of restores (0: no growth or unknown), reported
	// in the settings.
	RestoreTargetsBurst int
	// ReservedNetworks is the server's networks set up ahead (0: none or
	// unknown), reported in the settings.
	ReservedNetworks int
	// Notes are added to the report's notes (settings worth knowing).
	Notes        []string
	Progress     io.Writer // progress display (nil: none)
	Command, Git string
	Log          *slog.Logger
}

// Run measures and returns the report. A failing operation ends the run
// with an error: numbers from a half-broken system would mislead.
func Run(ctx context.Context, cfg Config) (*Report, error) {
	if cfg.Count <= 0 {
		cfg.Count = 20
		if cfg.Quick {
			cfg.Count = 2
		}
	}
	if len(cfg.Sections) == 0 {
		cfg.Sections = AllSections
	}
	for _, s := range cfg.Sections {
		if !slices.Contains(AllSections, s) {
			return nil, fmt.Errorf("unknown section %q (known: %s)", s, strings.Join(AllSections, ", "))
		}
	}
	if cfg.Log == nil {
		cfg.Log = slog.New(slog.DiscardHandler)
	}
	if cfg.Progress == nil {
		cfg.Progress = io.Discard
	}
	r := &runner{cfg: cfg, c: cfg.Client, ops: map[string]*Op{}}
	r.rep = &Report{
		Schema: SchemaVersion, StartedAt: time.Now().UTC(), Command: cfg.Command, Git: cfg.Git,
		Machine:  machineInfo(cfg.Bare),
		Settings: Settings{Target: cfg.Target, Local: cfg.Local, Count: cfg.Count, PoolSize: cfg.PoolSize, RestoreTargets: cfg.RestoreTargets, RestoreTargetsBurst: cfg.RestoreTargetsBurst, ReservedNetworks: cfg.ReservedNetworks, ForkGapMs: cfg.ForkGap.Milliseconds(), ForkReps: cfg.ForkReps, Quick: cfg.Quick},
	}
	r.rep.Notes = append(r.rep.Notes, cfg.Notes...)
	if cfg.Bare == nil {
		r.note("bare runsc comparisons skipped: they need this host's runsc and the server's data directory (--data-dir)")
	}
	steps := map[string]func(context.Context) error{
		SectionOps: r.runOps, SectionFork: r.runFork, SectionMemory: r.runMemory,
		SectionThroughput: r.runThroughput, SectionDensity: r.runDensity,
	}
	r.bar = progress.New(cfg.Progress, len(cfg.Sections), "spore bench")
	defer r.cleanup()
	for _, s := range AllSections {
		if !slices.Contains(cfg.Sections, s) {
			continue
		}
		r.bar.Step(s)
		t0 := time.Now()
		if err := steps[s](ctx); err != nil {
			return nil, fmt.Errorf("bench %s: %w", s, err)
		}
		r.bar.StepDone(fmt.Sprintf("%s done in %v", s, time.Since(t0).Round(time.Millisecond)))
	}
	r.finish()
	r.rep.TookSec = time.Since(r.rep.StartedAt).Seconds()
	return r.rep, nil
}

type runner struct {
	cfg   Config
	c     *client.Client
	rep   *Report
	bar   *progress.Bar
	ops   map[string]*Op // by name, in rep.Ops order
	order []string
	parts map[string]partSamples // server-side phases per op
	// counts are how many times each phase happened per op, over all its
	// samples (a fork's restores, say).
	counts map[string]map[string]int
	// live sandboxes and snapshots this run made, freed at the end even
	// when the run fails (mu guards sandboxes: clients create concurrently).
	mu        sync.Mutex
	sandboxes map[string]bool
	snapshots map[string]bool
}

func (r *runner) note(format string, args ...any) {
	r.rep.Notes = append(r.rep.Notes, fmt.Sprintf(format, args...))
}

func (r *runner) detail(format string, args ...any) { r.bar.Detail(fmt.Sprintf(format, args...)) }

// op returns the named op, creating it (in first-use order).
func (r *runner) op(name, group, unit string) *Op {
	if o, ok := r.ops[name]; ok {
		return o
	}
	o := &Op{Name: name, Group: group, Unit: unit}
	r.ops[name] = o
	r.order = append(r.order, name)
	return o
}

// parts accumulates server-side phases per op until finish.
type partSamples map[string][]float64

func (r *runner) addParts(name string, parts map[string]float64) {
	if r.parts == nil {
		r.parts = map[string]partSamples{}
	}
	ps := r.parts[name]
	if ps == nil {
		ps = partSamples{}
		r.parts[name] = ps
	}
	for k, v := range parts {
		if k == "total" {
			continue
		}
		if c, ok := strings.CutSuffix(k, countSuffix); ok {
			if r.counts == nil {
				r.counts = map[string]map[string]int{}
			}
			if r.counts[name] == nil {
				r.counts[name] = map[string]int{}
			}
			r.counts[name][c] += int(v)
			continue
		}
		ps[k] = append(ps[k], v)
	}
	// The server's time outside its node calls ("node": the time inside
	// the node's methods, the same code in process and behind a node
	// agent): the control plane, the store and, in a fleet, the hop. It
	// leaves the runtime's spread out, so a fleet and `spore up` compare
	// on what differs between them.
	if total, ok := parts["total"]; ok {
		if node, ok := parts["node"]; ok {
			ps[PartOutsideNode] = append(ps[PartOutsideNode], round(total-node, 3))
		}
	}
	// The RPC hop alone: the API's call to a remote node minus the time
	// inside the node's method (absent in process, where there is none).
	if rpc, ok := parts["node-rpc"]; ok {
		if node, ok := parts["node"]; ok {
			ps[PartHop] = append(ps[PartHop], round(rpc-node, 3))
		}
	}
}

// PartHop is the derived phase: a remote node call's time minus the
// node's own ("node-rpc" − "node").
const PartHop = "the RPC hop"

// PartOutsideNode is the derived phase: the server's total minus its time
// inside node calls.
const PartOutsideNode = "outside the node"

// finish computes the statistics, bare ratios and goals.
func (r *runner) finish() {
	for _, name := range r.order {
		o := r.ops[name]
		o.Stats = Summarize(o.Samples)
		if ps := r.parts[name]; len(ps) > 0 {
			o.Parts = map[string]Stats{}
			for k, v := range ps {
				o.Parts[k] = Summarize(v)
			}
		}
		if o.Bare != nil && o.Bare.P50 > 0 {
			o.Ratio = round(o.Stats.P50/o.Bare.P50, 3)
		}
		if n := r.counts[name]["target"]; n > 0 {
			o.Note = strings.TrimPrefix(o.Note+fmt.Sprintf("; %d of %d restores loaded into a restore target (a sandbox the server booted ahead for the shape: Server-Timing target)", n, max(n, r.counts[name]["restore"])), "; ")
		}
		if g, ok := Goals[name]; ok && o.Stats.N > 0 {
			o.Goal = g
			met := o.Stats.P50 < g
			o.Met = &met
		}
		r.rep.Ops = append(r.rep.Ops, *o)
	}
}

func round(v float64, digits int) float64 {
	p := math.Pow10(digits)
	return math.Round(v*p) / p
}

func ms(d time.Duration) float64 { return float64(d.Microseconds()) / 1000 }

// countSuffix marks, in the phases timed returns, how many times a phase
// happened (its name plus the suffix; addParts keeps them apart).
const countSuffix = "#n"

// timed runs fn with a context that captures the API's Server-Timing
// phases and returns fn's wall time in ms and the phases.
func timed(ctx context.Context, fn func(ctx context.Context) error) (float64, map[string]float64, error) {
	var parts map[string]float64
	ctx = client.WithResponseHeaders(ctx, func(h http.Header) {
		if v := h.Get("Server-Timing"); v != "" {
			parts = timing.Parse(v)
			for k, n := range timing.ParseCounts(v) {
				parts[k+countSuffix] = float64(n)
			}
		}
	})
	t0 := time.Now()
	err := fn(ctx)
	return ms(time.Since(t0)), parts, err
}

// sample times fn and records it against op name (with its phases).
func (r *runner) sample(ctx context.Context, o *Op, fn func(ctx context.Context) error) (float64, error) {
	v, parts, err := timed(ctx, fn)
	if err != nil {
		return 0, fmt.Errorf("%s: %w", o.Name, err)
	}
	o.Samples = append(o.Samples, round(v, 3))
	r.addParts(o.Name, parts)
	r.detail("%s %d: %.1f ms", o.Name, len(o.Samples), v)
	return v, nil
}

// create starts a sandbox the run owns.
func (r *runner) create(ctx context.Context, req api.CreateRequest) (string, error) {
	if req.Timeout == nil {
		t := int64(3600)
		req.Timeout = &t
	}
	sr, err := r.c.Create(ctx, req)
	if err != nil {
		return "", err
	}
	r.own(sr.SandboxID)
	return sr.SandboxID, nil
}

// own records a sandbox the run must free (safe from concurrent clients).
func (r *runner) own(id string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.sandboxes == nil {
		r.sandboxes = map[string]bool{}
	}
	r.sandboxes[id] = true
}

func (r *runner) disown(ids ...string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	for _, id := range ids {
		delete(r.sandboxes, id)
	}
}

func (r *runner) kill(ctx context.Context, id string) error {
	r.disown(id)
	return r.c.Kill(ctx, id)
}

func (r *runner) snapshot(ctx context.Context, id string) (api.SnapshotInfo, error) {
	si, err := r.c.Snapshot(ctx, id, "", false)
	if err == nil {
		if r.snapshots == nil {
			r.snapshots = map[string]bool{}
		}
		r.snapshots[si.SnapshotID] = true
	}
	return si, err
}

func (r *runner) deleteSnapshot(ctx context.Context, id string) error {
	delete(r.snapshots, id)
	return r.c.DeleteTemplate(ctx, id)
}

// killAll kills sandboxes with a few workers.
func (r *runner) killAll(ctx context.Context, list []string) error {
	errs := parallel(ctx, len(list), 4, func(ctx context.Context, i int) error { return r.c.Kill(ctx, list[i]) })
	r.disown(list...)
	return errs
}

// cleanup frees whatever the run still owns.
func (r *runner) cleanup() {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	r.mu.Lock()
	ids := slices.Sorted(maps.Keys(r.sandboxes))
	r.mu.Unlock()
	if err := r.killAll(ctx, ids); err != nil {
		r.cfg.Log.Warn("bench cleanup: kill", "err", err)
	}
	for id := range r.snapshots {
		if err := r.c.DeleteTemplate(ctx, id); err != nil {
			r.cfg.Log.Warn("bench cleanup: delete snapshot", "snapshot", id, "err", err)
		}
	}
}

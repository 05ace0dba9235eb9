// Package teammetrics keeps each team's metrics over time and shapes them
// for E2B's team metrics routes (GET /teams/{teamID}/metrics and
// /metrics/max; docs/teams.md, "Team metrics").
//
// Every API replica samples the store each Step: the sandboxes each team
// has holding a host now (store.LiveSandboxes, the sandboxes quota's
// count) go into the current step, and the sandboxes each team started
// (the audit trail's sandbox.created: creates, fork children, pooled
// sandboxes claimed) into the steps that ended at least Settle ago, when
// every replica's audit writer has flushed them. The store merges
// samples by the larger figure, so replicas sampling the same step agree
// and one replica alone is enough; with none running, nothing is
// sampled, and such steps read as zero. A team with nothing to report in
// a step writes nothing.
package teammetrics

import (
	"context"
	"fmt"
	"log/slog"
	"time"

	"github.com/spore-run/spore/internal/errdefs"
	"github.com/spore-run/spore/internal/store"
)

const (
	// Step is the sampling step: the finest grain of the series.
	Step = 10 * time.Second
	// Settle is how long after a step ends its starts are counted (the
	// audit writers flush every 100 ms and retry for a few seconds).
	Settle = 5 * time.Second
	// DefaultRetention is how long samples are kept.
	DefaultRetention = 30 * 24 * time.Hour
	// MaxPoints bounds a series: a longer range is given in coarser
	// buckets (a whole number of steps each).
	MaxPoints = 1000
	// Created is the audit action counted as a start.
	Created = "sandbox.created"
)

// Store is what the sampler and the queries use.
type Store interface {
	store.TeamMetrics
}

// floor is the start of the step holding t.
func floor(t time.Time) time.Time { return t.Truncate(Step).UTC() }

// SampleOnce takes one sample at now: the live sandboxes into now's step,
// the starts of the two latest steps that ended at least Settle ago (the
// one before too, so a missed tick loses nothing).
func SampleOnce(ctx context.Context, st Store, now time.Time) error {
	live, err := st.LiveSandboxes(ctx)
	if err != nil {
		return err
	}
	var samples []store.TeamSample
	at := floor(now)
	for team, n := range live {
		samples = append(samples, store.TeamSample{TeamID: team, At: at, Concurrent: n})
	}
	last := floor(now.Add(-Settle)).Add(-Step) // the latest step that ended Settle ago
	for _, from := range []time.Time{last.Add(-Step), last} {
		starts, err := st.CountAuditActions(ctx, Created, from, from.Add(Step))
		if err != nil {
			return err
		}
		for team, n := range starts {
			if team != "" {
				samples = append(samples, store.TeamSample{TeamID: team, At: from, Starts: n})
			}
		}
	}
	return st.NoteTeamSamples(ctx, samples)
}

// Run samples every Step and prunes samples older than retention (<= 0:
// DefaultRetention) every hour, until ctx ends. now is the clock
// (time.Now when nil).
func Run(ctx context.Context, st Store, retention time.Duration, now func() time.Time, log *slog.Logger) {
	if now == nil {
		now = time.Now
	}
	if retention <= 0 {
		retention = DefaultRetention
	}
	tick := time.NewTicker(Step)
	defer tick.Stop()
	var pruned time.Time
	for {
		if err := SampleOnce(ctx, st, now()); err != nil && ctx.Err() == nil && log != nil {
			log.Warn("team metrics: sample failed", "err", err)
		}
		if t := now(); t.Sub(pruned) >= time.Hour {
			if _, err := st.PruneTeamSamples(ctx, t.Add(-retention)); err != nil && ctx.Err() == nil && log != nil {
				log.Warn("team metrics: prune failed", "err", err)
			}
			pruned = t
		}
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
		}
	}
}

// Point is one point of a team's series, in E2B's TeamMetric shape.
type Point struct {
	TimestampUnix       int64   `json:"timestampUnix"`
	Timestamp           string  `json:"timestamp"` // RFC 3339 (E2B keeps it, deprecated)
	ConcurrentSandboxes int     `json:"concurrentSandboxes"`
	SandboxStartRate    float64 `json:"sandboxStartRate"` // sandboxes started per second
}

// Max is E2B's MaxTeamMetric: the largest value of one metric in a range
// and when it was reached (the range's start when nothing was sampled).
type Max struct {
	TimestampUnix int64   `json:"timestampUnix"`
	Timestamp     string  `json:"timestamp"`
	Value         float64 `json:"value"`
}

// Metric names of the max route.
const (
	MetricConcurrent = "concurrent_sandboxes"
	MetricStartRate  = "sandbox_start_rate"
)

// Range checks a query's range [start, end] (unix seconds; end 0: now;
// start 0: an hour before end) and returns it as step-aligned times, end
// exclusive and no later than the step after now's. Errors are
// ErrInvalidArgument.
func Range(start, end int64, now time.Time) (from, to time.Time, err error) {
	if start < 0 || end < 0 {
		return from, to, errdefs.Invalidf("start and end are unix times in seconds, not negative")
	}
	if end == 0 {
		end = now.Unix()
	}
	if start == 0 {
		start = end - int64(time.Hour/time.Second)
	}
	if start > end {
		return from, to, errdefs.Invalidf("start %d is after end %d", start, end)
	}
	if max := int64(DefaultRetention / time.Second); end-start > max {
		return from, to, errdefs.Invalidf("the range is %d s: at most %d s (30 days)", end-start, max)
	}
	from = floor(time.Unix(start, 0))
	to = floor(time.Unix(end, 0)).Add(Step)
	if limit := floor(now).Add(Step); to.After(limit) {
		to = limit
	}
	if !to.After(from) {
		to = from
	}
	return from, to, nil
}

// Series is team's series over [from, to) (from Range): one point per
// bucket of whole steps (one step, or coarser when the range holds more
// than MaxPoints), a bucket's concurrency the largest sampled in it and
// its start rate its starts per second; steps without a sample read as
// zero.
func Series(ctx context.Context, st Store, team string, from, to time.Time) ([]Point, error) {
	steps := int(to.Sub(from) / Step)
	per := max(1, (steps+MaxPoints-1)/MaxPoints) // steps per bucket
	bucket := time.Duration(per) * Step
	samples, err := st.ListTeamSamples(ctx, team, from, to, bucket)
	if err != nil {
		return nil, err
	}
	n := (steps + per - 1) / per
	out := make([]Point, n)
	for i := range out {
		at := from.Add(time.Duration(i) * bucket)
		out[i] = Point{TimestampUnix: at.Unix(), Timestamp: at.Format(time.RFC3339)}
	}
	for _, x := range samples {
		i := int(x.At.Sub(from) / bucket)
		if i < 0 || i >= n {
			continue
		}
		// The last bucket may hold fewer steps than the others.
		secs := min(bucket, to.Sub(x.At)).Seconds()
		out[i].ConcurrentSandboxes = x.Concurrent
		out[i].SandboxStartRate = float64(x.Starts) / secs
	}
	return out, nil
}

// MaxOf is the largest value of metric (MetricConcurrent, or
// MetricStartRate: per second over a step) in team's samples over [from,
// to), and the step it was reached in (the first, on a tie); the range's
// start and 0 when nothing was sampled.
func MaxOf(ctx context.Context, st Store, team, metric string, from, to time.Time) (Max, error) {
	figure := map[string]string{MetricConcurrent: store.TeamConcurrent, MetricStartRate: store.TeamStarts}[metric]
	if figure == "" {
		return Max{}, errdefs.Invalidf("metric %q: want %s or %s", metric, MetricConcurrent, MetricStartRate)
	}
	x, ok, err := st.TopTeamSample(ctx, team, from, to, figure)
	if err != nil {
		return Max{}, fmt.Errorf("team %s: metrics: %w", team, err)
	}
	if !ok {
		return Max{TimestampUnix: from.Unix(), Timestamp: from.Format(time.RFC3339)}, nil
	}
	v := float64(x.Concurrent)
	if metric == MetricStartRate {
		v = float64(x.Starts) / Step.Seconds()
	}
	return Max{TimestampUnix: x.At.Unix(), Timestamp: x.At.Format(time.RFC3339), Value: v}, nil
}

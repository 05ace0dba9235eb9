package teammetrics_test

import (
	"context"
	"path/filepath"
	"testing"
	"time"

	"github.com/spore-run/spore/internal/errdefs"
	"github.com/spore-run/spore/internal/store"
	"github.com/spore-run/spore/internal/store/sqlite"
	"github.com/spore-run/spore/internal/teammetrics"
)

func open(t testing.TB) *sqlite.DB {
	t.Helper()
	st, err := sqlite.Open(context.Background(), filepath.Join(t.TempDir(), "spore.db"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { st.Close() })
	return st
}

var t0 = time.Date(2026, 12, 5, 12, 0, 0, 0, time.UTC)

// Samples taken by two "replicas" at different instants of the same steps
// give one series: the live count of each step, the starts of each
// settled step counted once, nothing for a team without either; the
// series' points are per step, zero where nothing was sampled, and its
// start rate is per second.
func TestSampleAndSeries(t *testing.T) {
	ctx := context.Background()
	st := open(t)
	if err := st.CreateTeam(ctx, store.Team{ID: "ta", Name: "a"}); err != nil {
		t.Fatal(err)
	}
	if err := st.CreateTeam(ctx, store.Team{ID: "tb", Name: "b"}); err != nil {
		t.Fatal(err)
	}
	box := func(id, team string) {
		if err := st.CreateSandbox(ctx, store.Sandbox{ID: id, TeamID: team, TemplateID: "base", State: store.StateRunning, CPUCount: 1, MemoryMB: 256}); err != nil {
			t.Fatal(err)
		}
	}
	box("s1", "ta")
	box("s2", "ta")
	var recs []store.AuditRecord
	for i, at := range []time.Duration{1 * time.Second, 4 * time.Second, 12 * time.Second} { // steps 0, 0, 1
		recs = append(recs, store.AuditRecord{At: t0.Add(at), TeamID: "ta", Kind: store.AuditSandbox, Action: teammetrics.Created, Resource: string(rune('x' + i))})
	}
	recs = append(recs, store.AuditRecord{At: t0.Add(3 * time.Second), TeamID: "ta", Kind: store.AuditSandbox, Action: "sandbox.killed", Resource: "x"})
	if err := st.AppendAudit(ctx, recs); err != nil {
		t.Fatal(err)
	}
	// At 3 s (step 0): two live; no step settled yet.
	if err := teammetrics.SampleOnce(ctx, st, t0.Add(3*time.Second)); err != nil {
		t.Fatal(err)
	}
	box("s3", "ta")
	// At 27 s (step 2): three live; steps 0 and 1 settled (ended 5 s ago or more).
	for _, at := range []time.Duration{27 * time.Second, 28 * time.Second} { // two replicas
		if err := teammetrics.SampleOnce(ctx, st, t0.Add(at)); err != nil {
			t.Fatal(err)
		}
	}
	from, to, err := teammetrics.Range(t0.Unix(), t0.Add(35*time.Second).Unix(), t0.Add(29*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	if !from.Equal(t0) || !to.Equal(t0.Add(30*time.Second)) {
		t.Fatalf("range [%s, %s): want steps 0-2 (clipped to now's step)", from, to)
	}
	pts, err := teammetrics.Series(ctx, st, "ta", from, to)
	if err != nil {
		t.Fatal(err)
	}
	want := []teammetrics.Point{
		{TimestampUnix: t0.Unix(), ConcurrentSandboxes: 2, SandboxStartRate: 0.2},
		{TimestampUnix: t0.Unix() + 10, ConcurrentSandboxes: 0, SandboxStartRate: 0.1},
		{TimestampUnix: t0.Unix() + 20, ConcurrentSandboxes: 3, SandboxStartRate: 0},
	}
	if len(pts) != len(want) {
		t.Fatalf("series %+v", pts)
	}
	for i := range want {
		if pts[i].TimestampUnix != want[i].TimestampUnix || pts[i].ConcurrentSandboxes != want[i].ConcurrentSandboxes || pts[i].SandboxStartRate != want[i].SandboxStartRate {
			t.Fatalf("point %d = %+v, want %+v", i, pts[i], want[i])
		}
		if pts[i].Timestamp != time.Unix(pts[i].TimestampUnix, 0).UTC().Format(time.RFC3339) {
			t.Fatalf("point %d's timestamp %q", i, pts[i].Timestamp)
		}
	}
	if pts, _ := teammetrics.Series(ctx, st, "tb", from, to); len(pts) != 3 || pts[0].ConcurrentSandboxes != 0 || pts[2].SandboxStartRate != 0 {
		t.Fatalf("team b (nothing) %+v", pts)
	}
	for metric, want := range map[string]teammetrics.Max{
		teammetrics.MetricConcurrent: {TimestampUnix: t0.Unix() + 20, Value: 3},
		teammetrics.MetricStartRate:  {TimestampUnix: t0.Unix(), Value: 0.2},
	} {
		got, err := teammetrics.MaxOf(ctx, st, "ta", metric, from, to)
		if err != nil || got.TimestampUnix != want.TimestampUnix || got.Value != want.Value {
			t.Fatalf("max %s = %+v, %v; want %+v", metric, got, err, want)
		}
	}
	if got, err := teammetrics.MaxOf(ctx, st, "tb", teammetrics.MetricConcurrent, from, to); err != nil || got.Value != 0 || got.TimestampUnix != from.Unix() {
		t.Fatalf("max of nothing = %+v, %v", got, err)
	}
	if _, err := teammetrics.MaxOf(ctx, st, "ta", "cpu", from, to); !errdefs.IsInvalidArgument(err) {
		t.Fatalf("an unknown metric: %v", err)
	}
}

// A long range comes in at most MaxPoints buckets of whole steps, each
// with its steps' largest concurrency and their starts per second.
func TestSeriesBuckets(t *testing.T) {
	ctx := context.Background()
	st := open(t)
	if err := st.CreateTeam(ctx, store.Team{ID: "ta", Name: "a"}); err != nil {
		t.Fatal(err)
	}
	day := 24 * time.Hour
	var samples []store.TeamSample
	for i := range 8640 { // a day of steps
		samples = append(samples, store.TeamSample{TeamID: "ta", At: t0.Add(time.Duration(i) * teammetrics.Step), Concurrent: i % 100, Starts: 1})
	}
	if err := st.NoteTeamSamples(ctx, samples); err != nil {
		t.Fatal(err)
	}
	from, to, err := teammetrics.Range(t0.Unix(), t0.Add(day).Unix()-1, t0.Add(2*day))
	if err != nil {
		t.Fatal(err)
	}
	pts, err := teammetrics.Series(ctx, st, "ta", from, to)
	if err != nil {
		t.Fatal(err)
	}
	// 8640 steps in buckets of 9 steps (90 s): 960 points.
	if len(pts) != 960 || pts[1].TimestampUnix-pts[0].TimestampUnix != 90 {
		t.Fatalf("%d points, %d s apart", len(pts), pts[1].TimestampUnix-pts[0].TimestampUnix)
	}
	for i, p := range pts[:20] {
		if want := min(99, (i*9+8)%100); p.ConcurrentSandboxes != want && i*9/100 == (i*9+8)/100 {
			t.Fatalf("point %d concurrency %d, want %d", i, p.ConcurrentSandboxes, want)
		}
		if p.SandboxStartRate != 0.1 {
			t.Fatalf("point %d start rate %v, want 0.1 (9 starts in 90 s)", i, p.SandboxStartRate)
		}
	}
}

// Bad ranges are refused; an open range is the last hour up to now.
func TestRange(t *testing.T) {
	now := t0.Add(5 * time.Second)
	for _, c := range []struct{ start, end int64 }{
		{-1, 0}, {0, -5}, {now.Unix(), now.Unix() - 60}, {now.Unix() - 40*86400, now.Unix()},
	} {
		if _, _, err := teammetrics.Range(c.start, c.end, now); !errdefs.IsInvalidArgument(err) {
			t.Errorf("range %d..%d: %v, want invalid", c.start, c.end, err)
		}
	}
	from, to, err := teammetrics.Range(0, 0, now)
	if err != nil || !from.Equal(t0.Add(-time.Hour)) || !to.Equal(t0.Add(teammetrics.Step)) {
		t.Fatalf("open range [%s, %s) %v", from, to, err)
	}
}

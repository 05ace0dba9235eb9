package storetest

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/spore-run/spore/internal/errdefs"
	"github.com/spore-run/spore/internal/store"
)

// testTeamMetrics: the census counts sandboxes by node and state, the
// warm pool by template, snapshots by kind and storage; live sandboxes
// are counted per team (creating,
// running, paused; not hibernated, not pooled); audit actions are
// counted per team within [since, until); samples merge by the larger
// value per figure, read back oldest first within [since, until), and
// prune by age; deleting a team drops its samples.
func testTeamMetrics(t *testing.T, s store.Store) {
	ctx := context.Background()
	for _, id := range []string{teamA, teamB} {
		if err := s.CreateTeam(ctx, store.Team{ID: id, Name: "metrics-" + id}); err != nil {
			t.Fatal(err)
		}
	}
	boxes := []struct {
		id, team string
		state    string
		template string
	}{
		{"m1", teamA, store.StateRunning, ""}, {"m2", teamA, store.StatePaused, ""}, {"m3", teamA, store.StateCreating, ""},
		{"m4", teamA, store.StateHibernated, ""}, {"m5", teamB, store.StateRunning, ""}, {"m6", "", store.StateRunning, ""},
		{"m7", "", store.StatePooled, "base"}, {"m8", "", store.StatePooled, "code-interpreter-v1"}, {"m9", "", store.StatePooled, "base"},
	}
	for _, b := range boxes {
		x := sb(b.id, nil)
		x.TeamID, x.State = b.team, b.state
		if b.template != "" {
			x.TemplateID = b.template
		}
		if err := s.CreateSandbox(ctx, x); err != nil {
			t.Fatalf("%s: %v", b.id, err)
		}
	}
	live, err := s.LiveSandboxes(ctx)
	if err != nil || len(live) != 2 || live[teamA] != 3 || live[teamB] != 1 {
		t.Fatalf("live sandboxes %v, %v: want %s 3, %s 1", live, err, teamA, teamB)
	}

	// The census: sandboxes by node and state, snapshots by kind and
	// storage with their bytes.
	for i, sn := range []store.Snapshot{
		{ID: "cs1", TeamID: teamA, NodeID: "local", Kind: "snapshot", SizeBytes: 100},
		{ID: "cs2", TeamID: teamA, NodeID: "local", Kind: "snapshot", SizeBytes: 50, Storage: store.StorageDurable},
		{ID: "cs3", TeamID: teamB, NodeID: "local", Kind: "snapshot", SizeBytes: 25, Storage: store.StorageDurable},
	} {
		if err := s.PutSnapshot(ctx, sn); err != nil {
			t.Fatalf("snapshot %d: %v", i, err)
		}
	}
	c, err := s.Census(ctx)
	if err != nil {
		t.Fatal(err)
	}
	wantBoxes := []store.SandboxCount{{NodeID: "local", State: store.StateCreating, N: 1}, {NodeID: "local", State: store.StateHibernated, N: 1},
		{NodeID: "local", State: store.StatePaused, N: 1}, {NodeID: "local", State: store.StatePooled, N: 3}, {NodeID: "local", State: store.StateRunning, N: 3}}
	if fmt.Sprint(c.Sandboxes) != fmt.Sprint(wantBoxes) {
		t.Fatalf("census of sandboxes %v, want %v", c.Sandboxes, wantBoxes)
	}
	wantPooled := []store.PooledCount{{TemplateID: "base", N: 2}, {TemplateID: "code-interpreter-v1", N: 1}}
	if fmt.Sprint(c.Pooled) != fmt.Sprint(wantPooled) {
		t.Fatalf("census of the warm pool %v, want %v", c.Pooled, wantPooled)
	}
	wantSnaps := []store.SnapshotCount{{Kind: "snapshot", N: 1, Bytes: 100}, {Kind: "snapshot", Storage: store.StorageDurable, N: 2, Bytes: 75}}
	if fmt.Sprint(c.Snapshots) != fmt.Sprint(wantSnaps) {
		t.Fatalf("census of snapshots %v, want %v", c.Snapshots, wantSnaps)
	}
	for _, id := range []string{"cs1", "cs2", "cs3"} {
		if err := s.DeleteSnapshot(ctx, id); err != nil {
			t.Fatal(err)
		}
	}

	base := time.Date(2026, 12, 1, 0, 0, 0, 0, time.UTC)
	var recs []store.AuditRecord
	for i := range 12 {
		action := "sandbox.created"
		if i%4 == 3 {
			action = "sandbox.killed"
		}
		recs = append(recs, store.AuditRecord{At: base.Add(time.Duration(i) * time.Second), TeamID: []string{teamA, teamB}[i%2],
			Kind: store.AuditSandbox, Action: action, Resource: "x"})
	}
	if err := s.AppendAudit(ctx, recs); err != nil {
		t.Fatal(err)
	}
	// Seconds 2..9: created at 2 (A), 4 (A), 5 (B), 6 (A), 8 (A), 9 (B).
	got, err := s.CountAuditActions(ctx, "sandbox.created", base.Add(2*time.Second), base.Add(10*time.Second))
	if err != nil || len(got) != 2 || got[teamA] != 4 || got[teamB] != 2 {
		t.Fatalf("created in [2s, 10s): %v, %v", got, err)
	}
	if got, err := s.CountAuditActions(ctx, "sandbox.created", base.Add(time.Hour), base.Add(2*time.Hour)); err != nil || len(got) != 0 {
		t.Fatalf("nothing in an empty range: %v, %v", got, err)
	}

	step := func(i int) time.Time { return base.Add(time.Duration(i) * 10 * time.Second) }
	if err := s.NoteTeamSamples(ctx, []store.TeamSample{
		{TeamID: teamA, At: step(0), Concurrent: 3}, {TeamID: teamA, At: step(1), Concurrent: 5, Starts: 2},
		{TeamID: teamB, At: step(1), Concurrent: 1},
	}); err != nil {
		t.Fatal(err)
	}
	// Another replica's samples: larger and smaller figures, and a
	// starts-only sample of step 0.
	if err := s.NoteTeamSamples(ctx, []store.TeamSample{
		{TeamID: teamA, At: step(0), Starts: 4}, {TeamID: teamA, At: step(1), Concurrent: 4, Starts: 3},
		{TeamID: teamA, At: step(2), Concurrent: 1},
	}); err != nil {
		t.Fatal(err)
	}
	if err := s.NoteTeamSamples(ctx, nil); err != nil {
		t.Fatal(err)
	}
	samples, err := s.ListTeamSamples(ctx, teamA, step(0), step(3), 10*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	want := []store.TeamSample{
		{TeamID: teamA, At: step(0), Concurrent: 3, Starts: 4},
		{TeamID: teamA, At: step(1), Concurrent: 5, Starts: 3},
		{TeamID: teamA, At: step(2), Concurrent: 1},
	}
	if len(samples) != len(want) {
		t.Fatalf("team A's samples %+v, want %+v", samples, want)
	}
	for i := range want {
		if samples[i].TeamID != want[i].TeamID || !samples[i].At.Equal(want[i].At) || samples[i].Concurrent != want[i].Concurrent || samples[i].Starts != want[i].Starts {
			t.Fatalf("sample %d = %+v, want %+v", i, samples[i], want[i])
		}
	}
	if samples, err := s.ListTeamSamples(ctx, teamA, step(1), step(2), 10*time.Second); err != nil || len(samples) != 1 || samples[0].Concurrent != 5 {
		t.Fatalf("team A's samples in [step 1, step 2): %+v, %v", samples, err)
	}
	if samples, err := s.ListTeamSamples(ctx, teamB, step(0), step(3), 10*time.Second); err != nil || len(samples) != 1 || samples[0].Concurrent != 1 {
		t.Fatalf("team B's samples: %+v, %v", samples, err)
	}
	// Coarser buckets: the largest concurrency, the sum of starts; a
	// bucket counts from since.
	if b, err := s.ListTeamSamples(ctx, teamA, step(0), step(3), 30*time.Second); err != nil || len(b) != 1 ||
		!b[0].At.Equal(step(0)) || b[0].Concurrent != 5 || b[0].Starts != 7 {
		t.Fatalf("team A in one 30 s bucket: %+v, %v", b, err)
	}
	if b, err := s.ListTeamSamples(ctx, teamA, step(1), step(3), 20*time.Second); err != nil || len(b) != 1 ||
		!b[0].At.Equal(step(1)) || b[0].Concurrent != 5 || b[0].Starts != 3 {
		t.Fatalf("team A in one 20 s bucket from step 1: %+v, %v", b, err)
	}
	if _, err := s.ListTeamSamples(ctx, teamA, step(0), step(3), 1500*time.Millisecond); !errdefs.IsInvalidArgument(err) {
		t.Fatalf("a bucket of 1.5 s: %v", err)
	}
	if top, ok, err := s.TopTeamSample(ctx, teamA, step(0), step(3), store.TeamConcurrent); err != nil || !ok || !top.At.Equal(step(1)) || top.Concurrent != 5 {
		t.Fatalf("team A's top concurrency: %+v %v %v", top, ok, err)
	}
	if top, ok, err := s.TopTeamSample(ctx, teamA, step(0), step(3), store.TeamStarts); err != nil || !ok || !top.At.Equal(step(0)) || top.Starts != 4 {
		t.Fatalf("team A's top starts: %+v %v %v", top, ok, err)
	}
	if _, ok, err := s.TopTeamSample(ctx, teamA, step(5), step(9), store.TeamStarts); err != nil || ok {
		t.Fatalf("top of an empty range: %v %v", ok, err)
	}
	if _, _, err := s.TopTeamSample(ctx, teamA, step(0), step(3), "x; DROP TABLE team_samples"); !errdefs.IsInvalidArgument(err) {
		t.Fatalf("a figure that is none: %v", err)
	}
	if n, err := s.PruneTeamSamples(ctx, step(1)); err != nil || n != 1 {
		t.Fatalf("prune before step 1: %d, %v; want 1", n, err)
	}
	if samples, _ := s.ListTeamSamples(ctx, teamA, step(0), step(3), 10*time.Second); len(samples) != 2 {
		t.Fatalf("after the prune: %+v", samples)
	}
	// A team that is removed takes its samples along.
	if err := s.DeleteSandbox(ctx, "m5"); err != nil {
		t.Fatal(err)
	}
	if err := s.DeleteTeam(ctx, teamB, time.Now()); err != nil {
		t.Fatal(err)
	}
	if samples, err := s.ListTeamSamples(ctx, teamB, step(0), step(3), 10*time.Second); err != nil || len(samples) != 0 {
		t.Fatalf("a removed team's samples: %+v, %v", samples, err)
	}
}

package store

import (
	"context"
	"time"

	"github.com/spore-run/spore/internal/errdefs"
)

// Team metrics (docs/teams.md, "Team metrics"): E2B's team metrics
// routes answer from samples every API replica takes of the store
// (internal/teammetrics). A sample is one team's figures in one step.

// TeamSample is a team's figures in the step that begins at At.
type TeamSample struct {
	TeamID string    `json:"teamID"`
	At     time.Time `json:"at"` // the step's start, whole seconds
	// Concurrent is the most sandboxes holding a host (creating, running,
	// paused in memory: what the team's sandboxes quota counts) any
	// sample in the step saw.
	Concurrent int `json:"concurrent"`
	// Starts is how many of the team's sandboxes were made in the step
	// (creates, fork children, pooled sandboxes claimed: the audit
	// trail's sandbox.created).
	Starts int `json:"starts"`
}

// MaxTeamSamples bounds what one ListTeamSamples returns.
const MaxTeamSamples = 100_000

// The figures of a sample (TopTeamSample).
const (
	TeamConcurrent = "concurrent"
	TeamStarts     = "starts"
)

// TeamMetrics keeps the samples.
type TeamMetrics interface {
	// LiveSandboxes counts, per team, the sandboxes holding a host now
	// (creating, running, paused); teams with none, and pooled sandboxes
	// (no team), are left out.
	LiveSandboxes(ctx context.Context) (map[string]int, error)
	// CountAuditActions counts, per team, the audit records of action
	// with At in [since, until).
	CountAuditActions(ctx context.Context, action string, since, until time.Time) (map[string]int, error)
	// NoteTeamSamples merges samples into the stored ones: each figure
	// keeps the larger of the stored and the new value, so replicas that
	// sample the same step agree, and a sample of one figure (the other
	// 0) leaves the other as it was.
	NoteTeamSamples(ctx context.Context, samples []TeamSample) error
	// ListTeamSamples returns team's samples with At in [since, until)
	// summed into buckets of the given length from since (a whole number
	// of seconds, at least one): each bucket's At is its start, its
	// Concurrent the largest and its Starts the sum of its samples';
	// buckets without samples are left out; oldest first, at most
	// MaxTeamSamples.
	ListTeamSamples(ctx context.Context, team string, since, until time.Time, bucket time.Duration) ([]TeamSample, error)
	// TopTeamSample returns team's sample with the largest figure
	// (TeamConcurrent or TeamStarts) with At in [since, until), the
	// earliest on a tie; ok is false when there is none.
	TopTeamSample(ctx context.Context, team string, since, until time.Time, figure string) (x TeamSample, ok bool, err error)
	// PruneTeamSamples deletes the samples older than before and returns
	// how many.
	PruneTeamSamples(ctx context.Context, before time.Time) (int, error)
	// Census counts what the store holds (grouped counts: one read each
	// of sandboxes and snapshots).
	Census(ctx context.Context) (Census, error)
}

// TeamSampleQuery is the SQL of ListTeamSamples for both stores ("?"
// placeholders, in order); a bucket that is not a whole number of
// seconds, at least one, is ErrInvalidArgument.
func TeamSampleQuery(team string, since, until time.Time, bucket time.Duration) (string, []any, error) {
	if bucket < time.Second || bucket%time.Second != 0 {
		return "", nil, errdefs.Invalidf("team samples: bucket %s is not a whole number of seconds", bucket)
	}
	b := int64(bucket / time.Second)
	return `SELECT ? + ((at - ?) / ?) * ? AS b, MAX(concurrent), SUM(starts) FROM team_samples
		WHERE team_id = ? AND at >= ? AND at < ? GROUP BY b ORDER BY b LIMIT ?`,
		[]any{since.Unix(), since.Unix(), b, b, team, since.Unix(), until.Unix(), MaxTeamSamples}, nil
}

// TopTeamSampleQuery is the SQL of TopTeamSample ("?" placeholders).
func TopTeamSampleQuery(team string, since, until time.Time, figure string) (string, []any, error) {
	if figure != TeamConcurrent && figure != TeamStarts {
		return "", nil, errdefs.Invalidf("team samples: no figure %q", figure)
	}
	return `SELECT at, concurrent, starts FROM team_samples WHERE team_id = ? AND at >= ? AND at < ? AND ` + figure + ` > 0
		ORDER BY ` + figure + ` DESC, at LIMIT 1`, []any{team, since.Unix(), until.Unix()}, nil
}

// Census is what the store holds, counted for the operators' metrics
// (internal/metrics): sandboxes by node and state, snapshots by kind
// and storage state with their bytes.
type Census struct {
	Sandboxes []SandboxCount
	Snapshots []SnapshotCount
	// Pooled are the warm pool's sandboxes by template.
	Pooled []PooledCount
}

// PooledCount is how many warm-pool sandboxes of a template there are.
type PooledCount struct {
	TemplateID string
	N          int
}

// SandboxCount is how many sandboxes a node has in a state.
type SandboxCount struct {
	NodeID, State string
	N             int
}

// SnapshotCount is how many snapshots of a kind and storage state the
// store lists, and the sum of their sizes.
type SnapshotCount struct {
	Kind, Storage string
	N             int
	Bytes         int64
}

// CensusSQL are the two grouped counts of Census, for both stores.
const (
	CensusSandboxesSQL = `SELECT node_id, state, COUNT(*) FROM sandboxes GROUP BY node_id, state ORDER BY node_id, state`
	CensusPooledSQL    = `SELECT template_id, COUNT(*) FROM sandboxes WHERE state = 'pooled' GROUP BY template_id ORDER BY template_id`
)

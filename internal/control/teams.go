package control

import (
	"context"

	"github.com/spore-run/spore/internal/store"
)

// Teams (docs/teams.md): every row a user makes belongs to a team, and
// what a request names is looked up among its team's. The API confines
// each call to its key's team; the control plane's own work (reconcile,
// the reaper, drain) acts on rows whatever their team. A team "" given
// to a method that makes or looks up a team's things is the default
// team: callers from before teams (and tests) act in it.

// teamOr is team, or the default team for "".
func teamOr(team string) string {
	if team == "" {
		return store.DefaultTeam
	}
	return team
}

// teamOf is the team a sandbox's names are looked up in: its own (a row
// from before teams has none: the default team's, as the migration
// made every such row).
func teamOf(rec store.Sandbox) string { return teamOr(rec.TeamID) }

// quotaView is a team's quotas and, when it has any, what it uses now:
// the control plane's checks before work the store would refuse at the
// end (the store's checks stay the last word).
func (s *Service) quotaView(ctx context.Context, team string) (store.Quotas, store.TeamUsage, error) {
	t, err := s.st.GetTeam(ctx, team)
	if err != nil || t.Quotas.Zero() {
		return t.Quotas, store.TeamUsage{}, err
	}
	u, err := s.st.TeamUsage(ctx, team)
	return t.Quotas, u, err
}

// admitsChildren is a fork's check of its team's quotas before any work:
// count children the size of parent, all or none (the store checks each
// child's row again as it is written; this spares placing and capturing
// for a fork the quotas refuse as a whole).
func (s *Service) admitsChildren(ctx context.Context, parent store.Sandbox, count int) error {
	team := teamOf(parent)
	q, u, err := s.quotaView(ctx, team)
	if err != nil || q.Zero() {
		return err
	}
	each := store.ChargeOf(store.Sandbox{TeamID: team, State: store.StateCreating, CPUCount: parent.CPUCount, MemoryMB: parent.MemoryMB})
	add := store.Charge{Sandboxes: count * each.Sandboxes, VCPUs: count * each.VCPUs, MemoryMB: int64(count) * each.MemoryMB}
	if err := store.CheckCharge(team, q, u, add); err != nil {
		return err
	}
	if limit := q.CreatesPerMinute; limit > 0 && u.CreatesLastMinute+count > limit {
		return &store.QuotaError{Team: team, Quota: "createsPerMinute", Limit: int64(limit), Use: int64(u.CreatesLastMinute), Add: int64(count)}
	}
	return nil
}

// admitsSnapshot refuses a snapshot before the node takes it when its
// team holds its whole SnapshotBytes quota already (the store checks the
// snapshot's own size when its row is written).
func (s *Service) admitsSnapshot(ctx context.Context, team string) error {
	q, u, err := s.quotaView(ctx, team)
	if err != nil || q.SnapshotBytes == 0 {
		return err
	}
	return store.CheckBytes(team, "snapshotBytes", q.SnapshotBytes, u.SnapshotBytes, 1)
}

// admitsResume asks a hibernated sandbox's team's quotas for its return.
func (s *Service) admitsResume(ctx context.Context, rec store.Sandbox) error {
	team := teamOf(rec)
	q, u, err := s.quotaView(ctx, team)
	if err != nil || q.Zero() {
		return err
	}
	running := rec
	running.TeamID, running.State = team, store.StateRunning
	return store.CheckCharge(team, q, u, store.ChargeOf(running))
}

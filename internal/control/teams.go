package control

import "github.com/spore-run/spore/internal/store"

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

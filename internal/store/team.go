package store

import (
	"context"
	"encoding/json"
	"time"
)

// DefaultTeam is the team a deployment starts with: everything made
// before teams existed belongs to it (the migration to teams), and an
// operator key acts in it unless it names another (docs/teams.md).
const DefaultTeam = "default"

// Team is a tenant of a Spore deployment: it owns sandboxes, snapshots,
// secrets and volumes, and its keys see nothing of another team's.
type Team struct {
	ID        string    `json:"id"`   // ids.New('t'); DefaultTeam for the first
	Name      string    `json:"name"` // unique across the deployment
	CreatedAt time.Time `json:"createdAt"`
	Quotas    Quotas    `json:"quotas"` // zero: no limits
}

// Teams are the deployment's teams.
type Teams interface {
	// CreateTeam stores a new team (CreatedAt now if zero); an ID or a
	// name another team has is ErrAlreadyExists.
	CreateTeam(ctx context.Context, t Team) error
	// GetTeam returns the team ref names (its ID or its name).
	GetTeam(ctx context.Context, ref string) (Team, error)
	// SetTeamQuotas replaces a team's quotas (a negative one is
	// ErrInvalidArgument); what it holds beyond them stays, and no more
	// is admitted until it is below.
	SetTeamQuotas(ctx context.Context, id string, q Quotas) (Team, error)
	// TeamUsage is what a team holds now, as its quotas count it.
	TeamUsage(ctx context.Context, id string) (TeamUsage, error)
	// ListTeams returns every team, oldest first.
	ListTeams(ctx context.Context) ([]Team, error)
	// DeleteTeam removes a team and revokes its keys, in one transaction.
	// A team that still owns a sandbox, a snapshot, a secret or a volume
	// is not removed (ErrConflict naming what it owns), nor is
	// DefaultTeam.
	DeleteTeam(ctx context.Context, id string, at time.Time) error
}

// TemplatePublic reads the public flag (E2B's publish) of a template
// row's Spec: false when absent or unreadable.
func TemplatePublic(spec []byte) bool {
	var m struct {
		Public bool `json:"public"`
	}
	if len(spec) == 0 || json.Unmarshal(spec, &m) != nil {
		return false
	}
	return m.Public
}

// TemplateVisible reports whether team may use template tp: its own (a
// row from before teams is the default team's), or a public one. Team ""
// is the control plane's own use: every template.
func TemplateVisible(team string, tp Template) bool {
	owner := tp.TeamID
	if owner == "" {
		owner = DefaultTeam
	}
	return team == "" || owner == team || TemplatePublic(tp.Spec)
}

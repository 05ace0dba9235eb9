package store

import (
	"regexp"
	"strings"

	"github.com/spore-run/spore/internal/errdefs"
	"github.com/spore-run/spore/internal/ids"
)

// Template names are per team (docs/teams.md). A template is stored, built
// and known to the nodes by its key: the default team's by its name (as
// before teams, so existing rows, nodes and snapshots resolve unchanged),
// another team's by its name and the team's ID, "<name>.<teamID>". The key
// is E2B's template ID; the name is what the team calls it (E2B's alias).

// TemplateKey is the key team's template name is stored under ("" team:
// the default team's).
func TemplateKey(team, name string) string {
	if team == "" || team == DefaultTeam {
		return name
	}
	return name + "." + team
}

// TemplateName is the name template key shows its team, owner (the row's
// TeamID; "" the default team).
func TemplateName(key, owner string) string {
	if owner == "" || owner == DefaultTeam {
		return key
	}
	return strings.TrimSuffix(key, "."+owner)
}

// TemplateNameOf is TemplateName for the row tp.
func TemplateNameOf(tp Template) string { return TemplateName(tp.Name, tp.TeamID) }

// teamKeySuffix is how the key of another team's template ends: a dot and
// a team ID (ids.New('t')). No template name may end so, so that no name
// of one team is another team's key.
var teamKeySuffix = regexp.MustCompile(`\.t[a-z0-9]{19}$`)

// ValidateTemplateName checks a new template name for team: a name
// (ids.ValidateName), not ending like a key of another team's, and whose
// key is a valid name too (another team's names are shorter by the
// length of its suffix).
func ValidateTemplateName(team, name string) error {
	if err := ids.ValidateName("template name", name); err != nil {
		return err
	}
	if teamKeySuffix.MatchString(name) {
		return errdefs.Invalidf("template name %q ends like a team's template ID (.t followed by 19 letters or digits): choose another", name)
	}
	if key := TemplateKey(team, name); ids.ValidateName("template name", key) != nil {
		return errdefs.Invalidf("template name %q is too long: a team's template names are at most %d characters", name, 128-len(key)+len(name))
	}
	return nil
}

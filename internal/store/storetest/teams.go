package storetest

import (
	"context"
	"errors"
	"fmt"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/spore-run/spore/internal/errdefs"
	"github.com/spore-run/spore/internal/store"
)

// Teams (docs/teams.md): a team owns sandboxes, snapshots, secrets and
// volumes; names are unique within a team, and a lookup in one team never
// finds another's. Team "" is the control plane's own lookup: any team's
// row by ID, none by name.

// The teams the suite's rows belong to. The suite's other tests put their
// named rows in teamA; the store does not require a team row to exist,
// but for a sandbox that its team is charged for (quotas.go).
const (
	teamA = "ta"
	teamB = "tb"
)

// testTeams: the default team is there from the start; IDs and names are
// unique; a team is found by ID (first) or name; the list is oldest first.
func testTeams(t *testing.T, s store.Store) {
	ctx := context.Background()
	l, err := s.ListTeams(ctx)
	if err != nil || len(l) != 1 || l[0].ID != store.DefaultTeam || l[0].Name != store.DefaultTeam || l[0].CreatedAt.IsZero() {
		t.Fatalf("a fresh store's teams = %+v %v, want the default team", l, err)
	}
	if d, err := s.GetTeam(ctx, store.DefaultTeam); err != nil || d != l[0] {
		t.Fatalf("default team = %+v %v, listed %+v", d, err, l[0])
	}
	at := time.Now().UTC().Truncate(time.Millisecond)
	a := store.Team{ID: teamA, Name: "alpha", CreatedAt: at}
	if err := s.CreateTeam(ctx, a); err != nil {
		t.Fatal(err)
	}
	before := time.Now().UTC().Add(-time.Second)
	if err := s.CreateTeam(ctx, store.Team{ID: teamB, Name: "beta"}); err != nil {
		t.Fatal(err)
	}
	for _, dup := range []store.Team{{ID: teamA, Name: "gamma"}, {ID: "tc", Name: "alpha"}, {ID: "tc", Name: store.DefaultTeam}} {
		if err := s.CreateTeam(ctx, dup); !errdefs.IsAlreadyExists(err) {
			t.Fatalf("create %+v = %v, want already exists", dup, err)
		}
	}
	for _, ref := range []string{teamA, "alpha"} {
		if got, err := s.GetTeam(ctx, ref); err != nil || got != a {
			t.Fatalf("get %s = %+v %v, want %+v", ref, got, err, a)
		}
	}
	if b, err := s.GetTeam(ctx, "beta"); err != nil || b.ID != teamB || b.CreatedAt.Before(before) {
		t.Fatalf("a team created without a time = %+v %v", b, err)
	}
	// A team named like another's ID: the ID wins.
	if err := s.CreateTeam(ctx, store.Team{ID: "tc", Name: teamA}); err != nil {
		t.Fatal(err)
	}
	if got, err := s.GetTeam(ctx, teamA); err != nil || got.ID != teamA {
		t.Fatalf("get %s = %+v %v, want the team of that ID", teamA, got, err)
	}
	for _, ref := range []string{"nope", "gamma", ""} {
		if _, err := s.GetTeam(ctx, ref); !errdefs.IsNotFound(err) {
			t.Fatalf("get %q = %v, want not found", ref, err)
		}
	}
	l, err = s.ListTeams(ctx)
	if err != nil || fmt.Sprint(teamIDs(l)) != "[default ta tb tc]" {
		t.Fatalf("list = %+v %v, want oldest first", l, err)
	}
}

func teamIDs(l []store.Team) []string {
	var out []string
	for _, t := range l {
		out = append(out, t.ID)
	}
	return out
}

// testDeleteTeam: the default team and a team that owns anything stay
// (a conflict naming what it owns, changing nothing); an empty team goes,
// its valid keys revoked at the time given and the keys' version moved;
// another team's keys and the operators' are untouched.
func testDeleteTeam(t *testing.T, s store.Store) {
	ctx := context.Background()
	if err := s.DeleteTeam(ctx, store.DefaultTeam, time.Now()); !errdefs.IsConflict(err) {
		t.Fatalf("delete the default team = %v, want a conflict", err)
	}
	if _, err := s.GetTeam(ctx, store.DefaultTeam); err != nil {
		t.Fatalf("the default team after a refused delete: %v", err)
	}
	if err := s.DeleteTeam(ctx, "nope", time.Now()); !errdefs.IsNotFound(err) {
		t.Fatalf("delete an unknown team = %v, want not found", err)
	}
	for _, tm := range []store.Team{{ID: teamA, Name: "alpha"}, {ID: teamB, Name: "beta"}} {
		if err := s.CreateTeam(ctx, tm); err != nil {
			t.Fatal(err)
		}
	}
	created := time.Now().UTC().Truncate(time.Millisecond).Add(-time.Hour)
	earlier := created.Add(time.Minute)
	for _, k := range []store.APIKey{
		{ID: "ka1", Hash: "ha1", TeamID: teamA, Role: store.RoleAdmin, CreatedAt: created},
		{ID: "ka2", Hash: "ha2", TeamID: teamA, Role: store.RoleMember, CreatedAt: created},
		{ID: "ka3", Hash: "ha3", TeamID: teamA, Role: store.RoleMember, CreatedAt: created},
		{ID: "kb1", Hash: "hb1", TeamID: teamB, Role: store.RoleAdmin, CreatedAt: created},
		{ID: "kop", Hash: "hop", Role: store.RoleOperator, CreatedAt: created},
	} {
		if err := s.AddAPIKey(ctx, k); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := s.RevokeAPIKey(ctx, "ka3", earlier); err != nil {
		t.Fatal(err)
	}

	// Each kind of row refuses the delete alone; a pooled (teamless)
	// sandbox refuses nothing.
	pooled := sb("pool1", nil)
	pooled.State = store.StatePooled
	if err := s.CreateSandbox(ctx, pooled); err != nil {
		t.Fatal(err)
	}
	box := sb("box1", nil)
	box.TeamID = teamA
	holdings := []struct {
		what       string
		make, drop func() error
	}{
		{"1 sandboxes", func() error { return s.CreateSandbox(ctx, box) }, func() error { return s.DeleteSandbox(ctx, "box1") }},
		{"1 snapshots", func() error { return s.PutSnapshot(ctx, store.Snapshot{ID: "snap1", TeamID: teamA}) },
			func() error { return s.DeleteSnapshot(ctx, "snap1") }},
		{"1 secrets", func() error { return s.CreateSecret(ctx, store.Secret{ID: "sec1", TeamID: teamA, Name: "x"}) },
			func() error { return s.DeleteSecret(ctx, teamA, "sec1") }},
		{"1 volumes", func() error { return s.CreateVolume(ctx, store.Volume{ID: "vol1", TeamID: teamA, Name: "x"}) },
			func() error { return s.DeleteVolume(ctx, teamA, "vol1", nil) }},
	}
	v0, _ := s.APIKeysVersion(ctx)
	for _, h := range holdings {
		if err := h.make(); err != nil {
			t.Fatal(err)
		}
		err := s.DeleteTeam(ctx, teamA, time.Now())
		if !errdefs.IsConflict(err) || !strings.Contains(err.Error(), h.what) {
			t.Fatalf("delete a team that owns %s = %v, want a conflict naming them", h.what, err)
		}
		if err := h.drop(); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := s.GetTeam(ctx, teamA); err != nil {
		t.Fatalf("the team after refused deletes: %v", err)
	}
	if v, _ := s.APIKeysVersion(ctx); v != v0 {
		t.Fatalf("refused deletes moved the keys' version from %d to %d", v0, v)
	}
	if k, _ := s.APIKeyByHash(ctx, "ha1"); k.Revoked() {
		t.Fatalf("a refused delete revoked the team's key: %+v", k)
	}

	at := time.Now().UTC().Truncate(time.Millisecond)
	if err := s.DeleteTeam(ctx, teamA, at); err != nil {
		t.Fatal(err)
	}
	if v, _ := s.APIKeysVersion(ctx); v <= v0 {
		t.Fatalf("keys' version after a team's keys were revoked = %d, before %d", v, v0)
	}
	if _, err := s.GetTeam(ctx, teamA); !errdefs.IsNotFound(err) {
		t.Fatalf("a deleted team: %v", err)
	}
	if err := s.DeleteTeam(ctx, teamA, at); !errdefs.IsNotFound(err) {
		t.Fatalf("delete again = %v, want not found", err)
	}
	if l, _ := s.ListTeams(ctx); fmt.Sprint(teamIDs(l)) != "[default tb]" {
		t.Fatalf("teams after the delete = %v", teamIDs(l))
	}
	revokedAt := map[string]time.Time{"ka1": at, "ka2": at, "ka3": earlier, "kb1": {}, "kop": {}}
	all, err := s.ListAPIKeys(ctx, true)
	if err != nil || len(all) != len(revokedAt) {
		t.Fatalf("keys after the delete = %+v %v: a revoked key stays listed", all, err)
	}
	for _, k := range all {
		if want := revokedAt[k.ID]; !k.RevokedAt.Equal(want) {
			t.Errorf("key %s revoked at %v, want %v", k.ID, k.RevokedAt, want)
		}
	}
	if _, err := s.GetSandbox(ctx, "pool1"); err != nil {
		t.Fatalf("the pooled sandbox: %v", err)
	}
}

// testTeamNames: names are unique within a team, not across teams, for
// secrets, volumes and snapshots alike.
func testTeamNames(t *testing.T, s store.Store) {
	ctx := context.Background()
	for i, team := range []string{teamA, teamB} {
		if err := s.CreateSecret(ctx, store.Secret{ID: fmt.Sprintf("sec%d", i), TeamID: team, Name: "x"}); err != nil {
			t.Fatalf("secret x in %s: %v", team, err)
		}
		if err := s.CreateVolume(ctx, store.Volume{ID: fmt.Sprintf("vol%d", i), TeamID: team, Name: "x"}); err != nil {
			t.Fatalf("volume x in %s: %v", team, err)
		}
		if err := s.PutSnapshot(ctx, store.Snapshot{ID: fmt.Sprintf("snap%d", i), TeamID: team, Names: []string{"x"}}); err != nil {
			t.Fatalf("snapshot x in %s: %v", team, err)
		}
	}
	if err := s.CreateSecret(ctx, store.Secret{ID: "sec9", TeamID: teamA, Name: "x"}); !errdefs.IsAlreadyExists(err) {
		t.Fatalf("a second secret x in a team = %v, want already exists", err)
	}
	if err := s.CreateVolume(ctx, store.Volume{ID: "vol9", TeamID: teamA, Name: "x"}); !errdefs.IsAlreadyExists(err) {
		t.Fatalf("a second volume x in a team = %v, want already exists", err)
	}
	if err := s.PutSnapshot(ctx, store.Snapshot{ID: "snap9", TeamID: teamB, Names: []string{"y", "x"}}); !errdefs.IsAlreadyExists(err) {
		t.Fatalf("a second snapshot x in a team (put) = %v, want already exists", err)
	}
	if err := s.CreateSnapshot(ctx, store.Snapshot{ID: "snap9", TeamID: teamB, Names: []string{"x"}}); !errdefs.IsAlreadyExists(err) {
		t.Fatalf("a second snapshot x in a team (create) = %v, want already exists", err)
	}
	if _, err := s.GetSnapshot(ctx, "snap9"); !errdefs.IsNotFound(err) {
		t.Fatalf("a snapshot refused for its name left a row: %v", err)
	}
	for i, team := range []string{teamA, teamB} {
		sec, err := s.GetSecret(ctx, team, "x")
		if err != nil || sec.ID != fmt.Sprintf("sec%d", i) || sec.TeamID != team {
			t.Fatalf("secret x in %s = %+v %v", team, sec, err)
		}
		vol, err := s.GetVolume(ctx, team, "x")
		if err != nil || vol.ID != fmt.Sprintf("vol%d", i) || vol.TeamID != team {
			t.Fatalf("volume x in %s = %+v %v", team, vol, err)
		}
		r, err := s.ResolveRef(ctx, team, "x")
		if err != nil || r.Snapshot == nil || r.Snapshot.ID != fmt.Sprintf("snap%d", i) || r.Snapshot.TeamID != team {
			t.Fatalf("snapshot x in %s = %+v %v", team, r, err)
		}
	}
	// A snapshot put into another team takes its names along: freed in
	// the first, taken in the second.
	if err := s.PutSnapshot(ctx, store.Snapshot{ID: "snap0", TeamID: teamB, Names: []string{"moved"}}); err != nil {
		t.Fatal(err)
	}
	if r, err := s.ResolveRef(ctx, teamB, "moved"); err != nil || r.Snapshot == nil || r.Snapshot.ID != "snap0" {
		t.Fatalf("the moved snapshot by name in its new team = %+v %v", r, err)
	}
	if l, _, _ := s.ListSnapshots(ctx, store.SnapshotFilter{TeamID: teamA}); len(l) != 0 {
		t.Fatalf("the old team still lists %+v", l)
	}
	if err := s.PutSnapshot(ctx, store.Snapshot{ID: "snap8", TeamID: teamA, Names: []string{"x"}}); err != nil {
		t.Fatalf("the name the moved snapshot freed: %v", err)
	}
}

// testTeamLookups: a lookup in one team finds nothing of another's, by ID
// or by name, for reads, updates and deletes alike; team "" finds any
// team's row by ID and none by name (not even a teamless row's).
func testTeamLookups(t *testing.T, s store.Store) {
	ctx := context.Background()
	for _, r := range []struct{ id, team, name string }{{"sec_a", teamA, "onlya"}, {"sec_b", teamB, "onlyb"}, {"sec_n", "", "noteam"}} {
		if err := s.CreateSecret(ctx, store.Secret{ID: r.id, TeamID: r.team, Name: r.name, Version: 1}); err != nil {
			t.Fatal(err)
		}
		if err := s.CreateVolume(ctx, store.Volume{ID: "v" + r.id, TeamID: r.team, Name: r.name}); err != nil {
			t.Fatal(err)
		}
		if err := s.PutSnapshot(ctx, store.Snapshot{ID: "s" + r.id, TeamID: r.team, Names: []string{r.name}}); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := s.PutTemplate(ctx, store.Template{Name: "py", SnapshotID: "tpl-py"}); err != nil {
		t.Fatal(err)
	}
	// Another team's rows, by ID and by name; names with no team.
	misses := []struct{ team, ref string }{{teamB, "sec_a"}, {teamB, "onlya"}, {teamA, "onlyb"}, {"", "onlya"}, {"", "noteam"}, {teamA, "noteam"}}
	for _, m := range misses {
		if sec, err := s.GetSecret(ctx, m.team, m.ref); !errdefs.IsNotFound(err) {
			t.Errorf("secret %s in team %q = %+v %v, want not found", m.ref, m.team, sec, err)
		}
		if _, err := s.UpdateSecret(ctx, m.team, m.ref, func(x *store.Secret) error { x.Version = 99; return nil }); !errdefs.IsNotFound(err) {
			t.Errorf("update secret %s in team %q = %v, want not found", m.ref, m.team, err)
		}
		if err := s.DeleteSecret(ctx, m.team, m.ref); !errdefs.IsNotFound(err) {
			t.Errorf("delete secret %s in team %q = %v, want not found", m.ref, m.team, err)
		}
		vref := m.ref
		if strings.HasPrefix(vref, "sec_") {
			vref = "v" + vref
		}
		if v, err := s.GetVolume(ctx, m.team, vref); !errdefs.IsNotFound(err) {
			t.Errorf("volume %s in team %q = %+v %v, want not found", vref, m.team, v, err)
		}
		if _, err := s.UpdateVolume(ctx, m.team, vref, func(v *store.Volume) error { v.Holder = "x"; return nil }); !errdefs.IsNotFound(err) {
			t.Errorf("update volume %s in team %q = %v, want not found", vref, m.team, err)
		}
		called := false
		for _, check := range []func(store.Volume) error{nil, func(store.Volume) error { called = true; return nil }} {
			if err := s.DeleteVolume(ctx, m.team, vref, check); !errdefs.IsNotFound(err) {
				t.Errorf("delete volume %s in team %q = %v, want not found", vref, m.team, err)
			}
		}
		if called {
			t.Errorf("a delete's check ran on volume %s, not in team %q", vref, m.team)
		}
		sref := m.ref
		if strings.HasPrefix(sref, "sec_") {
			sref = "s" + sref
		}
		if r, err := s.ResolveRef(ctx, m.team, sref); !errdefs.IsNotFound(err) {
			t.Errorf("resolve %s in team %q = %+v %v, want not found", sref, m.team, r, err)
		}
		if m.ref != "sec_a" { // names only
			if l, _, _ := s.ListSnapshots(ctx, store.SnapshotFilter{TeamID: m.team, Name: m.ref}); len(l) != 0 {
				t.Errorf("snapshots named %s in team %q = %+v", m.ref, m.team, l)
			}
		}
	}
	if t.Failed() {
		t.FailNow()
	}
	// Nothing the misses tried changed a row.
	for _, id := range []string{"sec_a", "sec_b", "sec_n"} {
		if sec, err := s.GetSecret(ctx, "", id); err != nil || sec.Version != 1 {
			t.Fatalf("secret %s after the misses = %+v %v", id, sec, err)
		}
		if v, err := s.GetVolume(ctx, "", "v"+id); err != nil || v.Holder != "" {
			t.Fatalf("volume v%s after the misses = %+v %v", id, v, err)
		}
	}
	// The team's own rows, by ID and by name; team "", by ID.
	for _, ref := range []string{"sec_a", "onlya"} {
		if sec, err := s.GetSecret(ctx, teamA, ref); err != nil || sec.ID != "sec_a" {
			t.Fatalf("secret %s in its team = %+v %v", ref, sec, err)
		}
	}
	for _, ref := range []string{"vsec_a", "onlya"} {
		if v, err := s.GetVolume(ctx, teamA, ref); err != nil || v.ID != "vsec_a" {
			t.Fatalf("volume %s in its team = %+v %v", ref, v, err)
		}
	}
	for _, ref := range []string{"ssec_a", "onlya"} {
		if r, err := s.ResolveRef(ctx, teamA, ref); err != nil || r.Snapshot == nil || r.Snapshot.ID != "ssec_a" {
			t.Fatalf("resolve %s in its team = %+v %v", ref, r, err)
		}
	}
	if r, err := s.ResolveRef(ctx, "", "ssec_b"); err != nil || r.Snapshot == nil || r.Snapshot.TeamID != teamB {
		t.Fatalf("resolve another team's snapshot ID with team \"\" = %+v %v", r, err)
	}
	for _, team := range []string{teamA, teamB, ""} { // the default team's template, by name
		if r, err := s.ResolveRef(ctx, team, "py"); err != nil || r.Template == nil || r.Template.SnapshotID != "tpl-py" {
			t.Fatalf("resolve the template in team %q = %+v %v", team, r, err)
		}
	}
	// Template names are per team: team A's "py" (its key) comes first
	// for A; B and the default team still find the default team's; A's
	// is found by anyone by its key (E2B's template ID).
	if _, err := s.PutTemplate(ctx, store.Template{Name: store.TemplateKey(teamA, "py"), TeamID: teamA, SnapshotID: "tpl-py-a"}); err != nil {
		t.Fatal(err)
	}
	for team, want := range map[string]string{teamA: "tpl-py-a", teamB: "tpl-py", store.DefaultTeam: "tpl-py", "": "tpl-py"} {
		if r, err := s.ResolveRef(ctx, team, "py"); err != nil || r.Template == nil || r.Template.SnapshotID != want {
			t.Fatalf("resolve py in team %q = %+v %v, want template %s", team, r, err, want)
		}
	}
	for _, team := range []string{teamA, teamB, ""} {
		if r, err := s.ResolveRef(ctx, team, store.TemplateKey(teamA, "py")); err != nil || r.Template == nil || r.Template.SnapshotID != "tpl-py-a" {
			t.Fatalf("resolve A's template key in team %q = %+v %v", team, r, err)
		}
	}
	if err := s.DeleteTemplate(ctx, store.TemplateKey(teamA, "py")); err != nil {
		t.Fatal(err)
	}
	up, err := s.UpdateSecret(ctx, "", "sec_b", func(x *store.Secret) error { x.Version++; x.TeamID = teamA; return nil })
	if err != nil || up.Version != 2 || up.TeamID != teamB {
		t.Fatalf("update another team's secret by ID with team \"\" = %+v %v (the team is kept)", up, err)
	}
	vup, err := s.UpdateVolume(ctx, "", "vsec_b", func(v *store.Volume) error { v.Holder = "isb"; v.TeamID = teamA; return nil })
	if err != nil || vup.Holder != "isb" || vup.TeamID != teamB {
		t.Fatalf("update another team's volume by ID with team \"\" = %+v %v (the team is kept)", vup, err)
	}
	if got, _ := s.GetVolume(ctx, teamB, "onlyb"); got.Holder != "isb" || got.TeamID != teamB {
		t.Fatalf("the volume after the update = %+v", got)
	}
	if err := s.DeleteSecret(ctx, "", "sec_b"); err != nil {
		t.Fatalf("delete another team's secret by ID with team \"\": %v", err)
	}
	if err := s.DeleteVolume(ctx, "", "vsec_b", refuseHeld); !errors.Is(err, errHeld) {
		t.Fatalf("delete of a held volume with team \"\" = %v, want the check's error", err)
	}
	if err := s.DeleteVolume(ctx, teamB, "onlyb", nil); err != nil {
		t.Fatalf("delete a volume by name in its team: %v", err)
	}
}

// paged reads every page of a list (cursor "" first) and returns the
// key of each item, in order, each followed by a space.
func paged[T any](t *testing.T, list func(cursor string) ([]T, string, error), key func(T) string) string {
	t.Helper()
	out, cursor := "", ""
	for range 100 {
		l, next, err := list(cursor)
		if err != nil {
			t.Fatal(err)
		}
		for _, x := range l {
			out += key(x) + " "
		}
		if next == "" {
			return out
		}
		cursor = next
	}
	t.Fatal("paging does not end")
	return ""
}

// testTeamLists: every list filters by team ("" is every team), paging
// included; a sandbox's team is written with it and by its updates (a
// pooled sandbox claimed for a team moves into the team's list).
func testTeamLists(t *testing.T, s store.Store) {
	ctx := context.Background()
	for _, team := range []string{teamA, teamB} {
		if err := s.CreateTeam(ctx, store.Team{ID: team, Name: team}); err != nil {
			t.Fatal(err)
		}
	}
	for i, team := range []string{teamA, teamB, teamA, "", teamA} {
		x := sb(fmt.Sprintf("b%d", i), nil)
		x.TeamID = team
		if team == "" {
			x.State = store.StatePooled
		}
		if err := s.CreateSandbox(ctx, x); err != nil {
			t.Fatal(err)
		}
		if err := s.PutSnapshot(ctx, store.Snapshot{ID: fmt.Sprintf("s%d", i), TeamID: team, SandboxID: "x", Names: []string{fmt.Sprintf("n%d", i)}}); err != nil {
			t.Fatal(err)
		}
		if err := s.CreateSecret(ctx, store.Secret{ID: fmt.Sprintf("sec%d", i), TeamID: team, Name: fmt.Sprintf("n%d", i)}); err != nil {
			t.Fatal(err)
		}
		if err := s.CreateVolume(ctx, store.Volume{ID: fmt.Sprintf("v%d", i), TeamID: team, Name: fmt.Sprintf("n%d", i)}); err != nil {
			t.Fatal(err)
		}
	}
	if got, err := s.GetSandbox(ctx, "b1"); err != nil || got.TeamID != teamB {
		t.Fatalf("sandbox b1 = %+v %v, want team %s", got, err, teamB)
	}
	want := map[string]string{teamA: "0 2 4 ", teamB: "1 ", "": "0 1 2 3 4 "}
	for team, w := range want {
		boxes := paged(t, func(c string) ([]store.Sandbox, string, error) {
			return s.ListSandboxes(ctx, store.SandboxFilter{TeamID: team, Limit: 2, Cursor: c})
		}, func(x store.Sandbox) string { return strings.TrimPrefix(x.ID, "b") })
		snaps := paged(t, func(c string) ([]store.Snapshot, string, error) {
			return s.ListSnapshots(ctx, store.SnapshotFilter{TeamID: team, Limit: 2, Cursor: c})
		}, func(x store.Snapshot) string { return strings.TrimPrefix(x.ID, "s") })
		secs := paged(t, func(c string) ([]store.Secret, string, error) { return s.ListSecrets(ctx, team, 2, c) },
			func(x store.Secret) string { return strings.TrimPrefix(x.ID, "sec") })
		vols := paged(t, func(c string) ([]store.Volume, string, error) { return s.ListVolumes(ctx, team, 2, c) },
			func(x store.Volume) string { return strings.TrimPrefix(x.ID, "v") })
		if boxes != w || snaps != w || secs != w || vols != w {
			t.Fatalf("team %q lists sandboxes %q, snapshots %q, secrets %q, volumes %q; want %q of each", team, boxes, snaps, secs, vols, w)
		}
	}
	// Other filters combine with the team's.
	if l, _, _ := s.ListSandboxes(ctx, store.SandboxFilter{TeamID: teamA, States: []string{store.StateRunning, store.StatePooled}}); ids(l) != "b0 b2 b4 " {
		t.Fatalf("team a's running or pooled = %s", ids(l))
	}
	if l, _, _ := s.ListSnapshots(ctx, store.SnapshotFilter{TeamID: teamB, SandboxID: "x"}); len(l) != 1 || l[0].ID != "s1" {
		t.Fatalf("team b's snapshots of x = %+v", l)
	}
	if l, _, _ := s.ListSnapshots(ctx, store.SnapshotFilter{TeamID: teamB, Name: "n1"}); len(l) != 1 || l[0].ID != "s1" {
		t.Fatalf("team b's snapshot n1 = %+v", l)
	}
	for _, f := range []store.SnapshotFilter{{TeamID: teamA, Name: "n1"}, {Name: "n1"}, {Name: "n3"}} {
		if l, _, _ := s.ListSnapshots(ctx, f); len(l) != 0 {
			t.Fatalf("snapshots %+v = %+v, want none", f, l)
		}
	}
	// The pooled sandbox claimed for team b, by update and by swap.
	claimed, err := s.UpdateSandbox(ctx, "b3", func(x *store.Sandbox) error { x.TeamID, x.State = teamB, store.StateRunning; return nil })
	if err != nil || claimed.TeamID != teamB {
		t.Fatalf("claim = %+v %v", claimed, err)
	}
	if l, _, _ := s.ListSandboxes(ctx, store.SandboxFilter{TeamID: teamB}); ids(l) != "b1 b3 " {
		t.Fatalf("team b's sandboxes after the claim = %s", ids(l))
	}
	claimed.TeamID = teamA
	if _, err := s.CompareAndSwapSandbox(ctx, claimed); err != nil {
		t.Fatal(err)
	}
	if l, _, _ := s.ListSandboxes(ctx, store.SandboxFilter{TeamID: teamB}); ids(l) != "b1 " {
		t.Fatalf("team b's sandboxes after the swap = %s", ids(l))
	}
	if got, _ := s.GetSandbox(ctx, "b3"); got.TeamID != teamA {
		t.Fatalf("sandbox b3 after the swap = %+v", got)
	}
}

// testKeyFields: a key's team, scope and expiry are kept as added (a scope
// allowing nothing stays a scope, never becoming no scope); TouchAPIKey
// keeps the latest use and is not a change of the keys.
func testKeyFields(t *testing.T, s store.Store) {
	ctx := context.Background()
	now := time.Now().UTC().Truncate(time.Millisecond)
	keys := []store.APIKey{
		{ID: "k1", Hash: "h1", Name: "ci", TeamID: teamA, Role: store.RoleMember, Source: store.SourceAPI, Mask: "spore_h1",
			Scope:     &store.KeyScope{Operations: []string{"sandboxes.create", "sandboxes.read"}, Templates: []string{"ci-*"}},
			CreatedAt: now, ExpiresAt: now.Add(24 * time.Hour)},
		{ID: "k2", Hash: "h2", TeamID: teamA, Role: store.RoleAdmin, Scope: &store.KeyScope{}, CreatedAt: now.Add(time.Second)},
		{ID: "k3", Hash: "h3", Role: store.RoleOperator, CreatedAt: now.Add(2 * time.Second)},
	}
	for _, k := range keys {
		if err := s.AddAPIKey(ctx, k); err != nil {
			t.Fatal(err)
		}
	}
	list, err := s.ListAPIKeys(ctx, false)
	if err != nil || len(list) != len(keys) {
		t.Fatalf("list = %+v %v", list, err)
	}
	for i, k := range keys {
		got, err := s.APIKeyByHash(ctx, k.Hash)
		if err != nil || !reflect.DeepEqual(got, k) || !reflect.DeepEqual(list[i], k) {
			t.Fatalf("key %s = %+v %v, listed %+v; want %+v", k.ID, got, err, list[i], k)
		}
	}
	if got, _ := s.APIKeyByHash(ctx, "h2"); got.Scope == nil || len(got.Scope.Operations) != 0 {
		t.Fatalf("a scope allowing nothing came back as %+v", got.Scope)
	}

	v0, _ := s.APIKeysVersion(ctx)
	for _, at := range []time.Duration{time.Minute, 0, 3 * time.Minute, 2 * time.Minute} {
		if err := s.TouchAPIKey(ctx, "k1", now.Add(at)); err != nil {
			t.Fatal(err)
		}
	}
	if got, _ := s.APIKeyByHash(ctx, "h1"); !got.LastUsedAt.Equal(now.Add(3 * time.Minute)) {
		t.Fatalf("last used %v after uses up to %v: the latest is kept", got.LastUsedAt, now.Add(3*time.Minute))
	}
	if got, _ := s.APIKeyByHash(ctx, "h2"); !got.LastUsedAt.IsZero() {
		t.Fatalf("a key never used has last used %v", got.LastUsedAt)
	}
	if v, _ := s.APIKeysVersion(ctx); v != v0 {
		t.Fatalf("touches moved the keys' version from %d to %d", v0, v)
	}
	if err := s.TouchAPIKey(ctx, "nope", now); !errdefs.IsNotFound(err) {
		t.Fatalf("touch an unknown key = %v, want not found", err)
	}
	if l, _ := s.ListAPIKeys(ctx, false); !l[0].LastUsedAt.Equal(now.Add(3 * time.Minute)) {
		t.Fatalf("listed key's last use = %v", l[0].LastUsedAt)
	}
}

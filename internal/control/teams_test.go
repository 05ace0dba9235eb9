package control_test

import (
	"testing"
	"time"

	"github.com/spore-run/spore/internal/control"
	"github.com/spore-run/spore/internal/control/controltest"
	"github.com/spore-run/spore/internal/engine"
	"github.com/spore-run/spore/internal/errdefs"
	"github.com/spore-run/spore/internal/store"
)

// A create or rollback names snapshots of its own team only: another
// team's snapshot, by ID or by a name, is not found, even though the
// node holds it; the team's own name resolves to its own snapshot; a
// snapshot's names stay the store's (the node is not given them); fork
// children and snapshots belong to their sandbox's team.
func TestSourcesAreATeamsOwn(t *testing.T) {
	h := newHarness(t)
	ctx := ctxFor(t)
	if err := h.st.CreateTeam(ctx, store.Team{ID: "tb", Name: "b"}); err != nil {
		t.Fatal(err)
	}
	a, err := h.ctl.Create(ctx, control.CreateRequest{Timeout: time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	b, err := h.ctl.Create(ctx, control.CreateRequest{TeamID: "tb", Timeout: time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	if a.TeamID != store.DefaultTeam || b.TeamID != "tb" {
		t.Fatalf("teams: %q %q", a.TeamID, b.TeamID)
	}
	snapA, err := h.ctl.Snapshot(ctx, a.ID, "golden", false)
	if err != nil {
		t.Fatal(err)
	}
	if snapA.TeamID != store.DefaultTeam {
		t.Fatalf("A's snapshot's team: %q", snapA.TeamID)
	}
	if m, err := h.n.Engine.Snapshots().Get(snapA.ID); err != nil || len(m.Names) != 0 {
		t.Fatalf("the node's copy of a snapshot has names %v (%v): the store keeps a team's names", m.Names, err)
	}
	for _, ref := range []string{snapA.ID, "golden"} {
		if _, err := h.ctl.Create(ctx, control.CreateRequest{TeamID: "tb", TemplateID: ref, Timeout: time.Minute}); !errdefs.IsNotFound(err) {
			t.Errorf("team B creates from A's %s: %v, want not found", ref, err)
		}
		if _, err := h.ctl.Rollback(ctx, b.ID, ref); !errdefs.IsNotFound(err) {
			t.Errorf("team B rolls back to A's %s: %v, want not found", ref, err)
		}
	}
	snapB, err := h.ctl.Snapshot(ctx, b.ID, "golden", false)
	if err != nil {
		t.Fatalf("team B reuses the name golden: %v", err)
	}
	fromB, err := h.ctl.Create(ctx, control.CreateRequest{TeamID: "tb", TemplateID: "golden", Timeout: time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	fromA, err := h.ctl.Create(ctx, control.CreateRequest{TemplateID: "golden", Timeout: time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	row := func(id string) store.Sandbox {
		rec, err := h.st.GetSandbox(ctx, id)
		if err != nil {
			t.Fatal(err)
		}
		return rec
	}
	if rb, ra := row(fromB.ID), row(fromA.ID); rb.TeamID != "tb" || ra.TeamID != store.DefaultTeam {
		t.Fatalf("rows: %+v %+v", rb, ra)
	}
	if _, err := h.ctl.Rollback(ctx, b.ID, "golden"); err != nil {
		t.Fatalf("team B rolls back to its own golden (%s): %v", snapB.ID, err)
	}
	kids, err := h.ctl.Fork(ctx, b.ID, 1, time.Minute)
	if err != nil || len(kids) != 1 || kids[0].Err != nil || row(kids[0].Sandbox.ID).TeamID != "tb" {
		t.Fatalf("fork of B's sandbox: %+v %v", kids, err)
	}
}

// Every launch a team's call makes on a node (a create, each fork child, a
// rollback, a resume from hibernation) acts for the sandbox's team, as the
// node's launch gate queues it (engine/launchgate.go); a pool fill acts
// for none. In process and over the node protocol (the team crosses the
// hop as a header).
func TestLaunchesActForTheirTeam(t *testing.T) { controltest.Each(t, testLaunchesActForTheirTeam) }

func testLaunchesActForTheirTeam(t *testing.T, _ controltest.Config) {
	f := newFleet(t)
	ctx := ctxFor(t)
	if err := f.st.CreateTeam(ctx, store.Team{ID: "tb", Name: "b"}); err != nil {
		t.Fatal(err)
	}
	want := map[string]string{} // sandbox -> team
	b, err := f.ctl.Create(ctx, control.CreateRequest{TeamID: "tb", NodeID: "na", Timeout: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	want[b.ID] = "tb"
	a, err := f.ctl.Create(ctx, control.CreateRequest{NodeID: "na", Timeout: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	want[a.ID] = store.DefaultTeam
	kids, err := f.ctl.Fork(ctx, b.ID, 2, time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	for _, k := range kids {
		if k.Err != nil {
			t.Fatal(k.Err)
		}
		want[k.Sandbox.ID] = "tb"
	}
	snap, err := f.ctl.Snapshot(ctx, b.ID, "", false)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := f.ctl.Rollback(ctx, b.ID, snap.ID); err != nil {
		t.Fatal(err)
	}
	if err := f.ctl.Hibernate(ctx, b.ID); err != nil {
		t.Fatal(err)
	}
	if _, _, err := f.ctl.Connect(ctx, b.ID, time.Hour); err != nil {
		t.Fatal(err)
	}
	launches := map[string]int{}
	for _, n := range []*controltest.Node{f.a, f.b} {
		for inst, team := range n.Net.LaunchTeams() {
			id := engine.SandboxOf(inst)
			w, ok := want[id]
			if !ok {
				continue // a template build's
			}
			launches[id]++
			if team != w {
				t.Errorf("instance %s of %s launched for team %q, want %q", inst, id, team, w)
			}
		}
	}
	// b: created, rolled back, resumed; a and the children once each.
	if launches[b.ID] != 3 || launches[a.ID] != 1 || launches[kids[0].Sandbox.ID] != 1 || launches[kids[1].Sandbox.ID] != 1 {
		t.Fatalf("launches per sandbox %v", launches)
	}
}

package control_test

import (
	"testing"
	"time"

	"github.com/spore-run/spore/internal/control"
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

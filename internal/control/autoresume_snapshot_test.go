package control_test

import (
	"testing"
	"time"

	"github.com/spore-run/spore/internal/control"
	"github.com/spore-run/spore/internal/control/controltest"
	"github.com/spore-run/spore/internal/errdefs"
	"github.com/spore-run/spore/internal/store"
)

// A snapshot of an autoResume sandbox that was hibernated (a drain, the
// reaper, memory pressure) resumes it, as traffic would, and is taken;
// one without autoResume stays a 409 and changes nothing.
func TestSnapshotWakesAnAutoResumeSandbox(t *testing.T) {
	controltest.Each(t, func(t *testing.T, _ controltest.Config) {
		h := newHarness(t)
		ctx := ctxFor(t)
		sb := h.create(control.CreateRequest{TemplateID: "base", Timeout: time.Minute, AutoPause: true, AutoResume: true})
		if err := h.ctl.Hibernate(ctx, sb.ID); err != nil {
			t.Fatal(err)
		}
		sn, err := h.ctl.Snapshot(ctx, sb.ID, "", false)
		if err != nil {
			t.Fatalf("snapshot of a hibernated autoResume sandbox: %v", err)
		}
		if sn.ID == "" {
			t.Fatal("no snapshot")
		}
		h.wantStates(sb.ID, store.StateRunning, "running")

		plain := h.create(control.CreateRequest{TemplateID: "base", Timeout: time.Minute})
		if err := h.ctl.Hibernate(ctx, plain.ID); err != nil {
			t.Fatal(err)
		}
		if _, err := h.ctl.Snapshot(ctx, plain.ID, "", false); !errdefs.IsConflict(err) {
			t.Fatalf("snapshot of a hibernated sandbox without autoResume: %v, want a conflict", err)
		}
		h.wantStates(plain.ID, store.StateHibernated, "hibernated")
	})
}

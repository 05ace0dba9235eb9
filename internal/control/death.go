package control

import (
	"context"
	"time"

	"github.com/spore-run/spore/internal/errdefs"
	"github.com/spore-run/spore/internal/nodeapi"
	"github.com/spore-run/spore/internal/store"
)

// sandboxDied ends everything open to a sandbox whose instance died (the
// proxy ends its requests and streams when Gone closes) and records state
// error with the reason. The sandbox stays listed until it is killed or
// its timeout passes.
func (s *Service) sandboxDied(ev nodeapi.Event) {
	s.dropTarget(ev.SandboxID)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	_, err := s.st.UpdateSandbox(ctx, ev.SandboxID, func(x *store.Sandbox) error {
		x.State, x.Addr = store.StateError, ""
		x.Reason, x.ReasonDetail = ev.Reason, ev.Detail
		return nil
	})
	if err != nil && !errdefs.IsNotFound(err) { // not found: a warm-pool sandbox
		s.log.Error("record dead sandbox", "sandbox_id", ev.SandboxID, "err", err)
	}
}

func setReason(x *store.Sandbox, ns nodeapi.Sandbox) {
	if ns.Death != nil {
		x.Reason, x.ReasonDetail = ns.Death.Reason, ns.Death.Detail
	}
}

// deadErr refuses an operation on a dead sandbox, saying why it died.
func deadErr(rec store.Sandbox) error {
	return errdefs.Conflictf("sandbox %s died (%s: %s); only kill applies", rec.ID, rec.Reason, rec.ReasonDetail)
}

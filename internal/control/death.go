package control

import (
	"context"
	"errors"
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
	var pooled store.Sandbox
	_, err := s.st.UpdateSandbox(ctx, ev.SandboxID, func(x *store.Sandbox) error {
		if x.State == store.StatePooled {
			pooled = *x
			return errPooledDied
		}
		x.State, x.Addr = store.StateError, ""
		x.Reason, x.ReasonDetail = ev.Reason, ev.Detail
		return nil
	})
	switch {
	case errors.Is(err, errPooledDied):
		// Nobody's yet: it leaves the pool (the filler replaces it).
		s.discardPooled(ctx, pooled, true)
	case err != nil && !errdefs.IsNotFound(err):
		s.log.Error("record dead sandbox", "sandbox_id", ev.SandboxID, "err", err)
	case err == nil:
		if rec, gerr := s.st.GetSandbox(ctx, ev.SandboxID); gerr == nil {
			s.event(rec, "sandbox.died", ev.Reason+": "+ev.Detail)
		}
	}
}

var errPooledDied = errors.New("a warm-pool sandbox died")

func setReason(x *store.Sandbox, ns nodeapi.Sandbox) {
	if ns.Death != nil {
		x.Reason, x.ReasonDetail = ns.Death.Reason, ns.Death.Detail
	}
}

// deadErr refuses an operation on a dead sandbox, saying why it died.
func deadErr(rec store.Sandbox) error {
	return errdefs.Conflictf("sandbox %s died (%s: %s); only kill applies", rec.ID, rec.Reason, rec.ReasonDetail)
}

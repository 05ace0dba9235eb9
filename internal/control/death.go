package control

import (
	"context"
	"time"

	"github.com/spore-run/spore/internal/engine"
	"github.com/spore-run/spore/internal/errdefs"
	"github.com/spore-run/spore/internal/store"
)

// deathNotifier is the engine's optional report of sandboxes whose
// instance died on its own (engine.Engine.OnDeath).
type deathNotifier interface {
	OnDeath(fn func(engine.Sandbox))
}

// sandboxDied ends everything open to a sandbox whose instance died (the
// proxy ends its requests and streams when Gone closes) and records state
// error with the reason. The sandbox stays listed until it is killed or
// its timeout passes.
func (s *Service) sandboxDied(es engine.Sandbox) {
	s.dropTarget(es.ID)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	_, err := s.st.UpdateSandbox(ctx, es.ID, func(x *store.Sandbox) error {
		x.State = store.StateError
		setReason(x, es)
		return nil
	})
	if err != nil && !errdefs.IsNotFound(err) { // not found: a warm-pool sandbox
		s.log.Error("record dead sandbox", "sandbox_id", es.ID, "err", err)
	}
}

func setReason(x *store.Sandbox, es engine.Sandbox) {
	if es.Death != nil {
		x.Reason, x.ReasonDetail = string(es.Death.Reason), es.Death.Detail
	}
}

// deadErr refuses an operation on a dead sandbox, saying why it died.
func deadErr(rec store.Sandbox) error {
	return errdefs.Conflictf("sandbox %s died (%s: %s); only kill applies", rec.ID, rec.Reason, rec.ReasonDetail)
}

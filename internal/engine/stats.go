package engine

import (
	"context"
	"fmt"

	"github.com/spore-run/spore/internal/errdefs"
	"github.com/spore-run/spore/internal/runtime"
)

// Stats reads a running or paused sandbox's resource use from the host
// side (runtimes with the runtime.StatsReader capability).
func (e *Engine) Stats(ctx context.Context, id string) (runtime.Stats, error) {
	rec, err := e.load(id)
	if err != nil {
		return runtime.Stats{}, err
	}
	sr, ok := e.rt.(runtime.StatsReader)
	if !ok {
		return runtime.Stats{}, fmt.Errorf("runtime %s reports no stats: %w", e.rt.Name(), errdefs.ErrUnavailable)
	}
	if rec.Instance == "" || (rec.State != StateRunning && rec.State != StatePaused) {
		return runtime.Stats{}, fmt.Errorf("sandbox %s is %s: no stats: %w", id, rec.view().State, errdefs.ErrConflict)
	}
	st, err := sr.Stats(ctx, rec.Instance)
	if errdefs.IsNotFound(err) {
		return runtime.Stats{}, fmt.Errorf("sandbox %s changed while reading its stats: %w", id, errdefs.ErrConflict)
	}
	return st, err
}

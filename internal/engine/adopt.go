package engine

import (
	"context"
	"fmt"
	"time"

	"github.com/spore-run/spore/internal/errdefs"
	"github.com/spore-run/spore/internal/ids"
	"github.com/spore-run/spore/internal/netns"
	"github.com/spore-run/spore/internal/snapshot"
)

// Adopt takes over, under its own ID, a sandbox hibernated on another
// node whose hibernation snapshot this node holds (fetched from the blob
// store): the sandbox is recorded here as hibernated, and Resume wakes it
// (consuming the snapshot, as for a sandbox hibernated here). Replayed
// for the same snapshot it returns the sandbox as it is now (hibernated,
// or woken since); an ID that names another sandbox is ErrAlreadyExists,
// a snapshot that is not that sandbox's hibernation ErrInvalidArgument.
func (e *Engine) Adopt(ctx context.Context, id, hibernation string, policy netns.Policy) (Sandbox, error) {
	if err := ids.Validate("snapshot ID", hibernation); err != nil {
		return Sandbox{}, err
	}
	existing, unlock, err := e.claim(ctx, id)
	if err != nil {
		return Sandbox{}, err
	}
	defer unlock()
	source := adoptSource(hibernation)
	if existing != nil {
		if existing.Source == source {
			return existing.view(), nil
		}
		return Sandbox{}, fmt.Errorf("sandbox %s exists here, not adopted from %s: %w", id, hibernation, errdefs.ErrAlreadyExists)
	}
	m, err := e.snaps.Get(hibernation)
	if err != nil {
		return Sandbox{}, err
	}
	if m.Kind != snapshot.KindHibernation || m.Origin != id {
		return Sandbox{}, errdefs.Invalidf("snapshot %s is not the hibernation of sandbox %s", hibernation, id)
	}
	spec, err := e.instanceSpec(id+"-0", m)
	if err != nil {
		return Sandbox{}, err // a root filesystem or runtime build this node lacks: refused before anything is recorded
	}
	run, err := adoptedRun(m.Run)
	if err != nil {
		return Sandbox{}, err
	}
	rec := &record{
		ID: id, State: StateHibernated, Template: m.Template, Parent: m.Parent, Source: source,
		RootFS: m.RootFS, RootFSID: m.RootFSID, RuntimeBuild: spec.Build, Run: run, CreatedAt: time.Now().UTC(), Hibernation: m.ID, Policy: policy,
	}
	if err := e.save(rec); err != nil {
		return Sandbox{}, err
	}
	e.log.Info("adopted a hibernated sandbox", "sandbox_id", id, "snapshot_id", m.ID)
	return rec.view(), nil
}

func adoptSource(hibernation string) string { return "adopt:" + hibernation }

package engine

import (
	"context"
	"fmt"
	"net/netip"
	"time"

	"github.com/spore-run/spore/internal/ids"
	"github.com/spore-run/spore/internal/runtime"
	"github.com/spore-run/spore/internal/snapshot"
)

// Pause freezes a running sandbox in memory.
func (e *Engine) Pause(ctx context.Context, id string) error {
	rec, unlock, err := e.lock(ctx, id)
	if err != nil {
		return err
	}
	defer unlock()
	if err := wantState(rec, "pause", StateRunning); err != nil {
		return err
	}
	if err := e.rt.Pause(ctx, rec.Instance); err != nil {
		return fmt.Errorf("sandbox %s: %w", id, err)
	}
	rec.State = StatePaused
	if err := e.saveState(rec); err != nil {
		// Keep the host and the record in agreement.
		cctx, cancel := cleanupCtx()
		defer cancel()
		_ = e.rt.Resume(cctx, rec.Instance)
		return err
	}
	return nil
}

// Resume continues a paused sandbox, or brings a hibernated one back from
// its snapshot: its processes continue where they were.
func (e *Engine) Resume(ctx context.Context, id string) error {
	rec, unlock, err := e.lock(ctx, id)
	if err != nil {
		return err
	}
	defer unlock()
	switch rec.State {
	case StatePaused:
		if err := e.rt.Resume(ctx, rec.Instance); err != nil {
			return fmt.Errorf("sandbox %s: %w", id, err)
		}
		rec.State = StateRunning
		if err := e.saveState(rec); err != nil {
			cctx, cancel := cleanupCtx()
			defer cancel()
			_ = e.rt.Pause(cctx, rec.Instance)
			return err
		}
		return nil
	case StateHibernated:
		return e.wake(ctx, rec)
	default:
		return wantState(rec, "resume", StatePaused, StateHibernated)
	}
}

// wake restores a hibernated sandbox into a new instance and deletes its
// hibernation snapshot. On failure it stays hibernated.
func (e *Engine) wake(ctx context.Context, rec *record) error {
	m, release, err := e.acquireSnapshot(rec.Hibernation)
	if err != nil {
		return fmt.Errorf("sandbox %s: hibernation snapshot: %w", rec.ID, err)
	}
	defer release()
	instance := rec.newInstance()
	run, made, copies, err := e.volumesForWake(ctx, rec, m.Run)
	if err != nil {
		e.removeImages(made)
		return fmt.Errorf("sandbox %s: resume from hibernation failed, still hibernated: %w", rec.ID, err)
	}
	m.Run = run
	spec, err := e.instanceSpec(instance, m)
	if err != nil {
		e.removeImages(made)
		return err
	}
	spec.Limits = rec.Run.Limits
	defer e.claimTarget(&spec, m.Run.Volumes)()
	instance = spec.ID
	rec.Pending = &pending{Op: opResume, Instance: instance, Snapshot: m.ID, Started: time.Now().UTC()}
	if err := e.save(rec); err != nil {
		e.removeImages(made)
		return err
	}
	addr, err := e.launch(ctx, rec.ID, spec, e.snaps.ImageDir(m.ID), rec.Policy)
	if err == nil {
		if err = e.initDaemon(ctx, rec, addr, m.Run.AccessToken); err != nil {
			e.discard(rec.ID, instance, "")
		}
	}
	if err != nil {
		rec.Pending = nil
		_ = e.save(rec)
		e.removeImages(made)
		return fmt.Errorf("sandbox %s: resume from hibernation failed, still hibernated: %w", rec.ID, err)
	}
	// Commit point. The hibernation's copies of its exclusive volumes go
	// with the hibernation snapshot.
	prev := *rec
	rec.State, rec.Instance, rec.Hibernation, rec.Addr = StateRunning, instance, "", addr
	rec.RuntimeBuild, rec.Run.Volumes, rec.Run.Mounts = spec.Build, run.Volumes, run.Mounts
	rec.Pending = &pending{Op: opDiscard, Snapshot: m.ID, Images: copies, Started: time.Now().UTC()}
	if err := e.save(rec); err != nil {
		*rec = prev
		e.discard(rec.ID, instance, "")
		rec.Pending = nil
		_ = e.save(rec)
		e.removeImages(made)
		return fmt.Errorf("sandbox %s: resume from hibernation failed, still hibernated: %w", rec.ID, err)
	}
	e.finishDiscard(rec)
	e.log.Info("resumed from hibernation", "sandbox_id", rec.ID, "instance", instance)
	return nil
}

// Hibernate checkpoints a sandbox into the snapshot repository and frees
// its memory and processes on the host; Resume brings it back. The sandbox
// is paused during the capture and only killed once the snapshot is
// committed: if anything fails it is left running as it was.
func (e *Engine) Hibernate(ctx context.Context, id string) error {
	rec, unlock, err := e.lock(ctx, id)
	if err != nil {
		return err
	}
	defer unlock()
	if err := wantState(rec, "hibernate", StateRunning, StatePaused); err != nil {
		return err
	}
	st, err := e.snaps.Stage(ids.New('h'))
	if err != nil {
		return err
	}
	defer st.Abort()
	prev := rec.State
	wasRunning := prev == StateRunning
	rec.Pending = &pending{Op: opHibernate, Snapshot: st.ID(), Started: time.Now().UTC()}
	if err := e.save(rec); err != nil {
		return err
	}
	undo := func(cause error) error {
		cctx, cancel := cleanupCtx()
		defer cancel()
		if wasRunning {
			if err := e.rt.Resume(cctx, rec.Instance); err != nil {
				e.log.Error("resume after failed hibernate", "sandbox_id", id, "err", err)
			}
		}
		rec.Pending = nil
		_ = e.save(rec)
		return fmt.Errorf("sandbox %s: hibernate failed, sandbox unchanged: %w", id, cause)
	}
	if capturesVolumes(rec.Run) {
		e.flushVolumes(ctx, rec.Run) // while it runs: the pause holds only the rest
	}
	if wasRunning {
		// Freeze first so nothing runs between the capture and the kill.
		if err := e.rt.Pause(ctx, rec.Instance); err != nil {
			return undo(err)
		}
	}
	// Its exclusive volumes are captured with it, as with a snapshot: the
	// hibernation then holds the sandbox whole, and another node that
	// takes it over (Adopt) makes its volumes from the copies.
	run, err := e.captureVolumes(ctx, rec.Run, st.ID())
	if err != nil {
		return undo(err)
	}
	if err := e.rt.Checkpoint(ctx, rec.Instance, st.ImageDir(), runtime.CheckpointOptions{LeaveRunning: true}); err != nil {
		e.dropCopies(run)
		return undo(err)
	}
	man := e.manifestOf(rec, snapshot.KindHibernation, nil)
	man.Run = run
	m, err := st.Commit(man, snapshot.CommitOptions{})
	if err != nil {
		e.dropCopies(run)
		return undo(err)
	}
	// Commit point: the record says hibernated; the instance is discarded.
	old, oldAddr := rec.Instance, rec.Addr
	rec.State, rec.Instance, rec.Hibernation, rec.Addr = StateHibernated, "", m.ID, netip.Addr{}
	rec.Pending = &pending{Op: opDiscard, Instance: old, Started: time.Now().UTC()}
	if err := e.save(rec); err != nil {
		rec.State, rec.Instance, rec.Hibernation, rec.Addr = prev, old, "", oldAddr
		_ = e.snaps.Delete(m.ID)
		e.dropCopies(run)
		return undo(err)
	}
	e.finishDiscard(rec)
	e.log.Info("hibernated", "sandbox_id", id, "snapshot_id", m.ID, "size", m.SizeBytes)
	return nil
}

// Kill stops a sandbox and frees everything it holds: processes, memory,
// overlay, cgroups, state directories, and its hibernation snapshot.
func (e *Engine) Kill(ctx context.Context, id string) error {
	rec, unlock, err := e.lock(ctx, id)
	if err != nil {
		return err
	}
	defer unlock()
	rec.Pending = &pending{Op: opKill, Started: time.Now().UTC()}
	if err := e.save(rec); err != nil {
		return err
	}
	return e.finishKill(ctx, rec)
}

// finishKill completes a journaled kill (also run by recovery): what the
// sandbox holds goes into the cleanup journal, the record goes, then the
// instance and hibernation snapshot are freed. The kill is committed once
// journaled: a runtime failing to free the instance does not keep the
// sandbox alive, the journal retries it (cleanup.go).
func (e *Engine) finishKill(ctx context.Context, rec *record) error {
	// A volume the sandbox rolled back keeps the content it had: its
	// image becomes the volume's own once the instance is gone.
	acts := append(imageActions(rec.Run, true), e.hibernationCopies(rec)...)
	cs, err := e.journalCleanup(rec.ID, rec.Instance, rec.Hibernation, acts...)
	if err != nil {
		return fmt.Errorf("sandbox %s: kill: %w", rec.ID, err)
	}
	if err := e.forget(rec.ID); err != nil {
		return err
	}
	e.cleanNow(ctx, cs)
	e.log.Info("sandbox killed", "sandbox_id", rec.ID)
	return nil
}

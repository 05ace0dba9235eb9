package engine

import (
	"context"
	"fmt"
	"os"
	"path/filepath"

	"github.com/spore-run/spore/internal/atomicfs"
	"github.com/spore-run/spore/internal/errdefs"
	"github.com/spore-run/spore/internal/runtime"
	"github.com/spore-run/spore/internal/snapshot"
)

// Sweeper is an optional runtime capability: removing host resources (state
// directories, cgroups) left by instances that no longer exist.
type Sweeper interface {
	Sweep(ctx context.Context) error
}

// recover brings the records and the host back in line after a restart:
//
//   - a record that cannot be trusted (unreadable, newer version, naming
//     impossible things) is quarantined (quarantine.go), never fatal;
//   - an operation journaled in a record is finished when it had passed its
//     commit point (opDiscard, opKill) and undone otherwise; what it must
//     free goes through the cleanup journal (cleanup.go), whose pending
//     entries are then run: what still fails is retried in the background;
//   - a record whose instance is gone (or whose hibernation snapshot is
//     gone) is dropped, so every recorded sandbox really exists;
//   - instances and hibernation snapshots no record claims are removed;
//   - scratch space (fork images) is emptied; the snapshot repository
//     already dropped half-written snapshots when it was opened.
//
// Only the engine's own directories failing makes it return an error: one
// sandbox that cannot be recovered is logged and left as recorded (the
// next Open tries again), it does not take the node down.
func (e *Engine) recover(ctx context.Context) error {
	tmp := filepath.Join(e.dir, "tmp")
	if err := os.RemoveAll(tmp); err != nil {
		return err
	}
	if err := os.MkdirAll(tmp, 0o700); err != nil {
		return err
	}
	e.reportQuarantine()
	ents, err := os.ReadDir(filepath.Join(e.dir, "sandboxes"))
	if err != nil {
		return err
	}
	var recs []*record
	for _, ent := range ents {
		id, ok := isRecordFile(ent.Name())
		path := filepath.Join(e.dir, "sandboxes", ent.Name())
		if !ok {
			os.Remove(path) // temporary files of an interrupted atomic write
			continue
		}
		var r record
		if err := atomicfs.ReadJSON(path, &r); err != nil {
			e.quarantine(path, id, fmt.Errorf("unreadable: %w", err))
			continue
		}
		if err := r.validate(id); err != nil {
			e.quarantine(path, id, err)
			continue
		}
		recs = append(recs, &r)
	}
	// Children of an interrupted fork journal their own create, so the
	// order records are recovered in does not matter.
	for _, r := range recs {
		e.records[r.ID] = r
		if err := e.recoverOne(ctx, r); err != nil {
			e.log.Error("cannot recover sandbox: left as recorded, the next start retries", "sandbox_id", r.ID, "err", err)
		}
	}
	e.cleanNow(ctx, e.loadCleanups())
	e.removeOrphans(ctx)
	e.removeStrayImages(ctx)
	return nil
}

// undo journals the cleanup of what an interrupted operation left.
func (e *Engine) undo(r *record, instance, snap string, acts ...ImageAction) error {
	_, err := e.journalCleanup(r.ID, instance, snap, acts...)
	return err
}

func (e *Engine) recoverOne(ctx context.Context, r *record) error {
	log := e.log.With("sandbox_id", r.ID)
	if p := r.Pending; p != nil {
		log.Info("recovering interrupted operation", "op", p.Op, "instance", p.Instance, "snapshot_id", p.Snapshot)
		switch p.Op {
		case opCreate:
			if err := e.undo(r, p.Instance, ""); err != nil {
				return err
			}
			return e.forget(r.ID)
		case opKill:
			return e.finishKill(ctx, r)
		case opRollback, opResume:
			// Not committed: the new instance goes, the sandbox stays as it was.
			if err := e.undo(r, p.Instance, ""); err != nil {
				return err
			}
		case opHibernate:
			// Not committed: drop the snapshot if it got that far.
			if err := e.undo(r, "", p.Snapshot); err != nil {
				return err
			}
		case opDiscard:
			// Committed: free what the operation replaced.
			if err := e.undo(r, p.Instance, p.Snapshot, p.Images...); err != nil {
				return err
			}
		case opSnapshot, opFork:
			// Nothing to undo beyond the state check below.
		}
		r.Pending = nil
	}

	if r.State == StateDead {
		// Kept, with its reason, until killed; free an instance a failed
		// cleanup left (death.go).
		if err := e.killInstance(ctx, r.Instance); err != nil {
			return err
		}
		r.Instance = ""
		return e.save(r)
	}
	if r.State == StateHibernated {
		if _, err := e.snaps.Get(r.Hibernation); err != nil {
			log.Error("hibernated sandbox lost its snapshot: dropping it", "snapshot_id", r.Hibernation, "err", err)
			return e.forget(r.ID)
		}
		return e.save(r)
	}
	info, err := e.rt.Recover(ctx, r.Instance)
	if errdefs.IsNotFound(err) || errdefs.IsInvalidArgument(err) {
		log.Warn("sandbox's instance is gone: dropping it", "instance", r.Instance)
		return e.forget(r.ID)
	}
	if err != nil {
		return err
	}
	// An interrupted checkpoint or pause can leave the instance paused when
	// the record says running: the record is what the user last asked for.
	switch {
	case info.State == runtime.StatePaused && r.State == StateRunning:
		if err := e.rt.Resume(ctx, r.Instance); err != nil {
			return err
		}
	case info.State == runtime.StateRunning && r.State == StatePaused:
		if err := e.rt.Pause(ctx, r.Instance); err != nil {
			return err
		}
	}
	log.Info("re-attached", "instance", r.Instance, "state", r.State)
	return e.save(r)
}

// removeOrphans kills instances and deletes hibernation snapshots that no
// record claims, then lets the runtime sweep what dead instances left.
// Nothing here is fatal: an orphan that cannot be freed is journaled and
// retried like any cleanup.
func (e *Engine) removeOrphans(ctx context.Context) {
	claimed := map[string]bool{}
	hib := map[string]bool{}
	for _, r := range e.records {
		claimed[r.Instance] = true
		hib[r.Hibernation] = true
	}
	list, err := e.rt.List(ctx)
	if err != nil {
		e.log.Error("list instances: orphans not removed", "err", err)
	}
	for _, i := range list {
		if !claimed[i.ID] {
			e.log.Warn("removing orphaned instance", "instance", i.ID)
			e.discard(sandboxOf(i.ID), i.ID, "")
		}
	}
	for _, m := range e.snaps.List() {
		if m.Kind == snapshot.KindHibernation && !hib[m.ID] {
			e.log.Warn("removing orphaned hibernation snapshot", "snapshot_id", m.ID)
			e.discard(m.Origin, "", m.ID)
		}
	}
	if s, ok := e.rt.(Sweeper); ok {
		if err := s.Sweep(ctx); err != nil {
			e.log.Error("sweep the runtime", "err", err)
		}
	}
	if e.net != nil {
		if err := e.net.Sweep(ctx, claimed); err != nil {
			e.log.Error("sweep networks", "err", err)
		}
	}
}

package engine

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"

	"github.com/spore-run/spore/internal/atomicfs"
	"github.com/spore-run/spore/internal/errdefs"
	"github.com/spore-run/spore/internal/ids"
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
//   - an operation journaled in a record is finished when it had passed its
//     commit point (opDiscard, opKill) and undone otherwise;
//   - a record whose instance is gone (or whose hibernation snapshot is
//     gone) is dropped, so every recorded sandbox really exists;
//   - instances and hibernation snapshots no record claims are removed;
//   - scratch space (fork images) is emptied; the snapshot repository
//     already dropped half-written snapshots when it was opened.
func (e *Engine) recover(ctx context.Context) error {
	tmp := filepath.Join(e.dir, "tmp")
	if err := os.RemoveAll(tmp); err != nil {
		return err
	}
	if err := os.MkdirAll(tmp, 0o700); err != nil {
		return err
	}
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
		if err := atomicfs.ReadJSON(path, &r); err != nil || r.ID != id || ids.Validate("sandbox ID", id) != nil {
			e.log.Error("unreadable sandbox record: moved aside", "file", path, "err", err)
			os.Rename(path, path+".bad")
			continue
		}
		recs = append(recs, &r)
	}
	// Children of an interrupted fork journal their own create, so the
	// order records are recovered in does not matter.
	for _, r := range recs {
		e.records[r.ID] = r
		if err := e.recoverOne(ctx, r); err != nil {
			return fmt.Errorf("sandbox %s: %w", r.ID, err)
		}
	}
	return e.removeOrphans(ctx)
}

func (e *Engine) recoverOne(ctx context.Context, r *record) error {
	log := e.log.With("sandbox_id", r.ID)
	if p := r.Pending; p != nil {
		log.Info("recovering interrupted operation", "op", p.Op, "instance", p.Instance, "snapshot_id", p.Snapshot)
		switch p.Op {
		case opCreate:
			if err := e.killInstance(ctx, p.Instance); err != nil {
				return err
			}
			return e.forget(r.ID)
		case opKill:
			return e.finishKill(ctx, r)
		case opRollback, opResume:
			// Not committed: the new instance goes, the sandbox stays as it was.
			if err := e.killInstance(ctx, p.Instance); err != nil {
				return err
			}
		case opHibernate:
			// Not committed: drop the snapshot if it got that far.
			if p.Snapshot != "" {
				if err := e.snaps.Delete(p.Snapshot); err != nil && !errdefs.IsNotFound(err) {
					return err
				}
			}
		case opDiscard:
			// Committed: free what the operation replaced.
			if err := e.killInstance(ctx, p.Instance); err != nil {
				return err
			}
			if p.Snapshot != "" {
				if err := e.snaps.Delete(p.Snapshot); err != nil && !errdefs.IsNotFound(err) {
					return err
				}
			}
		case opSnapshot, opFork:
			// Nothing to undo beyond the state check below.
		default:
			log.Warn("unknown journaled operation", "op", p.Op)
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
func (e *Engine) removeOrphans(ctx context.Context) error {
	claimed := map[string]bool{}
	hib := map[string]bool{}
	for _, r := range e.records {
		claimed[r.Instance] = true
		hib[r.Hibernation] = true
	}
	list, err := e.rt.List(ctx)
	if err != nil {
		return err
	}
	var errs []error
	for _, i := range list {
		if !claimed[i.ID] {
			e.log.Warn("removing orphaned instance", "instance", i.ID)
			if err := e.killInstance(ctx, i.ID); err != nil {
				errs = append(errs, err)
			}
		}
	}
	for _, m := range e.snaps.List() {
		if m.Kind == snapshot.KindHibernation && !hib[m.ID] {
			e.log.Warn("removing orphaned hibernation snapshot", "snapshot_id", m.ID)
			if err := e.snaps.Delete(m.ID); err != nil && !errdefs.IsNotFound(err) {
				errs = append(errs, err)
			}
		}
	}
	if s, ok := e.rt.(Sweeper); ok {
		if err := s.Sweep(ctx); err != nil {
			errs = append(errs, err)
		}
	}
	if e.net != nil {
		if err := e.net.Sweep(ctx, claimed); err != nil {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

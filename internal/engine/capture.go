package engine

import (
	"context"
	"fmt"
	"os"
	"sync"
	"time"

	"github.com/spore-run/spore/internal/errdefs"
	"github.com/spore-run/spore/internal/ids"
	"github.com/spore-run/spore/internal/runtime"
	"github.com/spore-run/spore/internal/snapshot"
	"github.com/spore-run/spore/internal/timing"
)

// SnapshotOptions tune Snapshot.
type SnapshotOptions struct {
	// ID is the snapshot's ID, minted by the caller (generated when
	// empty). A snapshot with the ID of an existing snapshot of the same
	// sandbox returns that snapshot (a replay: no second capture); an ID
	// another sandbox's snapshot holds is ErrAlreadyExists.
	ID    string
	Names []string
	// Template makes the snapshot a template: it takes over its names from
	// an older template of the same name, which is then deleted.
	Template bool
}

// SnapshotResult reports a snapshot taken.
type SnapshotResult struct {
	Manifest snapshot.Manifest
	// Paused is how long the sandbox was stopped for the capture (the
	// runtime's checkpoint call, an upper bound); Took is the whole
	// operation including the commit.
	Paused time.Duration
	Took   time.Duration
}

// Snapshot captures a running or paused sandbox live: it keeps running (or
// stays paused) and the snapshot is committed atomically.
func (e *Engine) Snapshot(ctx context.Context, id string, opts SnapshotOptions) (SnapshotResult, error) {
	if opts.ID != "" {
		if err := ids.Validate("snapshot ID", opts.ID); err != nil {
			return SnapshotResult{}, err
		}
		if res, done, err := e.replaySnapshot(id, opts.ID); done {
			return res, err
		}
	}
	for _, n := range opts.Names {
		if err := ids.ValidateName("snapshot name", n); err != nil {
			return SnapshotResult{}, err
		}
		if old, err := e.snaps.Get(n); err == nil && !(opts.Template && old.Kind == snapshot.KindTemplate) {
			return SnapshotResult{}, fmt.Errorf("snapshot name %q: %w", n, errdefs.ErrAlreadyExists)
		}
	}
	start := time.Now()
	rec, unlock, err := e.lock(ctx, id)
	if err != nil {
		return SnapshotResult{}, err
	}
	defer unlock()
	if opts.ID != "" {
		// Again under the lock: a replay may have waited for the first.
		if res, done, err := e.replaySnapshot(id, opts.ID); done {
			return res, err
		}
	}
	if err := wantState(rec, "snapshot", StateRunning, StatePaused); err != nil {
		return SnapshotResult{}, err
	}
	if opts.Template && len(rec.Run.Volumes) > 0 {
		return SnapshotResult{}, errdefs.Invalidf("sandbox %s mounts volumes: a template carries none", id)
	}
	snapID := opts.ID
	if snapID == "" {
		snapID = ids.New('s')
	}
	st, err := e.snaps.StageUnsynced(snapID)
	if err != nil {
		return SnapshotResult{}, err
	}
	defer st.Abort()
	paused, run, err := e.capture(ctx, rec, opSnapshot, st.ImageDir(), snapID)
	if err != nil {
		return SnapshotResult{}, err
	}
	committed := false
	defer func() {
		if !committed {
			e.dropCopies(run)
		}
	}()
	kind := snapshot.KindSnapshot
	var replaced []snapshot.Manifest
	if opts.Template {
		kind = snapshot.KindTemplate
		for _, n := range opts.Names {
			if old, err := e.snaps.Get(n); err == nil {
				replaced = append(replaced, old)
			}
		}
	}
	manifest := e.manifestOf(rec, kind, opts.Names)
	manifest.Run = run // with its volumes' copies
	if opts.Template && len(opts.Names) > 0 {
		manifest.Template = opts.Names[0]
	}
	doneCommit := timing.Track(ctx, "commit")
	// The image reaches the disk after the answer (e.syncSnapshot): a power
	// loss before then loses the snapshot whole (snapshot.Repo.StageUnsynced).
	m, err := st.Commit(manifest, snapshot.CommitOptions{MoveNames: opts.Template})
	doneCommit()
	if err != nil {
		return SnapshotResult{}, fmt.Errorf("sandbox %s: %w", id, err)
	}
	committed = true
	e.syncSnapshot(m.ID)
	for _, old := range replaced {
		if err := e.DeleteSnapshot(ctx, old.ID); err != nil {
			e.log.Warn("old template kept", "snapshot_id", old.ID, "err", err)
		}
	}
	e.log.Info("snapshot taken", "sandbox_id", id, "snapshot_id", m.ID, "paused", paused, "size", m.SizeBytes)
	return SnapshotResult{Manifest: m, Paused: paused, Took: time.Since(start)}, nil
}

// syncSnapshot makes a snapshot committed unsynced durable, in the
// background (Close and Settle wait for it).
func (e *Engine) syncSnapshot(id string) {
	e.background(func() {
		t0 := time.Now()
		if err := e.snaps.Sync(id); err != nil && !errdefs.IsNotFound(err) {
			// Kept: the next start syncs it (same boot) or drops it.
			e.log.Warn("snapshot not synced", "snapshot_id", id, "err", err)
			return
		}
		e.log.Debug("snapshot synced", "snapshot_id", id, "took", time.Since(t0))
	})
}

// replaySnapshot answers a snapshot whose caller-given ID exists
// already (done): that snapshot when it was taken of sandbox id, else
// ErrAlreadyExists.
func (e *Engine) replaySnapshot(id, snapID string) (SnapshotResult, bool, error) {
	m, err := e.snaps.Get(snapID)
	if err != nil || m.ID != snapID { // absent (or snapID is only a name)
		return SnapshotResult{}, false, nil
	}
	if m.Origin != id {
		return SnapshotResult{}, true, fmt.Errorf("snapshot %s exists, taken of %s, not %s: %w", snapID, m.Origin, id, errdefs.ErrAlreadyExists)
	}
	return SnapshotResult{Manifest: m}, true, nil
}

// capture checkpoints rec's instance into dir, leaving it running, with op
// journaled for the duration. It returns how long the sandbox was stopped
// and its run with the copies of its exclusive volumes (captured for key,
// exclusive.go): those are taken with the sandbox paused, so memory and
// volumes are of one instant. On failure no copy is left.
func (e *Engine) capture(ctx context.Context, rec *record, o op, dir, key string) (time.Duration, snapshot.RunConfig, error) {
	e.touch(rec.ID) // a snapshot or fork is a use of the sandbox (pressure.go)
	rec.Pending = &pending{Op: o, Started: time.Now().UTC()}
	if err := e.save(rec); err != nil {
		return 0, rec.Run, err
	}
	t0 := time.Now()
	run, err := rec.Run, error(nil)
	pausedHere := false
	if capturesVolumes(rec.Run) {
		done := timing.Track(ctx, "volumes-flush")
		e.flushVolumes(ctx, rec.Run)
		done()
		t0 = time.Now() // the sandbox ran meanwhile
		if rec.State == StateRunning {
			if err = e.rt.Pause(ctx, rec.Instance); err == nil {
				pausedHere = true
			}
		}
		if err == nil {
			done := timing.Track(ctx, "volumes")
			run, err = e.captureVolumes(ctx, rec.Run, key)
			done()
		}
	}
	if err == nil {
		err = e.rt.Checkpoint(ctx, rec.Instance, dir, runtime.CheckpointOptions{LeaveRunning: true})
	}
	if pausedHere {
		cctx, cancel := cleanupCtx()
		if rerr := e.rt.Resume(cctx, rec.Instance); rerr != nil && err == nil {
			err = fmt.Errorf("resume after the capture: %w", rerr)
		}
		cancel()
	}
	paused := time.Since(t0)
	timing.FromContext(ctx).Add("checkpoint", paused)
	if err != nil && rec.State == StateRunning {
		// A failed checkpoint may leave the instance stopped mid-save.
		cctx, cancel := cleanupCtx()
		if info, serr := e.rt.State(cctx, rec.Instance); serr == nil && info.State == runtime.StatePaused {
			_ = e.rt.Resume(cctx, rec.Instance)
		}
		cancel()
	}
	rec.Pending = nil
	// Without fsync (see saveState): an fsync right after a large image
	// is written waits behind the kernel's writeback of it.
	if serr := e.saveState(rec); serr != nil && err == nil {
		err = serr
	}
	if err != nil {
		e.dropCopies(run)
		return 0, rec.Run, fmt.Errorf("sandbox %s: checkpoint: %w", rec.ID, err)
	}
	return paused, run, nil
}

// manifestOf is the manifest of an image of rec's instance: written by
// the runtime build the instance runs with, over its tree.
func (e *Engine) manifestOf(rec *record, kind snapshot.Kind, names []string) snapshot.Manifest {
	build := rec.RuntimeBuild
	if build == "" { // a record from before builds were kept
		build = e.currentBuild()
	}
	return snapshot.Manifest{
		Names: names, Kind: kind, Parent: rec.Parent, Origin: rec.ID, Template: rec.Template,
		RootFS: rec.RootFS, RootFSID: rec.RootFSID, Runtime: e.runtimeName(build), RuntimeBuild: build, Run: rec.Run,
	}
}

// MaxFork is the largest number of children one fork makes.
const MaxFork = 100

// ForkOptions tune Fork.
type ForkOptions struct {
	// Count is how many children to make; with Children it may be 0 (or
	// must equal len(Children)).
	Count int
	// Children, when given, names each child (IDs and access tokens
	// minted by the caller). A child whose ID names an existing child of
	// the same source is returned as it is (a replay); an ID taken by any
	// other sandbox fails that child with ErrAlreadyExists.
	Children []ForkChildSpec
	// Concurrency bounds the restores running at once (default 4, at most
	// Count).
	Concurrency int
}

// ForkChildSpec names one child of a fork.
type ForkChildSpec struct {
	ID          string
	AccessToken string // generated when empty
}

// ForkChild is the outcome for one child.
type ForkChild struct {
	Sandbox Sandbox
	Err     error
}

// ForkResult reports a fork.
type ForkResult struct {
	Children []ForkChild
	Paused   time.Duration // how long the source was stopped for the capture
	Took     time.Duration
}

// Fork captures a sandbox once and restores the image into Count new
// sandboxes. The source keeps running; the children share no writable
// state with it or with each other. Each child's outcome is reported; a
// child that failed leaves nothing behind.
func (e *Engine) Fork(ctx context.Context, id string, opts ForkOptions) (ForkResult, error) {
	if len(opts.Children) > 0 {
		if opts.Count != 0 && opts.Count != len(opts.Children) {
			return ForkResult{}, errdefs.Invalidf("fork count %d but %d children named", opts.Count, len(opts.Children))
		}
		opts.Count = len(opts.Children)
		seen := map[string]bool{}
		for _, c := range opts.Children {
			if err := ids.Validate("sandbox ID", c.ID); err != nil {
				return ForkResult{}, err
			}
			if seen[c.ID] || c.ID == id {
				return ForkResult{}, errdefs.Invalidf("fork child ID %s named twice (or the source's)", c.ID)
			}
			seen[c.ID] = true
		}
	}
	if opts.Count < 1 || opts.Count > MaxFork {
		return ForkResult{}, errdefs.Invalidf("fork count %d out of range 1..%d", opts.Count, MaxFork)
	}
	if opts.Concurrency < 0 || opts.Concurrency > MaxFork {
		return ForkResult{}, errdefs.Invalidf("fork concurrency %d out of range 0..%d", opts.Concurrency, MaxFork)
	}
	if opts.Concurrency == 0 {
		opts.Concurrency = 4
	}
	opts.Concurrency = min(opts.Concurrency, opts.Count)
	start := time.Now()
	if res, done := e.replayFork(id, opts.Children); done {
		return res, nil
	}
	rec, unlock, err := e.lock(ctx, id)
	if err != nil {
		return ForkResult{}, err
	}
	if err := wantState(rec, "fork", StateRunning, StatePaused); err != nil {
		unlock()
		return ForkResult{}, err
	}
	// Not even an instance's own memory free: refused before the capture.
	if err := e.checkRoom(ctx, e.mem.overhead, "a child of "+id); err != nil {
		unlock()
		return ForkResult{}, err
	}
	img, err := e.tmpDir("fork-")
	if err != nil {
		unlock()
		return ForkResult{}, err
	}
	defer os.RemoveAll(img)
	paused, captured, err := e.capture(ctx, rec, opFork, img, ids.New('f'))
	unlock() // the source is free once captured
	if err != nil {
		return ForkResult{}, err
	}
	defer e.dropCopies(captured) // each child has its own copy by then
	// The children that fit in the host's memory are admitted together,
	// the others refused (admission.go); none: the fork fails as a whole.
	specs := forkSpecs(opts)
	room := e.admitChildren(ctx, id, img, specs)
	defer room.release()
	if room.none() {
		return ForkResult{}, room.err
	}
	m := e.manifestOf(rec, snapshot.KindSnapshot, nil)
	m.ID = rec.Parent
	res := ForkResult{Children: make([]ForkChild, opts.Count), Paused: paused}
	sem := make(chan struct{}, opts.Concurrency)
	var wg sync.WaitGroup
	for i := range opts.Count {
		wg.Add(1)
		sem <- struct{}{}
		go func() {
			defer wg.Done()
			defer func() { <-sem }()
			spec := specs[i]
			if err := room.refused(spec.ID); err != nil {
				res.Children[i].Err = err
				return
			}
			existing, unlockChild, err := e.claim(ctx, spec.ID)
			if err != nil {
				res.Children[i].Err = err
				return
			}
			defer unlockChild()
			if existing != nil {
				res.Children[i] = forkReplay(existing, id)
				return
			}
			run := captured
			run.AccessToken = spec.AccessToken // each child gets its own
			if run.AccessToken == "" {
				run.AccessToken = newToken()
			}
			made, err := e.volumesForNew(ctx, spec.ID, &run)
			if err != nil {
				e.removeImages(made)
				res.Children[i].Err = fmt.Errorf("sandbox %s: %w", spec.ID, err)
				return
			}
			child := &record{
				ID: spec.ID, State: StateRunning, Template: rec.Template, Parent: rec.Parent, Source: forkSource(id),
				RootFS: rec.RootFS, RootFSID: rec.RootFSID, Run: run, CreatedAt: time.Now().UTC(), Policy: rec.Policy,
			}
			if err := e.restoreNew(ctx, child, m, "fork of "+id, img, rec.Run.AccessToken); err != nil {
				e.removeImages(made)
				res.Children[i].Err = err
				return
			}
			res.Children[i].Sandbox = child.view()
		}()
	}
	wg.Wait()
	res.Took = time.Since(start)
	e.log.Info("forked", "sandbox_id", id, "count", opts.Count, "paused", paused, "took", res.Took)
	return res, nil
}

func forkSource(id string) string { return "fork:" + id }

// forkReplay is the outcome for a named child that exists already.
func forkReplay(child *record, source string) ForkChild {
	if child.Source != forkSource(source) {
		return ForkChild{Err: fmt.Errorf("sandbox %s exists and is not a child of %s: %w", child.ID, source, errdefs.ErrAlreadyExists)}
	}
	return ForkChild{Sandbox: child.view()}
}

// replayFork answers a fork whose named children all exist already (a
// replay after the first attempt finished): no capture of the source.
func (e *Engine) replayFork(source string, children []ForkChildSpec) (ForkResult, bool) {
	if len(children) == 0 {
		return ForkResult{}, false
	}
	res := ForkResult{Children: make([]ForkChild, len(children))}
	for i, c := range children {
		rec, err := e.load(c.ID)
		if err != nil || rec.Pending != nil && rec.Pending.Op == opCreate {
			return ForkResult{}, false // missing, or still being made
		}
		res.Children[i] = forkReplay(rec, source)
	}
	return res, true
}

// Rollback puts a sandbox back to a snapshot in place: same sandbox ID,
// the snapshot's processes, memory and files. The snapshot is restored
// into a new instance while the current one keeps running; only once the
// restore succeeded is the current one replaced. If the restore fails the
// sandbox is left exactly as it was.
func (e *Engine) Rollback(ctx context.Context, id, snapshotRef string) (Sandbox, error) {
	m, release, err := e.acquireSnapshot(snapshotRef)
	if err != nil {
		return Sandbox{}, err
	}
	defer release()
	if m.Kind == snapshot.KindHibernation {
		return Sandbox{}, errdefs.Invalidf("snapshot %s holds a hibernated sandbox and cannot be rolled back to", m.ID)
	}
	rec, unlock, err := e.lock(ctx, id)
	if err != nil {
		return Sandbox{}, err
	}
	handedOver := false
	defer func() {
		if !handedOver {
			unlock()
		}
	}()
	if err := wantState(rec, "roll back", StateRunning, StatePaused); err != nil {
		return Sandbox{}, err
	}
	instance := rec.newInstance()
	spec, err := e.instanceSpec(instance, m)
	if err != nil {
		return Sandbox{}, err
	}
	defer e.claimTarget(&spec, m.Run.Volumes)()
	instance = spec.ID
	rec.Pending = &pending{Op: opRollback, Instance: instance, Snapshot: m.ID, Started: time.Now().UTC()}
	if err := e.save(rec); err != nil {
		return Sandbox{}, err
	}
	// The snapshot's exclusive volumes come back as new images of the
	// sandbox's own volumes (exclusive.go).
	run, made, err := e.volumesForRollback(ctx, instance, rec.Run, m.Run)
	fail := func(err error) (Sandbox, error) {
		e.removeImages(made)
		rec.Pending = nil
		if serr := e.save(rec); serr != nil {
			e.log.Error("clear rollback journal", "sandbox_id", id, "err", serr)
		}
		return Sandbox{}, fmt.Errorf("sandbox %s: rollback to %s failed, sandbox unchanged: %w", id, m.ID, err)
	}
	if err != nil {
		return fail(err)
	}
	if len(made) > 0 {
		spec.Mounts = run.Mounts
	}
	addr, err := e.launch(ctx, id, spec, e.snaps.ImageDir(m.ID), rec.Policy)
	if err != nil {
		return fail(err)
	}
	// The restored daemon keeps this sandbox's identity and token.
	next := *rec
	next.Run = run
	next.Run.AccessToken = rec.Run.AccessToken
	if err := e.initDaemon(ctx, &next, addr, m.Run.AccessToken); err != nil {
		e.discard(id, instance, "")
		return fail(err)
	}
	// Commit point: the record now names the new instance.
	old := rec.Instance
	prev := *rec
	rec.Instance, rec.Parent, rec.Run, rec.State, rec.Addr = instance, m.ID, next.Run, StateRunning, addr
	// The instance now runs m's image: over m's tree, with m's build.
	rec.RootFS, rec.RootFSID, rec.RuntimeBuild = m.RootFS, m.RootFSID, spec.Build
	// The volume images the replaced instance ran with go with it.
	rec.Pending = &pending{Op: opDiscard, Instance: old, Images: imageActions(prev.Run, false), Started: time.Now().UTC()}
	if err := e.save(rec); err != nil {
		*rec = prev
		e.discard(id, instance, "")
		return fail(err)
	}
	// The replaced instance is freed after the caller has its answer: the
	// discard keeps the sandbox's operation lock, so the sandbox's next
	// operation waits for it, and the journal covers a crash meanwhile.
	view := rec.view()
	handedOver = true
	e.background(func() {
		defer unlock()
		e.finishDiscard(rec)
	})
	e.log.Info("rolled back", "sandbox_id", id, "snapshot_id", m.ID, "instance", instance)
	return view, nil
}

// finishDiscard frees what a committed operation replaced: it moves the
// record's opDiscard entry into the cleanup journal (cleanup.go), clears
// the record's journal, then frees. A failure to free stays journaled and
// is retried in the background and at the next Open; the sandbox's next
// operations cannot overwrite it.
func (e *Engine) finishDiscard(rec *record) {
	p := rec.Pending
	cs, err := e.journalCleanup(rec.ID, p.Instance, p.Snapshot, p.Images...)
	if err != nil {
		// The record's journal keeps it: the next Open frees it.
		e.log.Error("journal cleanup of replaced instance", "sandbox_id", rec.ID, "err", err)
		return
	}
	rec.Pending = nil
	if err := e.save(rec); err != nil {
		e.log.Error("clear journal", "sandbox_id", rec.ID, "err", err)
	}
	cctx, cancel := cleanupCtx()
	defer cancel()
	e.cleanNow(cctx, cs)
}

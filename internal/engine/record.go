package engine

import (
	"context"
	"fmt"
	"net/netip"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/spore-run/spore/internal/atomicfs"
	"github.com/spore-run/spore/internal/errdefs"
	"github.com/spore-run/spore/internal/ids"
	"github.com/spore-run/spore/internal/netns"
	"github.com/spore-run/spore/internal/snapshot"
)

// State is a sandbox's lifecycle state.
type State string

// Stable states, and the transitional states a sandbox shows while an
// operation runs on it.
const (
	StateCreating     State = "creating"
	StateRunning      State = "running"
	StatePaused       State = "paused"
	StateHibernated   State = "hibernated"
	StateSnapshotting State = "snapshotting"
	StateForking      State = "forking"
	StateRollingBack  State = "rolling_back"
	StateHibernating  State = "hibernating"
	StateResuming     State = "resuming"
	StateKilling      State = "killing"
	// StateDead: the instance died on its own (see death.go); the record
	// stays, with the reason, until the sandbox is killed.
	StateDead State = "dead"
)

// op names an operation in flight. It is journaled in the sandbox's record
// before the operation touches anything, so that recovery after a crash
// knows what to finish or undo.
type op string

const (
	opCreate    op = "create"    // undo: kill Instance; forget the sandbox
	opSnapshot  op = "snapshot"  // undo: resume the source if left paused
	opFork      op = "fork"      // same as snapshot (children journal their own creates)
	opRollback  op = "rollback"  // undo: kill Instance (the new one); keep the old
	opHibernate op = "hibernate" // undo: delete Snapshot if committed; resume the instance
	opResume    op = "resume"    // undo: kill Instance (the new one); stay hibernated
	opKill      op = "kill"      // finish: kill everything; forget the sandbox
	opDiscard   op = "discard"   // finish: the operation committed; kill Instance / delete Snapshot
)

var opState = map[op]State{
	opCreate: StateCreating, opSnapshot: StateSnapshotting, opFork: StateForking,
	opRollback: StateRollingBack, opHibernate: StateHibernating, opResume: StateResuming,
	opKill: StateKilling,
}

// pending is the journal entry of an operation in flight.
type pending struct {
	Op       op     `json:"op"`
	Instance string `json:"instance,omitempty"` // instance the operation creates (or must discard)
	Snapshot string `json:"snapshot,omitempty"` // snapshot it writes (or must delete)
	// Images are the volume images to free with a discarded instance
	// (exclusive.go).
	Images  []ImageAction `json:"images,omitempty"`
	Started time.Time     `json:"started"`
}

// recordVersion is the version of the record format this engine writes
// and the newest it reads; a record with a newer version is quarantined
// (quarantine.go), never guessed at. Records without one are version 1.
const recordVersion = 1

// record is what the engine keeps about a sandbox, one JSON file each.
type record struct {
	Version  int    `json:"version,omitempty"`
	ID       string `json:"id"`
	State    State  `json:"state"`              // stable state: running, paused, hibernated
	Instance string `json:"instance,omitempty"` // runtime instance backing it ("" when hibernated)
	Gen      int    `json:"gen"`                // bumps with each new instance
	Template string `json:"template"`
	Parent   string `json:"parent,omitempty"` // snapshot last restored into it
	// Source is what the sandbox was created from: the snapshot's ID, or
	// "fork:<id>" for a child of sandbox id. A create replayed under the
	// same caller-given ID is idempotent only for the same source.
	Source   string `json:"source,omitempty"`
	RootFS   string `json:"rootfs"`
	RootFSID string `json:"rootfs_id"`
	// RuntimeBuild is the runtime build its instance runs with (its
	// hibernation's, while hibernated); "" in records from before builds
	// were kept: the runtime's current one.
	RuntimeBuild string             `json:"runtime_build,omitempty"`
	Run          snapshot.RunConfig `json:"run"`
	CreatedAt    time.Time          `json:"created_at"`
	Hibernation  string             `json:"hibernation,omitempty"` // snapshot holding it while hibernated
	Policy       netns.Policy       `json:"policy"`                // egress policy
	// TrustedCA is the fingerprint of the egress CA its daemon installed
	// in its trust store (the CA itself is in Policy, in memory only).
	TrustedCA string     `json:"trusted_ca,omitempty"`
	Addr      netip.Addr `json:"addr,omitzero"` // where the host reaches the instance
	Pending   *pending   `json:"pending,omitempty"`
	Death     *Death     `json:"death,omitempty"` // set when State is dead
}

// newInstance names the instance of the record's next generation and
// takes the generation, so the name is never reused, even when the
// operation creating it fails: the instance of a failed attempt may still
// wait in the cleanup journal, and must never be confused with a new one.
func (r *record) newInstance() string {
	r.Gen++
	return r.ID + "-" + strconv.Itoa(r.Gen)
}

// SandboxOf is the sandbox an instance name belongs to (instances are
// named "<sandbox ID>-<generation>"; a template build's have no
// generation and are their own).
func SandboxOf(instance string) string {
	if i := strings.LastIndexByte(instance, '-'); i > 0 && strings.Trim(instance[i+1:], "0123456789") == "" && i+1 < len(instance) {
		return instance[:i]
	}
	return instance
}

// Sandbox is the public view of a sandbox.
type Sandbox struct {
	ID        string             `json:"id"`
	State     State              `json:"state"`
	Template  string             `json:"template"`
	Parent    string             `json:"parent,omitempty"`
	RootFS    string             `json:"rootfs"`
	Run       snapshot.RunConfig `json:"run"`
	CreatedAt time.Time          `json:"created_at"`
	Instance  string             `json:"instance,omitempty"`
	// Addr is where the host reaches the sandbox's ports (invalid without
	// network or while hibernated).
	Addr   netip.Addr   `json:"addr,omitzero"`
	Policy netns.Policy `json:"policy"`
	Death  *Death       `json:"death,omitempty"` // why and when a dead sandbox died
	// Hibernation is the snapshot holding it while hibernated.
	Hibernation string `json:"hibernation,omitempty"`
	// RootFSID and RuntimeBuild are the root filesystem build and the
	// runtime build its instance runs with (versions.go).
	RootFSID     string `json:"rootfs_id,omitempty"`
	RuntimeBuild string `json:"runtime_build,omitempty"`
}

func (r *record) view() Sandbox {
	st := r.State
	if r.Pending != nil {
		if s, ok := opState[r.Pending.Op]; ok {
			st = s
		}
	}
	return Sandbox{ID: r.ID, State: st, Template: r.Template, Parent: r.Parent, RootFS: r.RootFS,
		Run: r.Run, CreatedAt: r.CreatedAt, Instance: r.Instance, Addr: r.Addr, Policy: r.Policy, Death: r.Death, Hibernation: r.Hibernation,
		RootFSID: r.RootFSID, RuntimeBuild: r.RuntimeBuild}
}

func (e *Engine) recordPath(id string) string {
	return filepath.Join(e.dir, "sandboxes", id+".json")
}

// save persists rec (atomically, durably) and publishes it to readers.
func (e *Engine) save(rec *record) error { return e.store(rec, true) }

// saveState persists a change between running and paused without fsync:
// atomic (rename) and kept across a crash of this process, which is what
// matters, since a power loss takes every instance with it and recovery
// then drops their records whatever state they name. It saves ~2 ms of a
// ~15 ms pause or resume.
func (e *Engine) saveState(rec *record) error { return e.store(rec, false) }

func (e *Engine) store(rec *record, durable bool) error {
	cp := *rec
	cp.Version = recordVersion
	if rec.Pending != nil {
		p := *rec.Pending
		cp.Pending = &p
	}
	write := atomicfs.WriteJSON
	if !durable {
		write = atomicfs.WriteJSONNoSync
	}
	if err := write(e.recordPath(rec.ID), &cp); err != nil {
		return fmt.Errorf("sandbox %s: save record: %w", rec.ID, err)
	}
	e.mu.Lock()
	e.records[rec.ID] = &cp
	e.mu.Unlock()
	return nil
}

// forget removes a sandbox's record.
func (e *Engine) forget(id string) error {
	if err := os.Remove(e.recordPath(id)); err != nil && !os.IsNotExist(err) {
		return fmt.Errorf("sandbox %s: remove record: %w", id, err)
	}
	_ = atomicfs.SyncDir(filepath.Dir(e.recordPath(id)))
	e.mu.Lock()
	delete(e.records, id)
	delete(e.locks, id)
	e.mu.Unlock()
	return nil
}

// load returns a copy of a sandbox's record.
func (e *Engine) load(id string) (*record, error) {
	if err := ids.Validate("sandbox ID", id); err != nil {
		return nil, err
	}
	e.mu.Lock()
	defer e.mu.Unlock()
	r, ok := e.records[id]
	if !ok {
		return nil, fmt.Errorf("sandbox %s: %w", id, errdefs.ErrNotFound)
	}
	cp := *r
	if r.Pending != nil {
		p := *r.Pending
		cp.Pending = &p
	}
	return &cp, nil
}

// opLock serializes operations on one sandbox. It is a channel so that a
// waiting caller gives up when its context ends.
type opLock chan struct{}

// lock takes the operation lock of sandbox id and returns its record as it
// is once the lock is held. Operations on one sandbox are serialized; the
// state checks each operation makes after locking refuse the ones that no
// longer apply.
func (e *Engine) lock(ctx context.Context, id string) (*record, func(), error) {
	if err := ids.Validate("sandbox ID", id); err != nil {
		return nil, nil, err
	}
	e.mu.Lock()
	if _, ok := e.records[id]; !ok {
		e.mu.Unlock()
		return nil, nil, fmt.Errorf("sandbox %s: %w", id, errdefs.ErrNotFound)
	}
	l, ok := e.locks[id]
	if !ok {
		l = make(opLock, 1)
		e.locks[id] = l
	}
	e.mu.Unlock()
	select {
	case l <- struct{}{}:
	case <-ctx.Done():
		return nil, nil, fmt.Errorf("sandbox %s: waiting for the operation in progress: %w", id, ctx.Err())
	}
	e.opBegin()
	unlock := func() { <-l; e.opEnd() }
	rec, err := e.load(id) // it may have been killed while we waited
	if err != nil {
		unlock()
		return nil, nil, err
	}
	return rec, unlock, nil
}

// claim takes the operation lock of id whether or not a sandbox of that
// ID exists yet: a create under a caller-given ID holds it while it
// restores, so a replay of the same create waits for the first and then
// finds its sandbox instead of making a second. It returns the record
// when one exists (nil otherwise).
func (e *Engine) claim(ctx context.Context, id string) (*record, func(), error) {
	if err := ids.Validate("sandbox ID", id); err != nil {
		return nil, nil, err
	}
	for {
		e.mu.Lock()
		l, ok := e.locks[id]
		if !ok {
			l = make(opLock, 1)
			e.locks[id] = l
		}
		e.mu.Unlock()
		select {
		case l <- struct{}{}:
		case <-ctx.Done():
			return nil, nil, fmt.Errorf("sandbox %s: waiting for the operation in progress: %w", id, ctx.Err())
		}
		e.mu.Lock()
		current := e.locks[id] == l
		if !current {
			// A failed create forgot the sandbox (and its lock) while we
			// waited: take the lock now in place, if any.
			e.mu.Unlock()
			<-l
			continue
		}
		var rec *record
		if r, ok := e.records[id]; ok {
			cp := *r
			if r.Pending != nil {
				p := *r.Pending
				cp.Pending = &p
			}
			rec = &cp
		}
		e.mu.Unlock()
		e.opBegin()
		unlock := func() {
			defer e.opEnd()
			// A create that failed leaves no record: drop its lock so
			// the map does not keep one per failed ID.
			e.mu.Lock()
			if _, ok := e.records[id]; !ok && e.locks[id] == l {
				delete(e.locks, id)
			}
			e.mu.Unlock()
			<-l
		}
		return rec, unlock, nil
	}
}

// opBegin and opEnd count the operations in flight (those holding a
// sandbox's operation lock) and note when the last ended: the targets a
// burst adds are made only while the engine is quiet (quietFor).
func (e *Engine) opBegin() { e.ops.Add(1) }

func (e *Engine) opEnd() {
	e.lastOp.Store(time.Now().UnixNano())
	e.ops.Add(-1)
}

// quietFor reports whether no operation is in flight and none ended in the
// last d.
func (e *Engine) quietFor(d time.Duration) bool {
	return e.ops.Load() == 0 && time.Since(time.Unix(0, e.lastOp.Load())) >= d
}

// wantState refuses an operation on a sandbox in the wrong state.
func wantState(rec *record, verb string, allowed ...State) error {
	for _, s := range allowed {
		if rec.State == s {
			return nil
		}
	}
	return fmt.Errorf("sandbox %s is %s: cannot %s it: %w", rec.ID, rec.State, verb, errdefs.ErrConflict)
}

package engine

import (
	"net/netip"
	"time"

	"github.com/spore-run/spore/internal/errdefs"
	"github.com/spore-run/spore/internal/runtime"
)

// Death says why and when a sandbox's instance died on its own.
type Death struct {
	Reason   runtime.ExitReason `json:"reason"` // oom | crashed
	Detail   string             `json:"detail,omitempty"`
	Instance string             `json:"instance"`
	At       time.Time          `json:"at"`       // when the runtime saw it die
	Recorded time.Time          `json:"recorded"` // when the engine recorded it
}

// OnDeath registers fn to be called (from its own goroutine, after the
// record is saved) with the view of every sandbox whose instance dies on
// its own. The control plane uses it to end streams and update its store.
func (e *Engine) OnDeath(fn func(Sandbox)) {
	e.mu.Lock()
	e.deathFns = append(e.deathFns, fn)
	e.mu.Unlock()
}

// watch follows an instance until it is gone (runtimes with the
// runtime.Waiter capability). Every instance launch starts one; recovery
// starts one for each instance it re-attaches to. If the instance is
// still the one a running or paused sandbox names when it dies, the
// sandbox is marked dead (see died); deaths the engine caused (kill,
// rollback, hibernate, a failed create) find the record changed and are
// ignored.
func (e *Engine) watch(sandboxID, instance string) {
	w, ok := e.rt.(runtime.Waiter)
	if !ok || instance == "" {
		return
	}
	go func() {
		ex, err := w.Wait(e.life, instance)
		if e.life.Err() != nil {
			return
		}
		if err != nil {
			if !errdefs.IsNotFound(err) {
				e.log.Warn("cannot watch instance", "sandbox_id", sandboxID, "instance", instance, "err", err)
			}
			return
		}
		e.died(sandboxID, instance, ex)
	}()
}

// died records that a sandbox's instance ended by itself and frees what
// the instance held (runsc state, cgroups, network).
func (e *Engine) died(id, instance string, ex runtime.Exit) {
	ctx, cancel := cleanupCtx()
	defer cancel()
	rec, unlock, err := e.lock(ctx, id)
	if err != nil {
		return // killed meanwhile
	}
	if rec.Instance != instance || (rec.State != StateRunning && rec.State != StatePaused) {
		unlock() // the engine replaced or killed it on purpose
		return
	}
	log := e.log.With("sandbox_id", id, "instance", instance)
	log.Warn("sandbox died", "reason", ex.Reason, "detail", ex.Detail)
	if err := e.killInstance(ctx, instance); err != nil {
		// The record keeps naming the instance: Kill retries.
		log.Error("free dead instance", "err", err)
	} else {
		rec.Instance, rec.Addr = "", netip.Addr{}
	}
	rec.State = StateDead
	rec.Death = &Death{Reason: ex.Reason, Detail: ex.Detail, Instance: instance, At: ex.At, Recorded: time.Now()}
	if err := e.save(rec); err != nil {
		log.Error("record death", "err", err)
	}
	view := rec.view()
	unlock()
	e.mu.Lock()
	fns := append([]func(Sandbox){}, e.deathFns...)
	e.mu.Unlock()
	for _, fn := range fns {
		fn(view)
	}
}

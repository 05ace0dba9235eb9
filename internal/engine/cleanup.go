package engine

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"time"

	"github.com/spore-run/spore/internal/atomicfs"
	"github.com/spore-run/spore/internal/errdefs"
	"github.com/spore-run/spore/internal/ids"
)

// The cleanup journal holds what the engine still has to free: an
// instance an operation replaced or abandoned (rollback, resume from
// hibernation, a failed create, a kill) or a snapshot it discarded. One
// file per resource, engine/cleanup/<kind>-<id>.json, written durably
// before the record stops naming the resource, removed once the resource
// is gone. So a failed cleanup is never forgotten: it is retried in the
// background with backoff while the engine runs, and by the next Open.
// Being separate from the sandbox's record, an entry survives the
// sandbox's next operations and the sandbox itself.

// Cleanup is one pending entry of the cleanup journal.
type Cleanup struct {
	Sandbox  string `json:"sandbox,omitempty"`  // whose it was
	Instance string `json:"instance,omitempty"` // instance to kill, or
	Snapshot string `json:"snapshot,omitempty"` // snapshot to delete
	// Images are volume images to free once the instance or snapshot is
	// (exclusive.go); an entry may name these alone.
	Images   []ImageAction `json:"images,omitempty"`
	Since    time.Time     `json:"since"`
	Attempts int           `json:"attempts,omitempty"`
	LastErr  string        `json:"last_error,omitempty"`
}

func (c Cleanup) key() string {
	switch {
	case c.Instance != "":
		return "instance-" + c.Instance
	case c.Snapshot != "":
		return "snapshot-" + c.Snapshot
	case len(c.Images) > 0:
		return "images-" + c.Images[0].Image
	}
	return "empty"
}

func (e *Engine) cleanupDir() string { return filepath.Join(e.dir, "cleanup") }

func (e *Engine) cleanupPath(c Cleanup) string {
	return filepath.Join(e.cleanupDir(), c.key()+".json")
}

// journalCleanup durably records that sandbox's instance and/or snapshot
// must be freed ("" parts are skipped), with the volume images acts
// (after the instance, else the snapshot, else alone), and returns the
// entries written.
func (e *Engine) journalCleanup(sandbox, instance, snap string, acts ...ImageAction) ([]Cleanup, error) {
	var out []Cleanup
	now := time.Now().UTC()
	if instance != "" {
		out = append(out, Cleanup{Sandbox: sandbox, Instance: instance, Since: now})
	}
	if snap != "" {
		out = append(out, Cleanup{Sandbox: sandbox, Snapshot: snap, Since: now})
	}
	if len(acts) > 0 {
		if len(out) == 0 {
			out = append(out, Cleanup{Sandbox: sandbox, Since: now})
		}
		out[0].Images = acts
	}
	for _, c := range out {
		if err := atomicfs.WriteJSON(e.cleanupPath(c), c); err != nil {
			return nil, fmt.Errorf("sandbox %s: journal cleanup of %s: %w", sandbox, c.key(), err)
		}
	}
	return out, nil
}

// PendingCleanups lists what the engine has yet to free (normally empty;
// an entry stays while the runtime keeps failing to free it).
func (e *Engine) PendingCleanups() []Cleanup {
	ents, err := os.ReadDir(e.cleanupDir())
	if err != nil {
		return nil
	}
	var out []Cleanup
	for _, ent := range ents {
		if !strings.HasSuffix(ent.Name(), ".json") || strings.HasPrefix(ent.Name(), ".") {
			continue
		}
		var c Cleanup
		if err := atomicfs.ReadJSON(filepath.Join(e.cleanupDir(), ent.Name()), &c); err != nil {
			continue
		}
		out = append(out, c)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].key() < out[j].key() })
	return out
}

// loadCleanups reads the journal at Open, dropping temporary files and
// entries that cannot be read or name nothing valid (logged).
func (e *Engine) loadCleanups() []Cleanup {
	ents, err := os.ReadDir(e.cleanupDir())
	if err != nil {
		e.log.Error("read cleanup journal", "err", err)
		return nil
	}
	var out []Cleanup
	for _, ent := range ents {
		path := filepath.Join(e.cleanupDir(), ent.Name())
		if !strings.HasSuffix(ent.Name(), ".json") || strings.HasPrefix(ent.Name(), ".") {
			os.Remove(path) // temporary file of an interrupted write
			continue
		}
		var c Cleanup
		err := atomicfs.ReadJSON(path, &c)
		if err == nil && c.Instance != "" && c.Snapshot != "" || c.Instance == "" && c.Snapshot == "" && len(c.Images) == 0 {
			err = errors.New("names neither or both of an instance and a snapshot")
		}
		for _, a := range c.Images {
			if err == nil {
				err = ids.Validate("volume image", a.Image)
			}
		}
		if err == nil && c.Instance != "" {
			err = ids.Validate("instance ID", c.Instance)
		}
		if err == nil && c.Snapshot != "" {
			err = ids.Validate("snapshot ID", c.Snapshot)
		}
		if err == nil && c.key()+".json" != ent.Name() {
			err = fmt.Errorf("names %s", c.key())
		}
		if err != nil {
			// Nothing can be done with it; what it named, if anything, is
			// an orphan that recovery removes anyway.
			e.log.Error("unreadable cleanup journal entry: dropped", "file", path, "err", err)
			os.Remove(path)
			continue
		}
		out = append(out, c)
	}
	return out
}

// claimed reports whether a record names what c names as its own: then
// it must not be freed. (Instance names are never reused, see
// record.newInstance, so this guards against bugs, not races.)
func (e *Engine) claimed(c Cleanup) bool {
	e.mu.Lock()
	defer e.mu.Unlock()
	for _, r := range e.records {
		if c.Instance != "" && r.Instance == c.Instance {
			return true
		}
		if c.Snapshot != "" && r.Hibernation == c.Snapshot {
			return true
		}
	}
	return false
}

// runCleanup frees what c names and removes its entry. Already gone counts
// as freed.
func (e *Engine) runCleanup(ctx context.Context, c Cleanup) error {
	if e.claimed(c) {
		e.log.Error("cleanup entry names what a sandbox uses: dropped, not freed", "sandbox_id", c.Sandbox, "entry", c.key())
		return e.dropCleanup(c)
	}
	var err error
	switch {
	case c.Instance != "":
		err = e.killInstance(ctx, c.Instance)
	case c.Snapshot != "":
		if err = e.snaps.Delete(c.Snapshot); errdefs.IsNotFound(err) {
			err = nil
		}
	}
	if err == nil {
		err = e.runImageActions(ctx, c.Images)
	}
	if err != nil {
		c.Attempts++
		c.LastErr = err.Error()
		if werr := atomicfs.WriteJSONNoSync(e.cleanupPath(c), c); werr != nil {
			e.log.Warn("update cleanup journal entry", "entry", c.key(), "err", werr)
		}
		return fmt.Errorf("free %s of sandbox %s: %w", c.key(), c.Sandbox, err)
	}
	return e.dropCleanup(c)
}

func (e *Engine) dropCleanup(c Cleanup) error {
	if err := os.Remove(e.cleanupPath(c)); err != nil && !os.IsNotExist(err) {
		return fmt.Errorf("remove cleanup journal entry %s: %w", c.key(), err)
	}
	return nil
}

// cleanNow tries each cleanup once; what fails stays journaled, is logged
// and is left to the background retrier.
func (e *Engine) cleanNow(ctx context.Context, cs []Cleanup) {
	failed := false
	for _, c := range cs {
		if err := e.runCleanup(ctx, c); err != nil {
			e.log.Error("cleanup failed: kept in the journal, will retry", "sandbox_id", c.Sandbox, "entry", c.key(), "err", err)
			failed = true
		}
	}
	if failed {
		e.kickCleanups()
	}
}

// discard journals sandbox's instance and/or snapshot for freeing and
// tries to free them now; a failure is retried (see the journal above).
// If even the journal cannot be written, it frees them directly.
func (e *Engine) discard(sandbox, instance, snap string) {
	cs, err := e.journalCleanup(sandbox, instance, snap)
	if err != nil {
		e.log.Error("journal cleanup; freeing without it", "sandbox_id", sandbox, "err", err)
		cs = nil
		if instance != "" {
			cs = append(cs, Cleanup{Sandbox: sandbox, Instance: instance})
		}
		if snap != "" {
			cs = append(cs, Cleanup{Sandbox: sandbox, Snapshot: snap})
		}
	}
	cctx, cancel := cleanupCtx()
	defer cancel()
	e.cleanNow(cctx, cs)
}

// kickCleanups makes sure the background retrier runs. It retries every
// journaled cleanup with exponential backoff (CleanupRetry doubling up to
// a minute) until the journal is empty or the engine is closed.
func (e *Engine) kickCleanups() {
	e.mu.Lock()
	e.cleanGen++
	if e.cleaning {
		e.mu.Unlock()
		return
	}
	e.cleaning = true
	e.mu.Unlock()
	e.retrier.Add(1)
	go func() {
		defer e.retrier.Done()
		wait := e.cleanRetry
		for {
			select {
			case <-e.life.Done():
				e.mu.Lock()
				e.cleaning = false
				e.mu.Unlock()
				return
			case <-time.After(wait):
			}
			e.mu.Lock()
			gen := e.cleanGen
			e.mu.Unlock()
			left := 0
			for _, c := range e.PendingCleanups() {
				ctx, cancel := cleanupCtx()
				if err := e.runCleanup(ctx, c); err != nil {
					left++
					e.log.Warn("cleanup retry failed", "sandbox_id", c.Sandbox, "entry", c.key(), "attempts", c.Attempts+1, "err", err)
				} else {
					e.log.Info("cleanup retry succeeded", "sandbox_id", c.Sandbox, "entry", c.key())
				}
				cancel()
			}
			e.mu.Lock()
			if left == 0 && gen == e.cleanGen {
				e.cleaning = false
				e.mu.Unlock()
				return
			}
			e.mu.Unlock()
			wait = min(2*wait, time.Minute)
		}
	}()
}

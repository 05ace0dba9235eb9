package chunk

// Garbage collection, and why it is safe beside concurrent Packs.
//
// Objects: manifests/<id>.json (committed trees), pending/<id>.json (the
// chunks an in-flight Pack uses), gc/<run>.json (a GC in progress, with its
// sweep budget B), chunks/... (the chunks). All times are the store's
// (Info.Modified); durations are measured with the local monotonic clock.
//
// GC run:
//  1. put gc/<run>.json; its Modified is k0, "now" by the store's clock.
//  2. list pending/ (ignoring and removing markers older than StaleAfter),
//     THEN list manifests/; mark every chunk they name.
//  3. list chunks/; a chunk is swept if unmarked and Modified < k0-Grace.
//  4. delete the swept chunks, but none once B has passed since step 1
//     (the run then stops with an error; a rerun finishes the job).
//  5. delete gc/<run>.json.
//
// Pack P: cut the tree; put pending/<id>.json (Modified t0); list gc/ and
// note the runs whose marker is alive (Modified+B not yet past); make
// every chunk present (stat, upload if missing); wait until each noted run
// has ended or run out of budget, and if there was one, stat every chunk
// again and upload what is missing; commit manifests/<id>.json only if
// less than StaleAfter/2 has passed since t0; delete pending/<id>.json.
//
// Claim: a chunk named by a committed manifest M (of Pack P) is never
// deleted by a GC run R. R deletes chunk c only if c was in no marker R
// read. Case 1, R's pending listing saw P's marker: c is marked (the marker
// lists every chunk of M). Case 2, the marker was gone: P had already
// committed M (it removes the marker after the commit), and R lists
// manifests after pending, so it saw M. Case 3, the marker was not there
// yet: R put gc/<run> before that listing, so before P put its marker, so
// before P listed gc/ (the store is read-after-write and list-after-write
// consistent). Either R had already ended when P listed gc/ (then all of
// R's deletes came before P's stats, which saw them and uploaded again),
// or P saw R's marker, waited until R ended or its budget ran out (after
// which R deletes nothing) and then re-checked c, uploading it again if R
// had deleted it. No other run can delete it afterwards (each later run
// is in case 1 or 2). Re-checking only at the end would not do: a run can
// delete c after P's stat and end before P looks at gc/. Case 4, R ignored P's marker as
// stale: it is older than StaleAfter at k0, but P commits within
// StaleAfter/2 of t0, so M was committed before k0 (case 2).
//
// Held manifests (Manifest.Held: a snapshot's root filesystem tree and
// runtime build, kept while a snapshot needs them) follow the same rule as
// chunks, with references in place of chunk names: a manifest or a
// pending marker lists the held manifests it refers to (Refs), step 2
// collects them, and a held manifest that none refers to and that is older
// than Grace is deleted in step 4 (before the chunks, under the same
// budget), and its chunks are not marked. A Pack that refers to one makes
// it present after putting its marker and again after waiting for the
// runs it noted (EnsureRefs), as it does for its chunks: the claim above,
// with "held manifest" for "chunk", holds by the same four cases.
//
// A run killed midway has only deleted unmarked chunks; its marker keeps
// Packs waiting until its budget has passed (and the next run removes it).
// Grace is defence in depth: nothing written in the last Grace is swept,
// so a writer outside this protocol (an old binary, a hand copy) has that
// long to commit. The rule "reuse a chunk only if it is younger than
// Grace/2" is not needed: a stale listing followed by an unconditional
// delete can remove a chunk that was re-put in between, whatever its age
// was, which is why P re-checks after the runs it may have raced.

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"strings"
	"sync"
	"time"

	"github.com/spore-run/spore/internal/blob"
	"github.com/spore-run/spore/internal/errdefs"
)

// clockSlack covers stores whose Modified has a coarse resolution (S3's
// Last-Modified is in whole seconds).
const clockSlack = 2 * time.Second

// storeClock is the store's time at one moment (the Modified of an object
// just written) plus the local monotonic clock around that write.
type storeClock struct {
	at     time.Time
	before time.Time // local, right before the write began
	after  time.Time // local, right after it returned
}

// elapsed bounds from above the store time passed since at (at is no
// earlier than the write's start).
func (c storeClock) elapsed() time.Duration { return time.Since(c.before) }

// now bounds from below the store's current time (at is no later than the
// write's end).
func (c storeClock) now() time.Time { return c.at.Add(time.Since(c.after)) }

// markNow puts key and returns the store's clock from its Modified.
func markNow(ctx context.Context, store blob.Store, key string, b []byte) (storeClock, error) {
	before := time.Now()
	if err := putBytes(ctx, store, key, b); err != nil {
		return storeClock{}, err
	}
	after := time.Now()
	info, err := store.Stat(ctx, key)
	if err != nil {
		return storeClock{}, fmt.Errorf("stat %s: %w", key, err)
	}
	return storeClock{at: info.Modified, before: before, after: after}, nil
}

// gcMarker is gc/<run>.json.
type gcMarker struct {
	Budget time.Duration `json:"budget_ns"`
}

// alive reports whether a GC run whose marker was written at modified with
// budget b may still delete, judged at the store time now.
func alive(modified time.Time, b time.Duration, now time.Time) bool {
	return !modified.Add(b + clockSlack).Before(now)
}

// gcRun is a GC run's marker as a Pack saw it.
type gcRun struct {
	info   blob.Info
	budget time.Duration
}

// liveGCs lists the GC runs that may still delete (markers whose budget
// has not run out by the store clock).
func liveGCs(ctx context.Context, store blob.Store, clock storeClock) ([]gcRun, error) {
	var infos []blob.Info
	err := store.List(ctx, "gc/", func(info blob.Info) error {
		infos = append(infos, info)
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("list gc runs: %w", err)
	}
	var runs []gcRun
	for _, info := range infos {
		m, err := readGCMarker(ctx, store, info.Key)
		if errdefs.IsNotFound(err) {
			continue // ended
		}
		if err != nil {
			return nil, err
		}
		if alive(info.Modified, m.Budget, clock.now()) {
			runs = append(runs, gcRun{info: info, budget: m.Budget})
		}
	}
	return runs, nil
}

// waitGCs waits until each run has ended (its marker is gone) or can no
// longer delete (its budget ran out).
func waitGCs(ctx context.Context, store blob.Store, runs []gcRun, clock storeClock, poll time.Duration, log *slog.Logger) error {
	for _, r := range runs {
		log.Info("chunk: pack waits for a gc run to end", "run", r.info.Key)
		for alive(r.info.Modified, r.budget, clock.now()) {
			if _, err := store.Stat(ctx, r.info.Key); errdefs.IsNotFound(err) {
				break
			} else if err != nil {
				return fmt.Errorf("stat %s: %w", r.info.Key, err)
			}
			select {
			case <-ctx.Done():
				return ctx.Err()
			case <-time.After(poll):
			}
		}
	}
	return nil
}

func readGCMarker(ctx context.Context, store blob.Store, key string) (gcMarker, error) {
	var m gcMarker
	rc, err := store.Get(ctx, key)
	if err != nil {
		return m, err
	}
	defer rc.Close()
	b, err := io.ReadAll(io.LimitReader(rc, 1<<16))
	if err != nil {
		return m, fmt.Errorf("read %s: %w", key, err)
	}
	if err := json.Unmarshal(b, &m); err != nil || m.Budget <= 0 {
		// Not written by GC; refuse to guess how long it may delete.
		return m, fmt.Errorf("%w: %s is not a gc marker", errdefs.ErrInternal, key)
	}
	return m, nil
}

// GCOptions configure GC.
type GCOptions struct {
	// Grace: chunks written more recently are never swept (default 1h).
	Grace time.Duration
	// Budget: how long after its start the run may still delete
	// (default Grace/2, at most 10 min). Packs may wait that long for a
	// run that was killed.
	Budget time.Duration
	// StaleAfter must match the Packs' (default DefaultStaleAfter).
	StaleAfter time.Duration
	// Concurrency bounds the deletes at once (default 8).
	Concurrency int
	// DryRun reports what would be deleted and deletes nothing.
	DryRun bool
	Log    *slog.Logger

	beforeSweep func() // test hook
}

// Report describes one GC run.
type Report struct {
	Deleted      int   // chunks deleted
	FreedBytes   int64 // their stored bytes
	Kept         int   // chunks kept: Referenced + Young
	Referenced   int   // named by a manifest or a live pending marker
	Young        int   // unreferenced but written within the grace period
	Manifests    int
	Pending      int // live pending markers honoured
	StalePending int // stale pending markers removed
	HeldKept     int // held manifests referred to, or young
	HeldDeleted  []string
}

// marks is what a run found in use: chunks, and held manifests referred to.
type marks struct {
	chunks map[ID]struct{}
	refs   map[string]bool
	held   []heldManifest // every held manifest listed
}

type heldManifest struct {
	info   blob.Info
	id     string
	chunks []ID
}

// GC deletes the chunks that no manifest and no live pending marker names
// and that are older than the grace period, and the held manifests that
// none refers to and that are older than it. See the protocol above.
func GC(ctx context.Context, store blob.Store, opts GCOptions) (Report, error) {
	var rep Report
	if opts.Grace <= 0 {
		opts.Grace = time.Hour
	}
	if opts.Budget <= 0 {
		opts.Budget = min(opts.Grace/2, 10*time.Minute)
	}
	if opts.StaleAfter <= 0 {
		opts.StaleAfter = DefaultStaleAfter
	}
	if opts.Budget > opts.StaleAfter/4 {
		// A Pack may wait Budget for a run; it must still commit within
		// StaleAfter/2.
		return rep, errdefs.Invalidf("gc budget %v is more than a quarter of StaleAfter %v", opts.Budget, opts.StaleAfter)
	}
	if opts.Concurrency <= 0 {
		opts.Concurrency = 8
	}
	log := opts.Log
	if log == nil {
		log = slog.Default()
	}

	var rb [8]byte
	_, _ = rand.Read(rb[:])
	runKey := "gc/" + hex.EncodeToString(rb[:]) + ".json"
	mb, _ := json.Marshal(gcMarker{Budget: opts.Budget})
	clock, err := markNow(ctx, store, runKey, mb)
	if err != nil {
		return rep, fmt.Errorf("gc: %w", err)
	}
	k0 := clock.at
	// The marker goes when the run ends; a killed run's stays until the
	// next run finds it dead.
	defer func() {
		if err := store.Delete(context.WithoutCancel(ctx), runKey); err != nil {
			log.Warn("chunk: gc: remove run marker", "key", runKey, "err", err)
		}
	}()
	if err := removeDeadRuns(ctx, store, runKey, k0); err != nil {
		return rep, err
	}

	mk := &marks{chunks: map[ID]struct{}{}, refs: map[string]bool{}}
	if err := markPending(ctx, store, k0, opts.StaleAfter, mk, &rep); err != nil {
		return rep, err
	}
	if err := markManifests(ctx, store, mk, &rep); err != nil {
		return rep, err
	}
	cutoff := k0.Add(-opts.Grace)
	var unheld []heldManifest
	for _, h := range mk.held {
		if mk.refs[h.id] || !h.info.Modified.Before(cutoff) {
			rep.HeldKept++
			for _, id := range h.chunks {
				mk.chunks[id] = struct{}{}
			}
			continue
		}
		unheld = append(unheld, h)
	}
	marked := mk.chunks

	var sweep []blob.Info
	err = store.List(ctx, "chunks/", func(info blob.Info) error {
		id, ok := chunkFromKey(info.Key)
		if !ok {
			return nil // not ours (a store's temporary object, say)
		}
		switch _, ref := marked[id]; {
		case ref:
			rep.Referenced++
		case info.Modified.Before(cutoff):
			sweep = append(sweep, info)
		default:
			rep.Young++
		}
		return nil
	})
	if err != nil {
		return rep, fmt.Errorf("gc: list chunks: %w", err)
	}
	rep.Kept = rep.Referenced + rep.Young
	if opts.beforeSweep != nil {
		opts.beforeSweep()
	}
	if opts.DryRun {
		for _, info := range sweep {
			rep.Deleted++
			rep.FreedBytes += info.Size
		}
		for _, h := range unheld {
			rep.HeldDeleted = append(rep.HeldDeleted, h.id)
		}
		return rep, nil
	}
	if err := deleteHeld(ctx, store, unheld, clock, opts, &rep); err != nil {
		return rep, err
	}
	err = sweepChunks(ctx, store, sweep, clock, opts, &rep)
	log.Info("chunk: gc", "deleted", rep.Deleted, "freed_bytes", rep.FreedBytes, "kept", rep.Kept,
		"manifests", rep.Manifests, "pending", rep.Pending, "held_deleted", len(rep.HeldDeleted), "err", err)
	return rep, err
}

// removeDeadRuns deletes the markers of runs that were killed.
func removeDeadRuns(ctx context.Context, store blob.Store, self string, now time.Time) error {
	var dead []string
	err := store.List(ctx, "gc/", func(info blob.Info) error {
		if info.Key == self {
			return nil
		}
		m, err := readGCMarker(ctx, store, info.Key)
		if err == nil && !alive(info.Modified, m.Budget, now) {
			dead = append(dead, info.Key)
		}
		return nil // a live or unreadable marker stays
	})
	if err != nil {
		return fmt.Errorf("gc: list runs: %w", err)
	}
	for _, k := range dead {
		if err := store.Delete(ctx, k); err != nil {
			return fmt.Errorf("gc: remove dead run %s: %w", k, err)
		}
	}
	return nil
}

func markPending(ctx context.Context, store blob.Store, k0 time.Time, staleAfter time.Duration, mk *marks, rep *Report) error {
	var live []string
	var stale []string
	err := store.List(ctx, "pending/", func(info blob.Info) error {
		if info.Modified.Before(k0.Add(-staleAfter)) {
			stale = append(stale, info.Key)
		} else {
			live = append(live, info.Key)
		}
		return nil
	})
	if err != nil {
		return fmt.Errorf("gc: list pending: %w", err)
	}
	for _, key := range live {
		p, err := readPending(ctx, store, key)
		if errdefs.IsNotFound(err) {
			continue // committed since: its manifest is listed next
		}
		if err != nil {
			return fmt.Errorf("gc: %w", err) // never sweep on partial knowledge
		}
		rep.Pending++
		for _, id := range p.Chunks {
			mk.chunks[id] = struct{}{}
		}
		for _, r := range p.Refs {
			mk.refs[r] = true
		}
	}
	for _, key := range stale {
		if err := store.Delete(ctx, key); err != nil {
			return fmt.Errorf("gc: remove stale %s: %w", key, err)
		}
		rep.StalePending++
	}
	return nil
}

func readPending(ctx context.Context, store blob.Store, key string) (*pending, error) {
	rc, err := store.Get(ctx, key)
	if err != nil {
		return nil, err
	}
	defer rc.Close()
	b, err := io.ReadAll(io.LimitReader(rc, maxManifest))
	if err != nil {
		return nil, fmt.Errorf("read %s: %w", key, err)
	}
	var p pending
	d := json.NewDecoder(bytes.NewReader(b))
	d.DisallowUnknownFields()
	if err := d.Decode(&p); err != nil || p.Format != FormatVersion {
		return nil, fmt.Errorf("%w: %s: not a pending marker of format %d", errdefs.ErrInvalidArgument, key, FormatVersion)
	}
	return &p, nil
}

// markManifests marks the chunks of every manifest but the held ones,
// whose chunks it records (GC marks them if it keeps the manifest), and
// the held manifests they all refer to.
func markManifests(ctx context.Context, store blob.Store, mk *marks, rep *Report) error {
	var infos []blob.Info
	err := store.List(ctx, "manifests/", func(info blob.Info) error {
		infos = append(infos, info)
		return nil
	})
	if err != nil {
		return fmt.Errorf("gc: list manifests: %w", err)
	}
	for _, info := range infos {
		m, err := readManifestKey(ctx, store, info.Key)
		if errdefs.IsNotFound(err) {
			continue // deleted since
		}
		if err != nil {
			return fmt.Errorf("gc: %w", err)
		}
		rep.Manifests++
		for _, r := range m.Refs {
			mk.refs[r] = true
		}
		if m.Held && info.Key == ManifestKey(m.ID) {
			h := heldManifest{info: info, id: m.ID}
			for id := range m.ChunkIDs() {
				h.chunks = append(h.chunks, id)
			}
			mk.held = append(mk.held, h)
			continue
		}
		for _, e := range m.Entries {
			for _, r := range e.Chunks {
				mk.chunks[r.ID] = struct{}{}
			}
		}
	}
	return nil
}

// deleteHeld deletes the held manifests nothing refers to, each only
// while the run's budget lasts (as a chunk's delete).
func deleteHeld(ctx context.Context, store blob.Store, unheld []heldManifest, clock storeClock, opts GCOptions, rep *Report) error {
	for _, h := range unheld {
		if el := clock.elapsed(); el > opts.Budget {
			return fmt.Errorf("%w: gc: stopped after %v (budget %v); rerun to finish", errdefs.ErrUnavailable, el, opts.Budget)
		}
		if err := store.Delete(ctx, h.info.Key); err != nil {
			return fmt.Errorf("gc: delete held manifest %s: %w", h.id, err)
		}
		rep.HeldDeleted = append(rep.HeldDeleted, h.id)
	}
	return nil
}

// chunkFromKey parses chunks/<2 hex>/<64 hex>.
func chunkFromKey(key string) (ID, bool) {
	rest, ok := strings.CutPrefix(key, "chunks/")
	if !ok || len(rest) != 3+2*len(ID{}) || rest[2] != '/' {
		return ID{}, false
	}
	id, err := ParseID(rest[3:])
	if err != nil || rest[:2] != id.String()[:2] {
		return ID{}, false
	}
	return id, true
}

func sweepChunks(ctx context.Context, store blob.Store, sweep []blob.Info, clock storeClock, opts GCOptions, rep *Report) error {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	work := make(chan blob.Info)
	var mu sync.Mutex
	var firstErr error
	fail := func(err error) {
		mu.Lock()
		if firstErr == nil {
			firstErr = err
		}
		mu.Unlock()
		cancel()
	}
	var wg sync.WaitGroup
	for range opts.Concurrency {
		wg.Go(func() {
			for info := range work {
				// Checked before every delete: past the budget a Pack may
				// have stopped waiting for us.
				if el := clock.elapsed(); el > opts.Budget {
					fail(fmt.Errorf("%w: gc: sweep stopped after %v (budget %v); rerun to finish", errdefs.ErrUnavailable, el, opts.Budget))
					return
				}
				if err := store.Delete(ctx, info.Key); err != nil {
					fail(fmt.Errorf("gc: delete %s: %w", info.Key, err))
					return
				}
				mu.Lock()
				rep.Deleted++
				rep.FreedBytes += info.Size
				mu.Unlock()
			}
		})
	}
feed:
	for _, info := range sweep {
		select {
		case work <- info:
		case <-ctx.Done():
			break feed
		}
	}
	close(work)
	wg.Wait()
	if firstErr != nil {
		return firstErr
	}
	return ctx.Err()
}

package chunk

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"github.com/spore-run/spore/internal/blob"
	"github.com/spore-run/spore/internal/errdefs"
)

// DefaultStaleAfter is how old a pending marker must be before GC ignores
// (and removes) it. Pack gives up at half of it, so a marker GC ignores
// belongs to a Pack that can no longer commit.
const DefaultStaleAfter = 24 * time.Hour

// PackOptions configure Pack.
type PackOptions struct {
	// ID names the manifest (manifests/<ID>.json). Required.
	ID string
	// Metadata is copied into the manifest.
	Metadata map[string]string
	// Concurrency bounds the chunks checked and uploaded at once
	// (default 4).
	Concurrency int
	// Cache, if set, also receives every chunk Pack compresses, so this
	// node can serve them to peers before (or without) the store.
	Cache *Cache
	// StaleAfter must match the GC's (default DefaultStaleAfter).
	StaleAfter time.Duration
	// Poll is how often Pack looks again at a running GC it waits for
	// (default 1s).
	Poll time.Duration
	// Refs are the held manifests the tree needs (see Manifest.Refs), and
	// EnsureRefs makes them present in the store (publishing any that is
	// missing). Pack announces them in its pending marker and calls
	// EnsureRefs after it, and again after waiting for the GC runs it
	// may have raced, as it does for its chunks: a manifest it commits
	// never refers to one a GC deleted.
	Refs       []string
	EnsureRefs func(ctx context.Context) error
	// Held makes the manifest a held one (Manifest.Held).
	Held bool
	Log  *slog.Logger

	// Test hooks.
	afterUpload func()
	skipSettle  bool // the protocol without its settle step (to show the race it closes)
}

// Stats describe one Pack.
type Stats struct {
	TotalBytes   int64 // raw bytes of the tree's files
	StoredBytes  int64 // compressed bytes this Pack wrote to the store
	NewChunks    int   // distinct chunks this Pack uploaded
	ReusedChunks int   // distinct chunks already in the store
	WaitedForGC  bool  // a concurrent GC was running; chunks were re-checked
}

// pending is the marker an in-flight Pack keeps at pending/<id>.json: the
// chunks it is about to use, so a GC that starts meanwhile keeps them.
type pending struct {
	Format int    `json:"format"`
	ID     string `json:"id"`
	Chunks []ID   `json:"chunks"`
	// Refs are the held manifests the Pack will refer to.
	Refs []string `json:"refs,omitempty"`
}

// Pack stores the tree at dir: it cuts every file into chunks, uploads the
// chunks the store lacks and writes the manifest last, so a manifest only
// ever names chunks that are present. Rerunning it after a failure (or a
// crash) uploads only what is missing.
//
// Protocol with GC (see gc.go): after the cut, before touching the store's
// chunks, Pack writes pending/<id>.json listing them and notes the GC runs
// under way (they may have missed the marker). When its uploads are done
// it waits for those runs to end and re-checks every chunk (re-uploading
// any they deleted); then it writes the manifest and removes the marker.
func Pack(ctx context.Context, dir string, store blob.Store, opts PackOptions) (*Manifest, Stats, error) {
	var st Stats
	if err := CheckManifestID(opts.ID); err != nil {
		return nil, st, err
	}
	if err := checkRefs(opts.ID, opts.Refs); err != nil {
		return nil, st, errdefs.Invalidf("pack %s: %v", opts.ID, err)
	}
	if len(opts.Refs) > 0 && opts.EnsureRefs == nil {
		return nil, st, errdefs.Invalidf("pack %s: refs without EnsureRefs", opts.ID)
	}
	if opts.Concurrency <= 0 {
		opts.Concurrency = 4
	}
	if opts.StaleAfter <= 0 {
		opts.StaleAfter = DefaultStaleAfter
	}
	if opts.Poll <= 0 {
		opts.Poll = time.Second
	}
	log := opts.Log
	if log == nil {
		log = slog.Default()
	}

	sc, err := scan(ctx, dir)
	if err != nil {
		return nil, st, err
	}

	// Announce the chunks before looking at the store's.
	pb, err := json.Marshal(pending{Format: FormatVersion, ID: opts.ID, Chunks: sc.order, Refs: opts.Refs})
	if err != nil {
		return nil, st, err
	}
	clock, err := markNow(ctx, store, pendingKey(opts.ID), pb)
	if err != nil {
		return nil, st, err
	}

	// GC runs under way may have missed the marker: note them before
	// looking at any chunk (a run that ends before this deleted only
	// before our stats, which will see it).
	runs, err := liveGCs(ctx, store, clock)
	if err != nil {
		return nil, st, err
	}
	p := &packer{store: store, sc: sc, opts: opts, stored: map[ID]int64{}, put: map[ID]bool{}}
	if err := p.ensureAll(ctx); err != nil {
		return nil, st, err
	}
	if err := p.ensureRefs(ctx); err != nil {
		return nil, st, err
	}
	if opts.afterUpload != nil {
		opts.afterUpload()
	}
	if len(runs) > 0 && !opts.skipSettle {
		if err := waitGCs(ctx, store, runs, clock, opts.Poll, log); err != nil {
			return nil, st, err
		}
		// Whatever those runs deleted of ours is missing now, and only
		// now can we tell.
		st.WaitedForGC = true
		if err := p.ensureAll(ctx); err != nil {
			return nil, st, err
		}
		if err := p.ensureRefs(ctx); err != nil {
			return nil, st, err
		}
	}
	if el := clock.elapsed(); el > opts.StaleAfter/2 {
		// GC ignores markers older than StaleAfter: committing now could
		// name chunks a GC deleted. The rerun is cheap (only checks).
		return nil, st, errdefs.Conflictf("pack %s: took %v, more than half of %v: rerun it", opts.ID, el, opts.StaleAfter)
	}

	m := &Manifest{Format: FormatVersion, ID: opts.ID, Chunking: currentChunking(),
		Created: time.Now().UTC(), Metadata: opts.Metadata, Refs: opts.Refs, Held: opts.Held, Entries: sc.entries}
	for i := range m.Entries {
		for j := range m.Entries[i].Chunks {
			r := &m.Entries[i].Chunks[j]
			r.Stored = p.stored[r.ID]
		}
	}
	if err := m.Validate(); err != nil {
		return nil, st, fmt.Errorf("pack %s: %w", opts.ID, err)
	}
	mb, err := encodeManifest(m)
	if err != nil {
		return nil, st, err
	}
	if err := putBytes(ctx, store, ManifestKey(opts.ID), mb); err != nil {
		return nil, st, err
	}
	if err := store.Delete(ctx, pendingKey(opts.ID)); err != nil {
		// Harmless: GC drops it once stale.
		log.Warn("chunk: remove pending marker", "snapshot_id", opts.ID, "err", err)
	}

	st.TotalBytes = m.TotalBytes()
	st.StoredBytes = p.storedBytes
	st.NewChunks = len(p.put)
	st.ReusedChunks = len(sc.order) - len(p.put)
	return m, st, nil
}

type packer struct {
	store blob.Store
	sc    *scanned
	opts  PackOptions

	mu          sync.Mutex
	stored      map[ID]int64 // object size of each chunk
	put         map[ID]bool  // chunks this Pack uploaded
	storedBytes int64
}

// ensureAll makes every chunk of the tree present in the store, a bounded
// number at a time.
func (p *packer) ensureAll(ctx context.Context) error {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	ids := make(chan ID)
	errc := make(chan error, p.opts.Concurrency)
	var wg sync.WaitGroup
	for range p.opts.Concurrency {
		wg.Go(func() {
			for id := range ids {
				if err := p.ensure(ctx, id); err != nil {
					errc <- err
					cancel()
					return
				}
			}
		})
	}
feed:
	for _, id := range p.sc.order {
		select {
		case ids <- id:
		case <-ctx.Done():
			break feed
		}
	}
	close(ids)
	wg.Wait()
	select {
	case err := <-errc:
		return err
	default:
		return ctx.Err()
	}
}

// ensureRefs makes the held manifests the tree refers to present.
func (p *packer) ensureRefs(ctx context.Context) error {
	if len(p.opts.Refs) == 0 {
		return nil
	}
	if err := p.opts.EnsureRefs(ctx); err != nil {
		return fmt.Errorf("pack %s: the manifests it refers to: %w", p.opts.ID, err)
	}
	return nil
}

// ensure uploads chunk id unless the store has it.
func (p *packer) ensure(ctx context.Context, id ID) error {
	info, err := p.store.Stat(ctx, id.Key())
	switch {
	case err == nil && info.Size > 0:
		p.mu.Lock()
		p.stored[id] = info.Size
		p.mu.Unlock()
		return nil
	case err != nil && !errdefs.IsNotFound(err):
		return fmt.Errorf("pack %s: stat chunk %s: %w", p.opts.ID, id, err)
	}
	raw, err := p.sc.where[id].read(id)
	if err != nil {
		return fmt.Errorf("pack %s: %w", p.opts.ID, err)
	}
	frame := compress(raw)
	if err := p.store.Put(ctx, id.Key(), bytes.NewReader(frame), int64(len(frame))); err != nil {
		return fmt.Errorf("pack %s: put chunk %s: %w", p.opts.ID, id, err)
	}
	if p.opts.Cache != nil {
		_ = p.opts.Cache.Put(id, frame) // best effort: a full cache is fine
	}
	p.mu.Lock()
	p.stored[id] = int64(len(frame))
	p.put[id] = true
	p.storedBytes += int64(len(frame))
	p.mu.Unlock()
	return nil
}

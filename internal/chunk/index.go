package chunk

import (
	"context"
	"fmt"
	"sync"
	"time"

	"github.com/spore-run/spore/internal/errdefs"
)

// IndexOptions configure Index.
type IndexOptions struct {
	// ID names the manifest. Required.
	ID       string
	Metadata map[string]string
	// Concurrency bounds the chunks compressed at once (default 4).
	Concurrency int
}

// Index cuts the tree at dir as Pack does, puts every chunk's frame in
// the node cache (the chunks it lacks), and returns the manifest Pack
// would write, touching no store. A node serves that manifest and the
// chunks to its peers before (or without) the store: they can restore a
// snapshot while its upload still runs, or while the store is down. The
// manifest names chunks only this node's cache holds until an upload
// stores them; a cache too full to take a chunk fails the Index
// (ErrResourceLimit) rather than promise what it cannot serve.
func Index(ctx context.Context, dir string, cache *Cache, opts IndexOptions) (*Manifest, error) {
	if err := CheckManifestID(opts.ID); err != nil {
		return nil, err
	}
	if cache == nil {
		return nil, errdefs.Invalidf("index %s: no cache", opts.ID)
	}
	if opts.Concurrency <= 0 {
		opts.Concurrency = 4
	}
	sc, err := scan(ctx, dir)
	if err != nil {
		return nil, err
	}
	stored := make(map[ID]int64, len(sc.order))
	var mu sync.Mutex
	var first error
	sem := make(chan struct{}, opts.Concurrency)
	var wg sync.WaitGroup
	for _, id := range sc.order {
		if frame, err := cache.Get(id); err == nil {
			stored[id] = int64(len(frame))
			continue
		}
		wg.Add(1)
		sem <- struct{}{}
		go func() {
			defer wg.Done()
			defer func() { <-sem }()
			raw, err := sc.where[id].read(id)
			var frame []byte
			if err == nil {
				frame = compress(raw)
				err = cache.Put(id, frame)
			}
			mu.Lock()
			defer mu.Unlock()
			if err != nil {
				if first == nil {
					first = fmt.Errorf("index %s: chunk %s: %w", opts.ID, id, err)
				}
				return
			}
			stored[id] = int64(len(frame))
		}()
		if err := ctx.Err(); err != nil {
			break
		}
	}
	wg.Wait()
	if first != nil {
		return nil, first
	}
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	m := &Manifest{Format: FormatVersion, ID: opts.ID, Chunking: currentChunking(),
		Created: time.Now().UTC(), Metadata: opts.Metadata, Entries: sc.entries}
	for i := range m.Entries {
		for j := range m.Entries[i].Chunks {
			r := &m.Entries[i].Chunks[j]
			r.Stored = stored[r.ID]
		}
	}
	if err := m.Validate(); err != nil {
		return nil, fmt.Errorf("index %s: %w", opts.ID, err)
	}
	return m, nil
}

// EncodeManifest is a manifest's stored (and served) form.
func EncodeManifest(m *Manifest) ([]byte, error) { return encodeManifest(m) }

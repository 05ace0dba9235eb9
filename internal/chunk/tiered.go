package chunk

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"sync"
	"sync/atomic"

	"github.com/spore-run/spore/internal/blob"
	"github.com/spore-run/spore/internal/errdefs"
)

// Source is a tier that returns chunk frames as stored. It need not verify
// them: Tiered does. A chunk it lacks is errdefs.ErrNotFound.
type Source interface {
	Frame(ctx context.Context, id ID) ([]byte, error)
}

// StoreSource reads chunks from a blob store.
type StoreSource struct{ Store blob.Store }

// Frame implements Source.
func (s StoreSource) Frame(ctx context.Context, id ID) ([]byte, error) {
	rc, err := s.Store.Get(ctx, id.Key())
	if err != nil {
		return nil, err
	}
	defer rc.Close()
	b, err := io.ReadAll(io.LimitReader(rc, maxFrame+1))
	if err != nil {
		return nil, fmt.Errorf("read chunk %s: %w", id, err)
	}
	if len(b) > maxFrame {
		return nil, fmt.Errorf("%w: chunk %s: object larger than any chunk", errdefs.ErrDataLoss, id)
	}
	return b, nil
}

// FetchStats count where chunks came from.
type FetchStats struct {
	FromCache, FromPeer, FromStore int   // chunks
	Zero                           int   // all-zero chunks, written without a fetch
	PeerBytes, StoreBytes          int64 // stored bytes transferred
	Corrupt                        int   // copies that failed their hash check
}

// fetchCounters is FetchStats, safe for concurrent workers.
type fetchCounters struct {
	fromCache, fromPeer, fromStore, zero atomic.Int64
	peerBytes, storeBytes, corrupt       atomic.Int64
}

func (c *fetchCounters) snapshot() FetchStats {
	return FetchStats{
		FromCache: int(c.fromCache.Load()), FromPeer: int(c.fromPeer.Load()), FromStore: int(c.fromStore.Load()),
		Zero: int(c.zero.Load()), PeerBytes: c.peerBytes.Load(), StoreBytes: c.storeBytes.Load(),
		Corrupt: int(c.corrupt.Load()),
	}
}

// Tiered reads chunks from the node cache, then peers, then the store (any
// may be nil), verifying each copy against the chunk's hash: a corrupt copy
// is dropped (from the cache) and the next tier tried. A chunk found past
// the cache is put in the cache.
type Tiered struct {
	Cache *Cache
	Peers Source
	Store blob.Store
	Log   *slog.Logger

	total fetchCounters
}

// Totals returns the counts since the Tiered was made.
func (t *Tiered) Totals() FetchStats { return t.total.snapshot() }

// Read returns the raw bytes of the chunk ref names, verified. A copy
// corrupt in every tier that has one is errdefs.ErrDataLoss.
func (t *Tiered) Read(ctx context.Context, ref Ref) ([]byte, error) {
	return t.read(ctx, ref, nil)
}

func (t *Tiered) read(ctx context.Context, ref Ref, c *fetchCounters) ([]byte, error) {
	count := func(f func(*fetchCounters)) {
		f(&t.total)
		if c != nil {
			f(c)
		}
	}
	log := t.Log
	if log == nil {
		log = slog.Default()
	}
	var lastErr, corruptErr error
	if t.Cache != nil {
		frame, err := t.Cache.Get(ref.ID)
		if err == nil {
			raw, err := open(ref.ID, ref.Size, frame)
			if err == nil {
				count(func(c *fetchCounters) { c.fromCache.Add(1) })
				return raw, nil
			}
			log.Warn("chunk: corrupt copy in the node cache, dropped", "chunk", ref.ID, "err", err)
			t.Cache.Drop(ref.ID)
			count(func(c *fetchCounters) { c.corrupt.Add(1) })
			corruptErr = fmt.Errorf("cache: %w", err)
		}
	}
	tiers := []struct {
		name  string
		src   Source
		got   func(c *fetchCounters, n int64)
		isset bool
	}{
		{"peers", t.Peers, func(c *fetchCounters, n int64) { c.fromPeer.Add(1); c.peerBytes.Add(n) }, t.Peers != nil},
		{"store", StoreSource{t.Store}, func(c *fetchCounters, n int64) { c.fromStore.Add(1); c.storeBytes.Add(n) }, t.Store != nil},
	}
	for _, tier := range tiers {
		if !tier.isset {
			continue
		}
		frame, err := tier.src.Frame(ctx, ref.ID)
		if err != nil {
			if ctx.Err() != nil {
				return nil, ctx.Err()
			}
			lastErr = fmt.Errorf("%s: %w", tier.name, err)
			continue
		}
		raw, err := open(ref.ID, ref.Size, frame)
		if err != nil {
			log.Warn("chunk: corrupt copy", "tier", tier.name, "chunk", ref.ID, "err", err)
			count(func(c *fetchCounters) { c.corrupt.Add(1) })
			corruptErr = fmt.Errorf("%s: %w", tier.name, err)
			continue
		}
		count(func(c *fetchCounters) { tier.got(c, int64(len(frame))) })
		if t.Cache != nil {
			if err := t.Cache.Put(ref.ID, frame); err != nil {
				log.Debug("chunk: not cached", "chunk", ref.ID, "err", err)
			}
		}
		return raw, nil
	}
	switch {
	case corruptErr != nil:
		// Corruption outranks a miss elsewhere: the data existed and is bad.
		if lastErr != nil {
			return nil, fmt.Errorf("chunk %s: no intact copy (also %v): %w", ref.ID, lastErr, corruptErr)
		}
		return nil, fmt.Errorf("chunk %s: no intact copy: %w", ref.ID, corruptErr)
	case lastErr != nil:
		return nil, fmt.Errorf("chunk %s: %w", ref.ID, lastErr)
	default:
		return nil, errdefs.NotFoundf("chunk %s: in no tier", ref.ID)
	}
}

// Pin keeps the chunks in the node cache while a restore uses them.
func (t *Tiered) Pin(ids []ID) func() {
	if t.Cache == nil {
		return func() {}
	}
	return t.Cache.Pin(ids)
}

// zeroIDs memoizes the IDs of all-zero chunks by size: zero pages are most
// of a memory image, and a restore writes them as holes without a fetch.
var zeroIDs sync.Map // int64 -> ID

var zeros = make([]byte, MaxChunk)

// zeroID is the ID of n zero bytes.
func zeroID(n int64) ID {
	v, ok := zeroIDs.Load(n)
	if !ok {
		v, _ = zeroIDs.LoadOrStore(n, Sum(zeros[:n]))
	}
	return v.(ID)
}

func isZeroChunk(ref Ref) bool {
	if ref.Size <= 0 || ref.Size > MaxChunk {
		return false
	}
	return zeroID(ref.Size) == ref.ID
}

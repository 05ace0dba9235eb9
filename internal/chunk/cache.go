package chunk

import (
	"container/list"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"sync"
	"time"

	"github.com/spore-run/spore/internal/atomicfs"
	"github.com/spore-run/spore/internal/errdefs"
)

// Cache is a node-local directory of chunk frames (as stored: zstd),
// bounded in bytes, evicting the least recently used. Chunks pinned by a
// running restore are never evicted. Files are written atomically (and not
// fsynced: a torn file after a power loss fails its hash check on read and
// is dropped), so the cache survives restarts: Open rebuilds the index
// from the directory, ordered by the files' modification times, which Get
// refreshes.
//
// Layout: <dir>/<2 hex>/<64 hex>.
type Cache struct {
	dir string
	max int64

	mu       sync.Mutex
	entries  map[ID]*centry
	lru      list.List // of *centry, most recent first
	used     int64     // bytes of entries, including ones being written
	pins     map[ID]int
	removing map[ID]bool // files being deleted: not written again meanwhile
}

type centry struct {
	id    ID
	size  int64
	ready bool // the file is complete
	elem  *list.Element
}

// OpenCache opens (creating if needed) the cache in dir, bounded by
// maxBytes.
func OpenCache(dir string, maxBytes int64) (*Cache, error) {
	if maxBytes <= 0 {
		return nil, errdefs.Invalidf("chunk cache %s: bound %d must be positive", dir, maxBytes)
	}
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, fmt.Errorf("chunk cache %s: %w", dir, err)
	}
	c := &Cache{dir: dir, max: maxBytes, entries: map[ID]*centry{}, pins: map[ID]int{}, removing: map[ID]bool{}}
	type found struct {
		id   ID
		size int64
		mod  time.Time
	}
	var all []found
	err := filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if p == dir {
			return nil
		}
		rel, _ := filepath.Rel(dir, p)
		if d.IsDir() {
			if len(rel) != 2 {
				return filepath.SkipDir // not ours
			}
			return nil
		}
		if strings.HasPrefix(d.Name(), ".") {
			// A write that a crash interrupted.
			return os.Remove(p)
		}
		id, err := ParseID(d.Name())
		if err != nil || filepath.Base(filepath.Dir(p)) != id.String()[:2] {
			return nil // not ours
		}
		fi, err := d.Info()
		if err != nil {
			return err
		}
		all = append(all, found{id, fi.Size(), fi.ModTime()})
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("chunk cache %s: index: %w", dir, err)
	}
	sort.Slice(all, func(i, j int) bool { return all[i].mod.Before(all[j].mod) })
	for _, f := range all {
		e := &centry{id: f.id, size: f.size, ready: true}
		e.elem = c.lru.PushFront(e)
		c.entries[f.id] = e
		c.used += f.size
	}
	// Over the bound (it was lowered): nothing is pinned yet, so this fits.
	victims, _ := c.evictLocked(0)
	c.removeFiles(victims)
	return c, nil
}

func (c *Cache) path(id ID) string {
	s := id.String()
	return filepath.Join(c.dir, s[:2], s)
}

// Get returns chunk id's frame as stored (unverified: Tiered checks it and
// calls Drop on a mismatch). A missing chunk is errdefs.ErrNotFound.
func (c *Cache) Get(id ID) ([]byte, error) {
	c.mu.Lock()
	e, ok := c.entries[id]
	ready := ok && e.ready // read under the lock: Put sets it
	if ready {
		c.lru.MoveToFront(e.elem)
	}
	c.mu.Unlock()
	if !ready {
		return nil, errdefs.NotFoundf("chunk %s not in cache", id)
	}
	p := c.path(id)
	b, err := os.ReadFile(p)
	if errors.Is(err, fs.ErrNotExist) {
		c.Drop(id)
		return nil, errdefs.NotFoundf("chunk %s not in cache", id)
	}
	if err != nil {
		return nil, fmt.Errorf("chunk cache: %w", err)
	}
	// Recency survives a restart through the file's time.
	now := time.Now()
	_ = os.Chtimes(p, now, now)
	return b, nil
}

// Has reports whether chunk id is cached.
func (c *Cache) Has(id ID) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	e, ok := c.entries[id]
	return ok && e.ready
}

// Put stores a frame (the caller has verified it). When the bound cannot be
// met without evicting pinned chunks it stores nothing and returns
// errdefs.ErrResourceLimit.
func (c *Cache) Put(id ID, frame []byte) error {
	size := int64(len(frame))
	c.mu.Lock()
	if e, ok := c.entries[id]; ok {
		if e.ready {
			c.lru.MoveToFront(e.elem)
		}
		c.mu.Unlock()
		return nil
	}
	if c.removing[id] {
		c.mu.Unlock()
		return nil // being deleted right now; the next reader refills it
	}
	victims, ok := c.evictLocked(size)
	if !ok {
		c.mu.Unlock()
		return fmt.Errorf("%w: chunk cache: %d bytes do not fit in %d (pinned: the rest)", errdefs.ErrResourceLimit, size, c.max)
	}
	e := &centry{id: id, size: size}
	e.elem = c.lru.PushFront(e)
	c.entries[id] = e
	c.used += size
	c.mu.Unlock()

	c.removeFiles(victims)
	p := c.path(id)
	err := os.MkdirAll(filepath.Dir(p), 0o700)
	if err == nil {
		err = atomicfs.WriteFileNoSync(p, frame, 0o600)
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if err != nil {
		c.forgetLocked(e)
		return fmt.Errorf("chunk cache: %w", err)
	}
	e.ready = true
	return nil
}

// evictLocked takes least recently used, unpinned, complete entries out of
// the index until size more bytes fit and returns them; the caller deletes
// their files after unlocking. If they cannot fit, it evicts nothing and
// reports false.
func (c *Cache) evictLocked(size int64) ([]ID, bool) {
	if c.used+size <= c.max {
		return nil, true
	}
	var evictable int64
	for el := c.lru.Front(); el != nil; el = el.Next() {
		if e := el.Value.(*centry); e.ready && c.pins[e.id] == 0 {
			evictable += e.size
		}
	}
	if c.used-evictable+size > c.max {
		return nil, false
	}
	var victims []ID
	for el := c.lru.Back(); el != nil && c.used+size > c.max; {
		e := el.Value.(*centry)
		el = el.Prev()
		if !e.ready || c.pins[e.id] > 0 {
			continue
		}
		c.forgetLocked(e)
		c.removing[e.id] = true
		victims = append(victims, e.id)
	}
	return victims, true
}

func (c *Cache) forgetLocked(e *centry) {
	if cur, ok := c.entries[e.id]; !ok || cur != e {
		return
	}
	c.lru.Remove(e.elem)
	delete(c.entries, e.id)
	c.used -= e.size
}

func (c *Cache) removeFiles(ids []ID) {
	for _, id := range ids {
		_ = os.Remove(c.path(id))
	}
	if len(ids) == 0 {
		return
	}
	c.mu.Lock()
	for _, id := range ids {
		delete(c.removing, id)
	}
	c.mu.Unlock()
}

// Drop removes chunk id (a corrupt one), pinned or not.
func (c *Cache) Drop(id ID) {
	c.mu.Lock()
	e, ok := c.entries[id]
	if !ok || !e.ready {
		c.mu.Unlock()
		return
	}
	c.forgetLocked(e)
	c.removing[id] = true
	c.mu.Unlock()
	c.removeFiles([]ID{id})
}

// Pin keeps the chunks (present now or cached later) from eviction until
// the returned function is called. Pins nest.
func (c *Cache) Pin(ids []ID) (unpin func()) {
	c.mu.Lock()
	for _, id := range ids {
		c.pins[id]++
	}
	c.mu.Unlock()
	var once sync.Once
	return func() {
		once.Do(func() {
			c.mu.Lock()
			defer c.mu.Unlock()
			for _, id := range ids {
				if c.pins[id]--; c.pins[id] <= 0 {
					delete(c.pins, id)
				}
			}
		})
	}
}

// CacheUsage describes the cache.
type CacheUsage struct {
	Bytes, MaxBytes int64
	Chunks, Pinned  int
}

// Usage returns the cache's current size.
func (c *Cache) Usage() CacheUsage {
	c.mu.Lock()
	defer c.mu.Unlock()
	return CacheUsage{Bytes: c.used, MaxBytes: c.max, Chunks: len(c.entries), Pinned: len(c.pins)}
}

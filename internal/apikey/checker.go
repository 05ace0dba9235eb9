// Package apikey holds Spore's API keys: how they are made, shown,
// revoked and checked. Only a key's SHA-256 is stored; the key itself is
// shown once, when it is made.
package apikey

import (
	"context"
	"crypto/subtle"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"golang.org/x/sync/singleflight"

	"github.com/spore-run/spore/internal/errdefs"
	"github.com/spore-run/spore/internal/store"
)

// Checker checks API keys against an in-memory copy of the store's valid
// keys, kept current through the store's key version (one small read,
// store.APIKeys.APIKeysVersion):
//
//   - A request reads the version when the copy was last confirmed more
//     than KeysFresh ago, and reloads the keys only when it moved. So a
//     key revoked on any replica stops working on every replica within
//     KeysFresh of its revocation (plus one store round trip).
//   - A key the copy does not have is refused without a store read,
//     except that the version is read again, at most every KeysMissCheck,
//     so a key added on another replica works here at once or within
//     that interval. A flood of bad keys costs at most a few version
//     reads a second, however many keys it tries: no round trip each.
//   - When the store cannot be read, the copy confirmed within KeysStale
//     is used (a database hiccup is not an outage); past that the answer
//     is an error (503), never a 401: the key may well be valid.
type Checker struct {
	st  store.APIKeys
	now func() time.Time
	log *slog.Logger

	mu      sync.Mutex
	byHash  map[string]store.APIKey // every key, revoked ones too
	version int64
	loaded  bool
	checked time.Time // the copy was last confirmed current then
	// touched is when this replica last recorded each key's use.
	touched map[string]time.Time

	sf singleflight.Group
}

// Key freshness (see Checker).
const (
	KeysFresh     = 500 * time.Millisecond
	KeysMissCheck = 100 * time.Millisecond
	KeysStale     = 10 * time.Second
	// TouchEvery is how often a key's last use is written: its
	// LastUsedAt is right to within it.
	TouchEvery = time.Minute
)

// NewChecker returns a checker over st.
func NewChecker(st store.APIKeys) *Checker {
	return &Checker{st: st, now: time.Now, log: slog.New(slog.DiscardHandler), byHash: map[string]store.APIKey{}, touched: map[string]time.Time{}}
}

// WithLogger sets the logger that reports store failures.
func (k *Checker) WithLogger(l *slog.Logger) *Checker {
	k.log = l
	return k
}

// Lookup returns the valid key whose hash is key's: ErrNotFound for a key
// that is unknown, revoked or expired, ErrUnavailable when the store
// cannot say. It records the key's use (at most every TouchEvery, in the
// background).
func (k *Checker) Lookup(ctx context.Context, key string) (store.APIKey, error) {
	hash := Hash(key)
	if err := k.sync(ctx, KeysFresh); err != nil {
		return store.APIKey{}, err
	}
	rec, ok := k.get(hash)
	if !ok {
		// Perhaps added on another replica a moment ago.
		if err := k.sync(ctx, KeysMissCheck); err != nil {
			return store.APIKey{}, err
		}
		rec, ok = k.get(hash)
	}
	if !ok || rec.Revoked() || subtle.ConstantTimeCompare([]byte(rec.Hash), []byte(hash)) != 1 {
		return store.APIKey{}, errdefs.NotFoundf("invalid API key")
	}
	if rec.Expired(k.now()) {
		return store.APIKey{}, errdefs.NotFoundf("API key %s expired at %s", rec.ID, rec.ExpiresAt.Format(time.RFC3339))
	}
	k.touch(rec)
	return rec, nil
}

// touch writes the key's use when the stored one is older than
// TouchEvery: one small write a minute per key and replica, off the
// request's path.
func (k *Checker) touch(rec store.APIKey) {
	now := k.now()
	k.mu.Lock()
	last := rec.LastUsedAt
	if t := k.touched[rec.ID]; t.After(last) {
		last = t
	}
	due := now.Sub(last) >= TouchEvery
	if due {
		k.touched[rec.ID] = now
	}
	k.mu.Unlock()
	if !due {
		return
	}
	go func() {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		if err := k.st.TouchAPIKey(ctx, rec.ID, now.UTC().Truncate(time.Millisecond)); err != nil && !errdefs.IsNotFound(err) {
			k.log.Warn("api keys: record a key's use", "key_id", rec.ID, "err", err)
		}
	}()
}

// Valid reports whether key is one of the store's valid API keys; an
// error (never a false "no") when the store could not say.
func (k *Checker) Valid(ctx context.Context, key string) (bool, error) {
	_, err := k.Lookup(ctx, key)
	if errdefs.IsNotFound(err) {
		return false, nil
	}
	return err == nil, err
}

// Check tells the proxy which Authorization values carry an API key, to
// keep them out of sandboxes: a valid key, and a revoked one too (it was
// a key). When the store cannot answer it says yes: a credential held
// back is harmless, a key let through is not.
func (k *Checker) Check(ctx context.Context, key string) bool {
	if _, err := k.Lookup(ctx, key); !errdefs.IsNotFound(err) {
		return true
	}
	_, known := k.get(Hash(key))
	return known
}

// Forget drops the copy, so the next check reads the store (after this
// replica changed the keys itself, its own next request sees the change).
func (k *Checker) Forget() {
	k.mu.Lock()
	k.loaded = false
	k.mu.Unlock()
}

func (k *Checker) get(hash string) (store.APIKey, bool) {
	k.mu.Lock()
	defer k.mu.Unlock()
	rec, ok := k.byHash[hash]
	return rec, ok
}

// sync makes sure the copy was confirmed within maxAge: it reads the
// version (one caller at a time; the others wait for its answer) and
// reloads the keys when the version moved.
func (k *Checker) sync(ctx context.Context, maxAge time.Duration) error {
	k.mu.Lock()
	loaded, age := k.loaded, k.now().Sub(k.checked)
	k.mu.Unlock()
	if loaded && age < maxAge {
		return nil
	}
	ch := k.sf.DoChan("sync", func() (any, error) {
		// Not the caller's context: the others waiting share the read.
		rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
		defer cancel()
		return nil, k.reload(rctx)
	})
	var err error
	select {
	case r := <-ch:
		err = r.Err
	case <-ctx.Done():
		return fmt.Errorf("%w: API keys: %w", errdefs.ErrUnavailable, ctx.Err())
	}
	if err == nil {
		return nil
	}
	k.mu.Lock()
	loaded, age = k.loaded, k.now().Sub(k.checked)
	k.mu.Unlock()
	if loaded && age < KeysStale {
		k.log.Warn("api keys: the store could not be read; using the keys confirmed before", "age", age, "err", err)
		return nil
	}
	return fmt.Errorf("%w: API keys: %w", errdefs.ErrUnavailable, err)
}

func (k *Checker) reload(ctx context.Context) error {
	start := k.now()
	v, err := k.st.APIKeysVersion(ctx)
	if err != nil {
		return err
	}
	k.mu.Lock()
	current := k.loaded && v == k.version
	k.mu.Unlock()
	if !current {
		list, err := k.st.ListAPIKeys(ctx, true)
		if err != nil {
			return err
		}
		m := make(map[string]store.APIKey, len(list))
		for _, rec := range list {
			m[rec.Hash] = rec
		}
		k.mu.Lock()
		k.byHash, k.version, k.loaded = m, v, true
		k.mu.Unlock()
	}
	k.mu.Lock()
	if k.loaded && start.After(k.checked) {
		k.checked = start
	}
	k.mu.Unlock()
	return nil
}

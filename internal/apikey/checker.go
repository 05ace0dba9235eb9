package api

import (
	"context"
	"crypto/subtle"
	"sync"
	"time"

	"github.com/spore-run/spore/internal/errdefs"
	"github.com/spore-run/spore/internal/store"
)

// Keys checks API keys against the store and remembers, for KeyTTL, the
// ones it found: every API call and proxied request with a credential
// checks one, and on PostgreSQL each check would otherwise be a round
// trip. Keys the store does not have are not remembered (a key added on
// another replica works at once), and the memory is bounded.
type Keys struct {
	st  store.APIKeys
	now func() time.Time
	mu  sync.Mutex
	ok  map[string]time.Time // key hash → when it must be read again
}

// KeyTTL is how long a found key is trusted without reading the store.
const KeyTTL = 30 * time.Second

// maxKnownKeys bounds the remembered keys; past it the memory starts over.
const maxKnownKeys = 4096

// NewKeys returns a checker over st.
func NewKeys(st store.APIKeys) *Keys {
	return &Keys{st: st, now: time.Now, ok: map[string]time.Time{}}
}

// Valid reports whether key is one of the store's API keys; an error
// (other than "no such key") when the store could not say.
func (k *Keys) Valid(ctx context.Context, key string) (bool, error) {
	hash := HashKey(key)
	now := k.now()
	k.mu.Lock()
	until, known := k.ok[hash]
	k.mu.Unlock()
	if known && now.Before(until) {
		return true, nil
	}
	rec, err := k.st.APIKeyByHash(ctx, hash)
	if err != nil {
		if errdefs.IsNotFound(err) {
			return false, nil
		}
		return false, err
	}
	if subtle.ConstantTimeCompare([]byte(rec.Hash), []byte(hash)) != 1 {
		return false, nil
	}
	k.mu.Lock()
	if len(k.ok) >= maxKnownKeys {
		k.ok = map[string]time.Time{}
	}
	k.ok[hash] = now.Add(KeyTTL)
	k.mu.Unlock()
	return true, nil
}

// Check tells the proxy which Authorization values carry an API key, to
// keep them out of sandboxes. When the store cannot answer it says yes: a
// credential held back is harmless, a key let through is not.
func (k *Keys) Check(ctx context.Context, key string) bool {
	ok, err := k.Valid(ctx, key)
	return ok || err != nil
}

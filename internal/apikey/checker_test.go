package api

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/spore-run/spore/internal/errdefs"
	"github.com/spore-run/spore/internal/store"
)

// memKeys is a store's API keys in memory, counting reads; err fails them.
type memKeys struct {
	mu    sync.Mutex
	keys  map[string]store.APIKey
	reads int
	err   error
}

func (m *memKeys) AddAPIKey(_ context.Context, k store.APIKey) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.keys[k.Hash] = k
	return nil
}

func (m *memKeys) APIKeyByHash(_ context.Context, hash string) (store.APIKey, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.reads++
	if m.err != nil {
		return store.APIKey{}, m.err
	}
	k, ok := m.keys[hash]
	if !ok {
		return store.APIKey{}, fmt.Errorf("key: %w", errdefs.ErrNotFound)
	}
	return k, nil
}

func (m *memKeys) CountAPIKeys(context.Context) (int, error) { return len(m.keys), nil }

func (m *memKeys) takeReads() int {
	m.mu.Lock()
	defer m.mu.Unlock()
	n := m.reads
	m.reads = 0
	return n
}

// A key found is trusted for KeyTTL without a store read, then read
// again; a key not found is never remembered (one added meanwhile works at
// once); a store that cannot answer is an error for Valid and a "yes" for
// the proxy's Check.
func TestKeysRemembersOnlyFoundKeys(t *testing.T) {
	ctx := context.Background()
	st := &memKeys{keys: map[string]store.APIKey{}}
	k := NewKeys(st)
	now := time.Date(2030, 1, 1, 0, 0, 0, 0, time.UTC)
	k.now = func() time.Time { return now }

	if ok, err := k.Valid(ctx, "spore_new"); ok || err != nil {
		t.Fatalf("unknown key: %v %v", ok, err)
	}
	st.AddAPIKey(ctx, store.APIKey{ID: "k1", Hash: HashKey("spore_new")})
	for range 3 {
		if ok, err := k.Valid(ctx, "spore_new"); !ok || err != nil {
			t.Fatalf("added key: %v %v", ok, err)
		}
	}
	if n := st.takeReads(); n != 2 {
		t.Fatalf("%d store reads for a miss and three checks of one key, want 2", n)
	}
	now = now.Add(KeyTTL + time.Second)
	if ok, _ := k.Valid(ctx, "spore_new"); !ok || st.takeReads() != 1 {
		t.Fatal("a key past KeyTTL is not read again")
	}
	st.err = errors.New("database down")
	now = now.Add(KeyTTL + time.Second)
	if ok, err := k.Valid(ctx, "spore_new"); ok || err == nil {
		t.Fatalf("store down: %v %v, want an error", ok, err)
	}
	if !k.Check(ctx, "anything") {
		t.Fatal("Check lets a credential through when the store cannot say")
	}
	st.err = nil
	if k.Check(ctx, "not-a-key") {
		t.Fatal("Check holds back a non-key")
	}
}

package apikey

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/spore-run/spore/internal/errdefs"
	"github.com/spore-run/spore/internal/store"
)

// memKeys is a store's API keys in memory, counting reads; err fails them.
type memKeys struct {
	mu      sync.Mutex
	keys    []store.APIKey
	version int64
	reads   map[string]int
	err     error
}

func newMem() *memKeys { return &memKeys{reads: map[string]int{}} }

func (m *memKeys) read(name string) error {
	m.reads[name]++
	return m.err
}

func (m *memKeys) AddAPIKey(_ context.Context, k store.APIKey) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	for _, o := range m.keys {
		if o.Hash == k.Hash || o.ID == k.ID {
			return errdefs.ErrAlreadyExists
		}
	}
	m.keys = append(m.keys, k)
	m.version++
	return nil
}

func (m *memKeys) APIKeyByHash(_ context.Context, hash string) (store.APIKey, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if err := m.read("APIKeyByHash"); err != nil {
		return store.APIKey{}, err
	}
	for _, k := range m.keys {
		if k.Hash == hash {
			return k, nil
		}
	}
	return store.APIKey{}, fmt.Errorf("key: %w", errdefs.ErrNotFound)
}

func (m *memKeys) CountAPIKeys(context.Context) (int, error) { return len(m.keys), nil }

func (m *memKeys) ListAPIKeys(_ context.Context, revoked bool) ([]store.APIKey, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if err := m.read("ListAPIKeys"); err != nil {
		return nil, err
	}
	return slices.DeleteFunc(slices.Clone(m.keys), func(k store.APIKey) bool { return !revoked && k.Revoked() }), nil
}

func (m *memKeys) RevokeAPIKey(_ context.Context, id string, at time.Time) (store.APIKey, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	for i, k := range m.keys {
		if k.ID == id {
			if !k.Revoked() {
				m.keys[i].RevokedAt = at
				m.version++
			}
			return m.keys[i], nil
		}
	}
	return store.APIKey{}, errdefs.ErrNotFound
}

func (m *memKeys) TouchAPIKey(_ context.Context, id string, at time.Time) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.reads["TouchAPIKey"]++
	for i, k := range m.keys {
		if k.ID == id {
			if at.After(k.LastUsedAt) {
				m.keys[i].LastUsedAt = at
			}
			return nil
		}
	}
	return errdefs.ErrNotFound
}

// GetTeam knows the default team and "t-other".
func (m *memKeys) GetTeam(_ context.Context, ref string) (store.Team, error) {
	if ref == store.DefaultTeam || ref == "t-other" {
		return store.Team{ID: ref, Name: ref}, nil
	}
	return store.Team{}, errdefs.NotFoundf("team %s not found", ref)
}

func (m *memKeys) APIKeysVersion(context.Context) (int64, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if err := m.read("APIKeysVersion"); err != nil {
		return 0, err
	}
	return m.version, nil
}

// take returns the reads since the last take.
func (m *memKeys) take() map[string]int {
	m.mu.Lock()
	defer m.mu.Unlock()
	r := m.reads
	m.reads = map[string]int{}
	return r
}

func (m *memKeys) fail(err error) {
	m.mu.Lock()
	m.err = err
	m.mu.Unlock()
}

type clock struct{ t time.Time }

func (c *clock) now() time.Time       { return c.t }
func (c *clock) step(d time.Duration) { c.t = c.t.Add(d) }
func checker(st *memKeys) (*Checker, *clock) {
	c := &clock{t: time.Date(2030, 1, 1, 0, 0, 0, 0, time.UTC)}
	k := NewChecker(st)
	k.now = c.now
	return k, c
}

func add(t *testing.T, st *memKeys, key, role string) store.APIKey {
	t.Helper()
	rec := store.APIKey{ID: "k" + key[len(key)-4:], Hash: Hash(key), Role: role, CreatedAt: time.Now()}
	if err := st.AddAPIKey(context.Background(), rec); err != nil {
		t.Fatal(err)
	}
	return rec
}

// A valid key is checked from memory: the keys are loaded once, the
// version read again only after KeysFresh, the keys again only when the
// version moved.
func TestCheckerKeepsTheKeysInMemory(t *testing.T) {
	ctx := context.Background()
	st := newMem()
	add(t, st, "spore_aaaa", store.RoleOperator)
	k, clk := checker(st)
	for range 100 {
		rec, err := k.Lookup(ctx, "spore_aaaa")
		if err != nil || rec.Role != store.RoleOperator {
			t.Fatalf("lookup = %+v %v", rec, err)
		}
		clk.step(time.Millisecond)
	}
	if r := st.take(); r["APIKeysVersion"] != 1 || r["ListAPIKeys"] != 1 || r["APIKeyByHash"] != 0 {
		t.Fatalf("100 checks within KeysFresh read %v, want one version and one list", r)
	}
	clk.step(KeysFresh)
	k.Lookup(ctx, "spore_aaaa")
	if r := st.take(); r["APIKeysVersion"] != 1 || r["ListAPIKeys"] != 0 {
		t.Fatalf("a check past KeysFresh, nothing changed, read %v: want the version only", r)
	}
}

// A revoked key stops working at the first check after KeysFresh, on a
// checker that did not revoke it (another replica's).
func TestRevocationSeenWithinKeysFresh(t *testing.T) {
	ctx := context.Background()
	st := newMem()
	rec := add(t, st, "spore_bbbb", store.RoleMember)
	k, clk := checker(st)
	if ok, err := k.Valid(ctx, "spore_bbbb"); !ok || err != nil {
		t.Fatalf("valid = %v %v", ok, err)
	}
	if _, err := st.RevokeAPIKey(ctx, rec.ID, time.Now()); err != nil {
		t.Fatal(err)
	}
	clk.step(KeysFresh)
	if ok, err := k.Valid(ctx, "spore_bbbb"); ok || err != nil {
		t.Fatalf("revoked key %v after KeysFresh: valid = %v %v", KeysFresh, ok, err)
	}
	if _, err := k.Lookup(ctx, "spore_bbbb"); !errdefs.IsNotFound(err) {
		t.Fatalf("lookup of a revoked key = %v, want not found", err)
	}
	if !k.Check(ctx, "spore_bbbb") {
		t.Fatal("the proxy's check lets a revoked key into a sandbox")
	}
}

// A flood of distinct bad keys costs no store read each: at most one
// version read per KeysMissCheck.
func TestBadKeyFloodCostsNoReadEach(t *testing.T) {
	ctx := context.Background()
	st := newMem()
	add(t, st, "spore_cccc", store.RoleMember)
	k, clk := checker(st)
	const n = 10000
	for i := range n {
		if ok, err := k.Valid(ctx, fmt.Sprintf("spore_bad%08d", i)); ok || err != nil {
			t.Fatalf("bad key %d: %v %v", i, ok, err)
		}
		clk.step(100 * time.Microsecond) // 10,000 keys a second
	}
	r := st.take()
	t.Logf("%d bad keys in 1 s: store reads %v", n, r)
	if max := int(time.Second/KeysMissCheck) + 1; r["APIKeysVersion"] > max || r["ListAPIKeys"] > 1 || r["APIKeyByHash"] > 0 {
		t.Fatalf("%d bad keys in 1 s read %v: want at most %d version reads and one list", n, r, max)
	}
}

// A key added on another replica works at the next check once
// KeysMissCheck has passed since the last look, without waiting for
// KeysFresh.
func TestNewKeyWorksAtTheMissCheck(t *testing.T) {
	ctx := context.Background()
	st := newMem()
	k, clk := checker(st)
	if ok, _ := k.Valid(ctx, "spore_dddd"); ok {
		t.Fatal("an unknown key is valid")
	}
	add(t, st, "spore_dddd", store.RoleMember)
	clk.step(KeysMissCheck)
	if ok, err := k.Valid(ctx, "spore_dddd"); !ok || err != nil {
		t.Fatalf("a key added elsewhere, after KeysMissCheck: %v %v", ok, err)
	}
}

// A store that cannot be read: the copy confirmed within KeysStale is
// used; past that the answer is ErrUnavailable (a 503, never a 401), and
// the proxy's check holds every credential back.
func TestStoreDown(t *testing.T) {
	ctx := context.Background()
	st := newMem()
	add(t, st, "spore_eeee", store.RoleMember)
	k, clk := checker(st)
	k.WithLogger(slog.New(slog.DiscardHandler))
	if ok, _ := k.Valid(ctx, "spore_eeee"); !ok {
		t.Fatal("valid key refused")
	}
	st.fail(errors.New("database down"))
	clk.step(KeysFresh)
	if ok, err := k.Valid(ctx, "spore_eeee"); !ok || err != nil {
		t.Fatalf("store down %v after the last look: %v %v, want the copy used", KeysFresh, ok, err)
	}
	clk.step(KeysStale)
	if ok, err := k.Valid(ctx, "spore_eeee"); ok || !errdefs.IsUnavailable(err) {
		t.Fatalf("store down past KeysStale: %v %v, want unavailable", ok, err)
	}
	if !k.Check(ctx, "anything") {
		t.Fatal("Check lets a credential through when the store cannot say")
	}
	st.fail(nil)
	if k.Check(ctx, "not-a-key") {
		t.Fatal("Check holds back a non-key")
	}
}

// A fresh checker over an unreachable store knows nothing: unavailable.
func TestStoreDownAtStart(t *testing.T) {
	st := newMem()
	st.fail(errors.New("database down"))
	k, _ := checker(st)
	if _, err := k.Lookup(context.Background(), "spore_ffff"); !errdefs.IsUnavailable(err) {
		t.Fatalf("lookup = %v, want unavailable", err)
	}
}

// Concurrent checks share one store read.
func TestConcurrentChecksShareOneRead(t *testing.T) {
	st := newMem()
	add(t, st, "spore_gggg", store.RoleMember)
	k, _ := checker(st)
	var wg sync.WaitGroup
	for range 50 {
		wg.Go(func() {
			if ok, err := k.Valid(context.Background(), "spore_gggg"); !ok || err != nil {
				t.Errorf("valid = %v %v", ok, err)
			}
		})
	}
	wg.Wait()
	if r := st.take(); r["ListAPIKeys"] > 2 {
		t.Fatalf("50 concurrent first checks read %v", r)
	}
}

// An expired key is refused like an unknown one; a used key's last use
// is written once per TouchEvery, not per request.
func TestCheckerExpiryAndLastUse(t *testing.T) {
	ctx := context.Background()
	st := newMem()
	k, clk := checker(st)
	rec := store.APIKey{ID: "kexp1", Hash: Hash("spore_expiring"), Role: store.RoleMember, TeamID: store.DefaultTeam,
		CreatedAt: clk.now(), ExpiresAt: clk.now().Add(time.Hour)}
	if err := st.AddAPIKey(ctx, rec); err != nil {
		t.Fatal(err)
	}
	touches := func() int {
		st.mu.Lock()
		defer st.mu.Unlock()
		return st.reads["TouchAPIKey"]
	}
	waitTouches := func(want int) {
		t.Helper()
		deadline := time.Now().Add(5 * time.Second)
		for touches() != want {
			if time.Now().After(deadline) {
				t.Fatalf("last-use writes = %d, want %d", touches(), want)
			}
			time.Sleep(time.Millisecond)
		}
	}
	for range 5 {
		if _, err := k.Lookup(ctx, "spore_expiring"); err != nil {
			t.Fatal(err)
		}
	}
	waitTouches(1)
	clk.step(TouchEvery)
	if _, err := k.Lookup(ctx, "spore_expiring"); err != nil {
		t.Fatal(err)
	}
	waitTouches(2)
	st.mu.Lock()
	used := st.keys[0].LastUsedAt
	st.mu.Unlock()
	if !used.Equal(clk.now().UTC().Truncate(time.Millisecond)) {
		t.Fatalf("last used %v, want %v", used, clk.now())
	}
	clk.step(time.Hour)
	if _, err := k.Lookup(ctx, "spore_expiring"); !errdefs.IsNotFound(err) {
		t.Fatalf("an expired key = %v, want refused", err)
	}
	if !k.Check(ctx, "spore_expiring") {
		t.Fatal("an expired key is no longer recognized as a key: the proxy would let it into a sandbox")
	}
}

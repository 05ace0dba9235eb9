package apikey

import (
	"context"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/spore-run/spore/internal/errdefs"
	"github.com/spore-run/spore/internal/store"
)

var quiet = slog.New(slog.DiscardHandler)

// Rotating the configured key revokes the previous one; a replica still
// starting with the older key revokes nothing newer; a revoked configured
// key stays revoked.
func TestConfiguredKeyRotation(t *testing.T) {
	ctx := context.Background()
	st := newMem()
	k, _ := checker(st)
	old, next := "spore_configured_old_0001", "spore_configured_new_0002"
	if err := EnsureConfigured(ctx, st, old, quiet); err != nil {
		t.Fatal(err)
	}
	if err := EnsureConfigured(ctx, st, old, quiet); err != nil { // a restart
		t.Fatal(err)
	}
	_, user, err := Create(ctx, st, nil, "ci", store.RoleUser, store.SourceAPI)
	if err != nil {
		t.Fatal(err)
	}
	time.Sleep(2 * time.Millisecond) // created_at is kept to the millisecond
	if err := EnsureConfigured(ctx, st, next, quiet); err != nil {
		t.Fatal(err)
	}
	if err := EnsureConfigured(ctx, st, old, quiet); err != nil { // an old replica restarting mid-rollout
		t.Fatal(err)
	}
	k.Forget()
	if ok, _ := k.Valid(ctx, old); ok {
		t.Fatal("the previous configured key is still valid after rotation")
	}
	if ok, _ := k.Valid(ctx, next); !ok {
		t.Fatal("the new configured key is not valid (an old replica revoked it?)")
	}
	rec, _ := st.APIKeyByHash(ctx, Hash(next))
	if rec.Role != store.RoleAdmin || rec.Source != store.SourceConfig {
		t.Fatalf("configured key = %+v", rec)
	}
	if got, _ := st.APIKeyByHash(ctx, user.Hash); got.Revoked() {
		t.Fatal("rotating the configured key revoked a key made through the API")
	}
	if err := EnsureConfigured(ctx, st, "short", quiet); !errdefs.IsInvalidArgument(err) {
		t.Fatalf("a short configured key = %v", err)
	}
}

func TestCreate(t *testing.T) {
	ctx := context.Background()
	st := newMem()
	key, rec, err := Create(ctx, st, nil, "my agent", "", store.SourceAPI)
	if err != nil {
		t.Fatal(err)
	}
	if !strings.HasPrefix(key, Prefix) || len(key) != len(Prefix)+40 || rec.Hash != Hash(key) || rec.Role != store.RoleUser {
		t.Fatalf("key %q rec %+v", key, rec)
	}
	if rec.Mask != key[:10]+"…"+key[len(key)-4:] || strings.Contains(rec.Mask, key[10:len(key)-4]) {
		t.Fatalf("mask %q shows too much of %q", rec.Mask, key)
	}
	for _, c := range []struct{ name, role string }{{"x", "root"}, {strings.Repeat("n", MaxNameLen+1), ""}, {"bad\x00name", ""}} {
		before := len(st.keys)
		if _, _, err := Create(ctx, st, nil, c.name, c.role, store.SourceAPI); !errdefs.IsInvalidArgument(err) || len(st.keys) != before {
			t.Errorf("create %q %q = %v (keys %d → %d)", c.name, c.role, err, before, len(st.keys))
		}
	}
	if _, err := Revoke(ctx, st, nil, "../x"); !errdefs.IsInvalidArgument(err) {
		t.Fatalf("revoke a malformed ID = %v", err)
	}
}

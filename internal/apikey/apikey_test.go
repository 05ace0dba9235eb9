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
	_, user, err := Create(ctx, st, nil, Spec{Name: "ci", TeamID: store.DefaultTeam, Source: store.SourceAPI})
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
	if rec.Role != store.RoleOperator || rec.TeamID != "" || rec.Source != store.SourceConfig {
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
	key, rec, err := Create(ctx, st, nil, Spec{Name: "my agent", TeamID: store.DefaultTeam, Source: store.SourceAPI})
	if err != nil {
		t.Fatal(err)
	}
	if !strings.HasPrefix(key, Prefix) || len(key) != len(Prefix)+40 || rec.Hash != Hash(key) || rec.Role != store.RoleMember || rec.TeamID != store.DefaultTeam {
		t.Fatalf("key %q rec %+v", key, rec)
	}
	if rec.Mask != key[:10]+"…"+key[len(key)-4:] || strings.Contains(rec.Mask, key[10:len(key)-4]) {
		t.Fatalf("mask %q shows too much of %q", rec.Mask, key)
	}
	past := time.Now().Add(-time.Second)
	for _, c := range []Spec{
		{Name: "x", Role: "root", TeamID: store.DefaultTeam},
		{Name: strings.Repeat("n", MaxNameLen+1), TeamID: store.DefaultTeam},
		{Name: "bad\x00name", TeamID: store.DefaultTeam},
		{Name: "teamless member", Role: store.RoleMember},
		{Name: "operator of a team", Role: store.RoleOperator, TeamID: store.DefaultTeam},
		{Name: "scoped operator", Role: store.RoleOperator, Scope: &store.KeyScope{}},
		{Name: "expired", TeamID: store.DefaultTeam, ExpiresAt: past},
	} {
		before := len(st.keys)
		if _, _, err := Create(ctx, st, nil, c); !errdefs.IsInvalidArgument(err) || len(st.keys) != before {
			t.Errorf("create %+v = %v (keys %d → %d)", c, err, before, len(st.keys))
		}
	}
	if _, _, err := Create(ctx, st, nil, Spec{Name: "x", TeamID: "t-nowhere"}); !errdefs.IsNotFound(err) {
		t.Errorf("a key of a team that does not exist = %v", err)
	}
	if _, err := Revoke(ctx, st, nil, "../x"); !errdefs.IsInvalidArgument(err) {
		t.Fatalf("revoke a malformed ID = %v", err)
	}
}

// A scope names known operations and well-formed template patterns.
func TestValidateScope(t *testing.T) {
	ops := []string{"sandboxes.create", "sandboxes.read"}
	if err := ValidateScope(&store.KeyScope{Operations: ops, Templates: []string{"ci-*", "base"}}, ops); err != nil {
		t.Fatal(err)
	}
	for _, sc := range []store.KeyScope{
		{Operations: []string{"sandboxes.destroy"}},
		{Templates: []string{"ci-["}},
		{Templates: []string{""}},
	} {
		if err := ValidateScope(&sc, ops); !errdefs.IsInvalidArgument(err) {
			t.Errorf("scope %+v = %v, want invalid", sc, err)
		}
	}
}

// The last valid operator key is not revoked; a team's keys are, even
// its last admin's (an operator makes it another).
func TestRevokeKeepsTheLastOperatorKey(t *testing.T) {
	ctx := context.Background()
	st := newMem()
	_, op, err := Create(ctx, st, nil, Spec{Name: "op"})
	if err != nil || op.Role != store.RoleOperator {
		t.Fatalf("operator key %+v, %v", op, err)
	}
	_, adm, err := Create(ctx, st, nil, Spec{Name: "admin", TeamID: "t-other", Role: store.RoleAdmin})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := Revoke(ctx, st, nil, op.ID); !errdefs.IsConflict(err) {
		t.Fatalf("revoke the last operator key = %v, want conflict", err)
	}
	if _, err := Revoke(ctx, st, nil, adm.ID); err != nil {
		t.Fatalf("revoke a team's last admin key = %v", err)
	}
	if _, op2, err := Create(ctx, st, nil, Spec{Name: "op2"}); err != nil {
		t.Fatal(err)
	} else if _, err := Revoke(ctx, st, nil, op.ID); err != nil {
		t.Fatalf("revoke an operator key with another left (%s) = %v", op2.ID, err)
	}
}

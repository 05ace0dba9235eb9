package main

import (
	"bytes"
	"context"
	"net/http/httptest"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/spore-run/spore/internal/api"
	"github.com/spore-run/spore/internal/apikey"
	"github.com/spore-run/spore/internal/store"
	"github.com/spore-run/spore/internal/store/sqlite"
)

// run runs the CLI with args against base with key, returning its output
// and error.
func runCLI(t *testing.T, base, key string, args ...string) (string, string, error) {
	t.Helper()
	t.Setenv("SPORE_API_URL", base)
	t.Setenv("SPORE_API_KEY", key)
	root := newRoot()
	var out, errb bytes.Buffer
	root.SetOut(&out)
	root.SetErr(&errb)
	root.SetArgs(args)
	err := root.ExecuteContext(context.Background())
	return out.String(), errb.String(), err
}

// The key verbs: create prints the key once (its ID on stderr), ls never
// shows it, revoke makes it useless; a user key is refused the key verbs
// with a clear message and a non-zero exit.
func TestKeyVerbs(t *testing.T) {
	ctx := context.Background()
	st, err := sqlite.Open(ctx, filepath.Join(t.TempDir(), "spore.db"))
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	const admin = "spore_admin_key_for_the_cli_test"
	if err := st.AddAPIKey(ctx, store.APIKey{ID: "k1", Hash: apikey.Hash(admin), Role: store.RoleAdmin, CreatedAt: time.Now()}); err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(api.New(api.Config{Store: st}))
	defer srv.Close()

	out, stderr, err := runCLI(t, srv.URL, admin, "key", "create", "--name", "agent")
	userKey := strings.TrimSpace(out)
	if err != nil || !strings.HasPrefix(userKey, apikey.Prefix) || !strings.Contains(stderr, "not shown again") {
		t.Fatalf("key create: %q %q %v", out, stderr, err)
	}
	out, _, err = runCLI(t, srv.URL, admin, "key", "ls")
	if err != nil || !strings.Contains(out, "agent") || !strings.Contains(out, "user") || strings.Contains(out, userKey) {
		t.Fatalf("key ls: %q %v", out, err)
	}
	if _, _, err := runCLI(t, srv.URL, userKey, "key", "ls"); err == nil || !strings.Contains(err.Error(), "admin key") {
		t.Fatalf("key ls with a user key: %v, want a refusal naming the admin key", err)
	}
	rec, err := st.APIKeyByHash(ctx, apikey.Hash(userKey))
	if err != nil {
		t.Fatal(err)
	}
	if out, _, err := runCLI(t, srv.URL, admin, "key", "revoke", rec.ID); err != nil || !strings.Contains(out, "revoked") {
		t.Fatalf("key revoke: %q %v", out, err)
	}
	if _, _, err := runCLI(t, srv.URL, userKey, "secret", "ls"); err == nil || !strings.Contains(err.Error(), "invalid API key") {
		t.Fatalf("a revoked key: %v", err)
	}
	if _, _, err := runCLI(t, srv.URL, admin, "key", "revoke", "k1"); err == nil || !strings.Contains(err.Error(), "last valid admin key") {
		t.Fatalf("revoke the last admin key: %v", err)
	}
	out, _, err = runCLI(t, srv.URL, admin, "key", "ls", "--all", "--json")
	if err != nil || strings.Count(out, `"revokedAt"`) != 1 {
		t.Fatalf("key ls --all --json: %q %v", out, err)
	}
}

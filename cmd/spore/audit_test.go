package main

import (
	"context"
	"encoding/json"
	"net/http/httptest"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/spore-run/spore/internal/api"
	"github.com/spore-run/spore/internal/apikey"
	"github.com/spore-run/spore/internal/audit"
	"github.com/spore-run/spore/internal/store"
	"github.com/spore-run/spore/internal/store/sqlite"
)

// spore audit: the team's trail as a table, as JSON, as JSON lines (every
// record), every team's with --all; bad flags are a message and a
// non-zero exit.
func TestAuditVerb(t *testing.T) {
	ctx := context.Background()
	st, err := sqlite.Open(ctx, filepath.Join(t.TempDir(), "spore.db"))
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	const op = "spore_operator_key_for_the_audit_test"
	if err := st.AddAPIKey(ctx, store.APIKey{ID: "operator-key", Name: "ops", Hash: apikey.Hash(op), Role: store.RoleOperator, CreatedAt: time.Now()}); err != nil {
		t.Fatal(err)
	}
	w := audit.NewWriter(st, nil)
	defer w.Close()
	srv := httptest.NewServer(api.New(api.Config{Store: st, Audit: w}))
	defer srv.Close()

	if _, _, err := runCLI(t, srv.URL, op, "team", "create", "audited"); err != nil {
		t.Fatal(err)
	}
	if _, _, err := runCLI(t, srv.URL, op, "key", "create", "--name", "ci"); err != nil {
		t.Fatal(err)
	}
	if _, _, err := runCLI(t, srv.URL, op, "team", "rm", "no-such-team"); err == nil {
		t.Fatal("removing a missing team succeeded")
	}
	if err := w.Flush(ctx); err != nil {
		t.Fatal(err)
	}
	out, _, err := runCLI(t, srv.URL, op, "audit")
	if err != nil || !strings.Contains(out, "POST /api-keys") || !strings.Contains(out, "ops") || strings.Contains(out, "POST /teams") {
		t.Fatalf("spore audit (the default team's): %q %v", out, err)
	}
	out, _, err = runCLI(t, srv.URL, op, "audit", "--all", "--json")
	var recs []store.AuditRecord
	if err != nil || json.Unmarshal([]byte(out), &recs) != nil || len(recs) != 3 || recs[0].Action != "DELETE /teams/{teamID}" || recs[0].Status != 404 || recs[2].Action != "POST /teams" {
		t.Fatalf("spore audit --all --json: %q %v", out, err)
	}
	out, _, err = runCLI(t, srv.URL, op, "audit", "--all", "--jsonl", "--since", "1h")
	if err != nil || strings.Count(out, "\n") != 3 {
		t.Fatalf("spore audit --jsonl: %q %v", out, err)
	}
	for _, args := range [][]string{{"audit", "--since", "yesterday"}, {"audit", "--limit", "-1"}, {"audit", "--next", "nope"}} {
		if _, _, err := runCLI(t, srv.URL, op, args...); err == nil {
			t.Errorf("%v succeeded", args)
		}
	}
}

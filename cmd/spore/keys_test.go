package main

import (
	"bytes"
	"context"
	"io"
	"net/http/httptest"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/spf13/pflag"

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
	if err := st.AddAPIKey(ctx, store.APIKey{ID: "k1", Hash: apikey.Hash(admin), Role: store.RoleOperator, CreatedAt: time.Now()}); err != nil {
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
	if err != nil || !strings.Contains(out, "agent") || !strings.Contains(out, "member") || !strings.Contains(out, "default") || strings.Contains(out, userKey) {
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
	if _, _, err := runCLI(t, srv.URL, admin, "key", "revoke", "k1"); err == nil || !strings.Contains(err.Error(), "last valid operator key") {
		t.Fatalf("revoke the last operator key: %v", err)
	}
	out, _, err = runCLI(t, srv.URL, admin, "key", "ls", "--all", "--json")
	if err != nil || strings.Count(out, `"revokedAt"`) != 1 {
		t.Fatalf("key ls --all --json: %q %v", out, err)
	}
}

// The team verbs: an operator makes a team and its admin key; that key
// sees its team only (team ls, key ls), makes a scoped member key, and
// cannot make or remove teams; a team that owns nothing is removed and
// its keys stop working; bad input is a clear error and a non-zero exit.
func TestTeamVerbs(t *testing.T) {
	ctx := context.Background()
	st, err := sqlite.Open(ctx, filepath.Join(t.TempDir(), "spore.db"))
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	const op = "spore_operator_key_for_the_cli_test"
	if err := st.AddAPIKey(ctx, store.APIKey{ID: "operator-key", Hash: apikey.Hash(op), Role: store.RoleOperator, CreatedAt: time.Now()}); err != nil {
		t.Fatal(err)
	}
	def := store.Quotas{Sandboxes: 7}
	srv := httptest.NewServer(api.New(api.Config{Store: st, DefaultTeamQuotas: def}))
	defer srv.Close()

	out, _, err := runCLI(t, srv.URL, op, "team", "create", "research")
	teamID := strings.TrimSpace(out)
	if err != nil || !strings.HasPrefix(teamID, "t") {
		t.Fatalf("team create: %q %v", out, err)
	}
	// No quota flag: the deployment's defaults; any: those given.
	for name, c := range map[string]struct {
		args []string
		want store.Quotas
	}{
		"research":   {nil, def},
		"unbounded":  {[]string{"--sandboxes", "0"}, store.Quotas{}},
		"small-team": {[]string{"--vcpus", "4"}, store.Quotas{VCPUs: 4}},
	} {
		if name != "research" {
			if _, _, err := runCLI(t, srv.URL, op, append([]string{"team", "create", name}, c.args...)...); err != nil {
				t.Fatalf("team create %s %v: %v", name, c.args, err)
			}
		}
		if got, err := st.GetTeam(ctx, name); err != nil || got.Quotas != c.want {
			t.Fatalf("team %s made with %v: %+v %v, want quotas %+v", name, c.args, got.Quotas, err, c.want)
		}
	}
	if _, _, err := runCLI(t, srv.URL, op, "team", "create", "research"); err == nil || !strings.Contains(err.Error(), "exists") {
		t.Fatalf("a second team of the same name: %v", err)
	}
	out, stderr, err := runCLI(t, srv.URL, op, "key", "create", "--key-team", teamID, "--role", "admin", "--name", "lead")
	lead := strings.TrimSpace(out)
	if err != nil || !strings.Contains(stderr, teamID) {
		t.Fatalf("key create for the team: %q %q %v", out, stderr, err)
	}
	if out, _, err := runCLI(t, srv.URL, lead, "team", "ls"); err != nil || !strings.Contains(out, "research") || strings.Contains(out, "default") {
		t.Fatalf("team ls with the team's key: %q %v", out, err)
	}
	if out, _, err := runCLI(t, srv.URL, op, "team", "ls"); err != nil || !strings.Contains(out, "research") || !strings.Contains(out, "default") {
		t.Fatalf("team ls with the operator key: %q %v", out, err)
	}
	out, _, err = runCLI(t, srv.URL, lead, "key", "create", "--name", "ci", "--op", "sandboxes.create", "--template", "ci-*", "--ttl", "24h")
	if err != nil || !strings.HasPrefix(strings.TrimSpace(out), apikey.Prefix) {
		t.Fatalf("a scoped key made by the team's admin: %q %v", out, err)
	}
	out, _, err = runCLI(t, srv.URL, lead, "key", "ls")
	if err != nil || !strings.Contains(out, "sandboxes.create on ci-*") || strings.Contains(out, "operator-key") {
		t.Fatalf("key ls with the team's key (its team's keys only): %q %v", out, err)
	}
	for _, args := range [][]string{
		{"team", "create", "mine"},
		{"team", "rm", teamID},
		{"key", "create", "--role", "operator"},
		{"key", "create", "--op", "sandboxes.destroy"},
		{"team", "info", "default"},
	} {
		if _, _, err := runCLI(t, srv.URL, lead, args...); err == nil {
			t.Errorf("%v with a team admin key succeeded", args)
		}
	}
	// Quotas: an operator sets them, the team's admin reads them.
	if out, _, err := runCLI(t, srv.URL, op, "team", "quota", "research", "--sandboxes", "3", "--memory-mb", "4096"); err != nil || !strings.Contains(out, "sandboxes 3, memory-mb 4096") {
		t.Fatalf("team quota: %q %v", out, err)
	}
	if _, _, err := runCLI(t, srv.URL, lead, "team", "quota", "research", "--sandboxes", "300"); err == nil {
		t.Fatal("a team admin set its own quotas")
	}
	if _, _, err := runCLI(t, srv.URL, op, "team", "quota", "research", "--vcpus", "-1"); err == nil || !strings.Contains(err.Error(), "vcpus") {
		t.Fatalf("a negative quota: %v", err)
	}
	out, _, err = runCLI(t, srv.URL, lead, "team", "info", "research")
	if err != nil || !regexp.MustCompile(`sandboxes\s+0\s+3`).MatchString(out) || !regexp.MustCompile(`memory\s+0 MiB\s+4096 MiB`).MatchString(out) || !regexp.MustCompile(`vcpus\s+0\s+-`).MatchString(out) {
		t.Fatalf("team info with quotas: %q %v", out, err)
	}
	if out, _, err := runCLI(t, srv.URL, op, "team", "create", "limited", "--creates-per-minute", "10"); err != nil || !strings.HasPrefix(out, "t") {
		t.Fatalf("team create with a quota: %q %v", out, err)
	}
	if out, _, err := runCLI(t, srv.URL, op, "team", "info", "limited", "--json"); err != nil || !strings.Contains(out, `"createsPerMinute": 10`) {
		t.Fatalf("team info --json: %q %v", out, err)
	}
	if out, _, err := runCLI(t, srv.URL, op, "team", "rm", teamID); err != nil || !strings.Contains(out, "removed") {
		t.Fatalf("team rm: %q %v", out, err)
	}
	if _, _, err := runCLI(t, srv.URL, lead, "team", "ls"); err == nil || !strings.Contains(err.Error(), "invalid API key") {
		t.Fatalf("the removed team's key: %v", err)
	}
	if _, _, err := runCLI(t, srv.URL, op, "team", "rm", "default"); err == nil || !strings.Contains(err.Error(), "default team") {
		t.Fatalf("team rm default: %v", err)
	}
}

// --default-team-quotas reads store.ParseQuotas' form, refuses a bad one
// (the server does not start), and shows what it holds.
func TestDefaultTeamQuotasFlag(t *testing.T) {
	var q store.Quotas
	fs := pflag.NewFlagSet("up", pflag.ContinueOnError)
	fs.SetOutput(io.Discard)
	defaultQuotasFlag(fs, &q)
	if err := fs.Parse([]string{"--default-team-quotas", "sandboxes=20,memory-mb=40960"}); err != nil {
		t.Fatal(err)
	}
	if q != (store.Quotas{Sandboxes: 20, MemoryMB: 40960}) || fs.Lookup("default-team-quotas").Value.String() != "sandboxes=20,memory-mb=40960" {
		t.Fatalf("parsed %+v, shown %q", q, fs.Lookup("default-team-quotas").Value.String())
	}
	for _, bad := range []string{"sandboxes=-1", "cpus=2", "sandboxes"} {
		if err := fs.Parse([]string{"--default-team-quotas", bad}); err == nil || !strings.Contains(err.Error(), "default-team-quotas") {
			t.Errorf("--default-team-quotas %s: %v, want refused", bad, err)
		}
	}
}

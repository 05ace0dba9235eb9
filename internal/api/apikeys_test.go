package api_test

import (
	"context"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/spore-run/spore/internal/api"
	"github.com/spore-run/spore/internal/store"
)

// keyServer is an API over st with no node: enough for the key routes and
// the operator routes' access checks.
func keyServer(t *testing.T, st store.Store) string {
	srv := httptest.NewServer(api.New(api.Config{Store: st}))
	t.Cleanup(srv.Close)
	return srv.URL
}

func callKey(t *testing.T, base, k, method, path, body string) (int, []byte) {
	t.Helper()
	req, _ := http.NewRequest(method, base+path, strings.NewReader(body))
	req.Header.Set("X-API-KEY", k)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, b
}

func wantJSONError(t *testing.T, what string, code int, b []byte, want int) {
	t.Helper()
	var e api.ErrorBody
	if code != want || json.Unmarshal(b, &e) != nil || e.Code != want || e.Message == "" {
		t.Fatalf("%s = %d %s, want %d with a JSON {code,message}", what, code, b, want)
	}
}

// The operator routes are exactly the fleet's own (nodes, drain, blob GC,
// the server's internals, making and removing teams), and a team's key,
// even its admin's, gets a JSON 403 on every one of them, while an
// operator key passes the check.
func TestOperatorRoutesNeedAnOperatorKey(t *testing.T) {
	base := newFnode(t).url // its key is an operator key
	code, b := callKey(t, base, key, "POST", "/api-keys", `{"name":"agent","role":"admin"}`)
	if code != 201 {
		t.Fatalf("create a team admin key = %d %s", code, b)
	}
	var created api.CreatedKey
	if err := json.Unmarshal(b, &created); err != nil || created.Key == "" || created.Role != store.RoleAdmin || created.TeamID != store.DefaultTeam {
		t.Fatalf("created = %s", b)
	}
	want := []string{"GET /nodes", "POST /nodes/{nodeID}/drain", "POST /nodes/{nodeID}/undrain", "POST /blobs/gc",
		"GET /debug/stats", "GET /metrics", "GET /debug/pprof/", "GET /debug/pprof/profile", "GET /debug/pprof/trace", "GET /debug/pprof/symbol",
		"POST /teams", "PATCH /teams/{teamID}", "DELETE /teams/{teamID}"}
	got := api.AdminRoutes()
	slices.Sort(got)
	slices.Sort(want)
	if !slices.Equal(got, want) {
		t.Fatalf("admin routes = %v, want %v", got, want)
	}
	for _, r := range got {
		method, path, _ := strings.Cut(r, " ")
		path = strings.NewReplacer("{nodeID}", "n1", "{teamID}", "t0000000000000000000").Replace(path)
		code, b := callKey(t, base, created.Key, method, path, `{}`)
		wantJSONError(t, r+" with a team admin key", code, b, http.StatusForbidden)
		if r == "GET /debug/pprof/profile" || r == "GET /debug/pprof/trace" {
			continue // an admin key would profile for seconds
		}
		if code, b := callKey(t, base, key, method, path, `{}`); code == http.StatusForbidden || code == http.StatusUnauthorized {
			t.Errorf("%s with an operator key = %d %s", r, code, b)
		}
	}
	// A team key still reaches its team's routes.
	if code, b := callKey(t, base, created.Key, "GET", "/secrets", ""); code == 401 || code == 403 {
		t.Fatalf("GET /secrets with a team admin key = %d %s", code, b)
	}
}

// Keys are made (shown once), listed (never shown), revoked (refused at
// once on this replica, within apikey.KeysFresh on another one over the
// same store); the last operator key cannot be revoked; bad input
// changes nothing.
func TestKeyLifecycle(t *testing.T) {
	st := openStore(t)
	a, b := keyServer(t, st), keyServer(t, st) // two replicas
	code, body := callKey(t, a, key, "POST", "/api-keys", `{"name":"ci","role":"admin"}`)
	if code != 201 {
		t.Fatalf("create = %d %s", code, body)
	}
	var ci api.CreatedKey
	json.Unmarshal(body, &ci)
	for _, base := range []string{a, b} {
		if code, body := callKey(t, base, ci.Key, "GET", "/api-keys", ""); code != 200 || strings.Contains(string(body), ci.Key) {
			t.Fatalf("list with the new key = %d %s (must not show the key)", code, body)
		}
	}
	var list []api.KeyInfo
	_, body = callKey(t, a, key, "GET", "/api-keys", "")
	if err := json.Unmarshal(body, &list); err != nil || len(list) != 2 || list[1].ID != ci.ID || list[1].Mask == "" {
		t.Fatalf("list = %s", body)
	}
	for _, c := range []struct{ method, path, body string }{
		{"POST", "/api-keys", `{"role":"root"}`},
		{"POST", "/api-keys", `{"name":"x","scopes":["all"]}`},
		{"DELETE", "/api-keys/..%2Fetc", ""},
		{"GET", "/api-keys?revoked=maybe", ""},
	} {
		code, body := callKey(t, a, key, c.method, c.path, c.body)
		if code != 400 && code != 404 {
			t.Errorf("%s %s %s = %d %s, want 400", c.method, c.path, c.body, code, body)
		}
	}
	if n, _ := st.CountAPIKeys(context.Background()); n != 2 {
		t.Fatalf("bad input changed the keys: %d valid", n)
	}
	code, body = callKey(t, a, key, "DELETE", "/api-keys/k0000000000000000000", "")
	wantJSONError(t, "revoke an unknown key", code, body, 404)

	// Revoke ci through replica a: refused there at once, on b soon.
	if code, body := callKey(t, a, key, "DELETE", "/api-keys/"+ci.ID, ""); code != 204 {
		t.Fatalf("revoke = %d %s", code, body)
	}
	code, body = callKey(t, a, ci.Key, "GET", "/api-keys", "")
	wantJSONError(t, "the revoked key on the replica that revoked it", code, body, 401)
	deadline := time.Now().Add(10 * time.Second)
	for {
		code, body = callKey(t, b, ci.Key, "GET", "/api-keys", "")
		if code == 401 || time.Now().After(deadline) {
			break
		}
		time.Sleep(50 * time.Millisecond)
	}
	wantJSONError(t, "the revoked key on the other replica", code, body, 401)
	_, body = callKey(t, a, key, "GET", "/api-keys?revoked=true", "")
	if err := json.Unmarshal(body, &list); err != nil || len(list) != 2 || list[1].RevokedAt == "" {
		t.Fatalf("list with revoked = %s", body)
	}

	// The last operator key stays.
	var first api.KeyInfo
	json.Unmarshal(body, &list)
	first = list[0]
	code, body = callKey(t, a, key, "DELETE", "/api-keys/"+first.ID, "")
	wantJSONError(t, "revoke the last operator key", code, body, 409)
	if code, body := callKey(t, a, key, "GET", "/api-keys", ""); code != 200 {
		t.Fatalf("the last operator key after a refused revoke = %d %s", code, body)
	}
}

// A store that cannot check keys answers 503 (retry), never 401 (the
// key may well be valid).
func TestKeyStoreDownIs503(t *testing.T) {
	st := openStore(t)
	base := keyServer(t, brokenKeys{st})
	code, body := callKey(t, base, key, "GET", "/snapshots", "")
	wantJSONError(t, "a request while the store cannot check keys", code, body, 503)
}

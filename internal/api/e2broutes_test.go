package api_test

import (
	"encoding/json"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/spore-run/spore/internal/api"
	"github.com/spore-run/spore/internal/control/controltest"
	"github.com/spore-run/spore/internal/errdefs"
)

// E2B routes Spore does not serve answer a JSON 501 naming the route (after
// the API key check), not the 404 the stock SDK reads as "no such thing";
// a path outside E2B's API is still a 404. Template.exists's route answers
// 200 for a template's name and 404 for an unknown one.
func TestE2BRoutes(t *testing.T) {
	f := newFnode(t)
	// The caller's own sandbox and team: another's (or none) is 404
	// (TestTeamsAreIsolated).
	sb := f.create(`{"templateID":"base","timeout":60}`)
	fill := strings.NewReplacer("{sandboxID}", sb.SandboxID, "{templateID}", "base", "{buildID}", "b1",
		"{hash}", "abc", "{secretID}", "s1", "{teamID}", "default", "{volumeID}", "v1")
	for _, r := range api.E2BUnimplemented() {
		method, path, _ := strings.Cut(r, " ")
		path = fill.Replace(path)
		if code, _, _ := call(t, f.url, method, path, "{}", "X-API-KEY", "wrong"); code != 401 {
			t.Errorf("%s with a wrong key: %d, want 401", r, code)
		}
		code, b, _ := f.do(method, path, "{}")
		var e api.ErrorBody
		if json.Unmarshal(b, &e) != nil || code != 501 || e.Code != 501 || !strings.Contains(e.Message, r) {
			t.Errorf("%s: %d %s, want a JSON 501 naming the route", r, code, b)
		}
	}
	if code, _, _ := f.do("GET", "/no/such/route", ""); code != 404 {
		t.Errorf("unknown path: %d, want 404", code)
	}
	for _, c := range []struct {
		alias string
		code  int
	}{{controltest.Templates[0], 200}, {"no-such-template", 404}, {"bad%20name", 400}, {"tags", 404}} {
		code, b, _ := f.do("GET", "/templates/aliases/"+c.alias, "")
		if code != c.code {
			t.Errorf("alias %s: %d %s, want %d", c.alias, code, b, c.code)
		}
		if c.code == 200 {
			var a api.AliasResponse
			if json.Unmarshal(b, &a) != nil || a.TemplateID == "" {
				t.Errorf("alias %s: %s", c.alias, b)
			}
		}
	}
	// The template behind an alias is the one GET /templates lists.
	code, b, _ := f.do("GET", "/templates", "")
	if code != 200 || !strings.Contains(string(b), controltest.Templates[0]) {
		t.Fatalf("templates: %d %s", code, b)
	}
}

// With a domain configured, create, connect and fork answers carry it (the
// stock SDK's getHost(port) then names {port}-{id}.{domain}, which the
// proxy routes); without, none is announced. Bad domains are refused.
func TestDomainAnnounced(t *testing.T) {
	f := newFnode(t)
	if sb := f.create(`{"templateID":"base"}`); sb.Domain != "" {
		t.Fatalf("domain announced without one configured: %q", sb.Domain)
	}
	srv := httptest.NewServer(api.New(api.Config{Control: f.ctl, Store: f.st, Domain: "sandboxes.example.test"}))
	defer srv.Close()
	code, b, _ := call(t, srv.URL, "POST", "/v2/sandboxes", `{"templateID":"base"}`)
	var sb api.SandboxResponse
	if json.Unmarshal(b, &sb) != nil || code != 201 || sb.Domain != "sandboxes.example.test" {
		t.Fatalf("create: %d %s", code, b)
	}
	code, b, _ = call(t, srv.URL, "POST", "/sandboxes/"+sb.SandboxID+"/connect", `{"timeout":60}`)
	var c api.SandboxResponse
	if json.Unmarshal(b, &c) != nil || code/100 != 2 || c.Domain != "sandboxes.example.test" {
		t.Fatalf("connect: %d %s", code, b)
	}
	for _, d := range []string{"", "example.com", "sandboxes.example.com:8443", "localhost"} {
		if err := api.ValidateDomain(d); err != nil {
			t.Errorf("%q: %v", d, err)
		}
	}
	for _, d := range []string{"Example.com", "a..b", "-a.b", "a.b:", "a b", "a.b/c", "*.a.b", "a.b:123456"} {
		if err := api.ValidateDomain(d); !errdefs.IsInvalidArgument(err) {
			t.Errorf("%q: %v, want invalid", d, err)
		}
	}
}

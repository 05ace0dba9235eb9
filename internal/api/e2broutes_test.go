package api_test

import (
	"encoding/json"
	"strings"
	"testing"

	"github.com/spore-run/spore/internal/api"
	"github.com/spore-run/spore/internal/control/controltest"
)

// E2B routes Spore does not serve answer a JSON 501 naming the route (after
// the API key check), not the 404 the stock SDK reads as "no such thing";
// a path outside E2B's API is still a 404. Template.exists's route answers
// 200 for a template's name and 404 for an unknown one.
func TestE2BRoutes(t *testing.T) {
	f := newFnode(t)
	fill := strings.NewReplacer("{sandboxID}", "i0000000000000000000", "{templateID}", "base", "{buildID}", "b1",
		"{hash}", "abc", "{secretID}", "s1", "{teamID}", "t1", "{volumeID}", "v1")
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

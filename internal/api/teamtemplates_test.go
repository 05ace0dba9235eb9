package api_test

import (
	"encoding/json"
	"net/http/httptest"
	"slices"
	"strings"
	"testing"

	"github.com/spore-run/spore/internal/api"
	"github.com/spore-run/spore/internal/blob/local"
	"github.com/spore-run/spore/internal/build"
	"github.com/spore-run/spore/internal/control"
	"github.com/spore-run/spore/internal/store"
)

// Template names are per team through E2B's build routes: two teams
// request builds of one name; each gets its own template (the default
// team's ID is the name, another team's its key), reads, uploads to and
// removes its own by that name, and the other team's key answers 404.
func TestTemplateNamesArePerTeam(t *testing.T) {
	st := openStore(t)
	blobs, err := local.Open(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { blobs.Close() })
	ctl := control.New(control.Config{Store: st, Nodes: control.Nodes{}}) // no node: the builds never start
	t.Cleanup(ctl.Close)
	srv := httptest.NewServer(api.New(api.Config{Store: st, Control: ctl, Builds: &build.Service{St: st, Blobs: blobs}}))
	t.Cleanup(srv.Close)
	want := func(code int, method, path, body string, hdr ...string) []byte {
		t.Helper()
		got, b, _ := call(t, srv.URL, method, path, body, hdr...)
		if got != code {
			t.Fatalf("%s %s %s = %d %s, want %d", method, path, body, got, b, code)
		}
		return b
	}
	var tb api.TeamInfo
	json.Unmarshal(want(201, "POST", "/teams", `{"name":"team-b"}`), &tb)
	var bKey api.CreatedKey
	json.Unmarshal(want(201, "POST", "/api-keys", `{"name":"b","role":"admin","teamID":"`+tb.TeamID+`"}`), &bKey)
	asB := []string{"X-API-KEY", bKey.Key}
	bApp := store.TemplateKey(tb.TeamID, "app")

	var a, b api.BuildRequestResponse
	json.Unmarshal(want(202, "POST", "/v3/templates", `{"name":"app"}`), &a)
	json.Unmarshal(want(202, "POST", "/v3/templates", `{"name":"app"}`, asB...), &b)
	if a.TemplateID != "app" || !slices.Equal(a.Names, []string{"app"}) {
		t.Fatalf("the default team's build: %+v", a)
	}
	if b.TemplateID != bApp || !slices.Equal(b.Names, []string{"app"}) || b.BuildID == a.BuildID {
		t.Fatalf("team B's build: %+v, want template ID %s named app", b, bApp)
	}

	// Each reads its own by the name; B's by its key too.
	for _, c := range []struct {
		who     string
		path    string
		hdr     []string
		id, bld string
	}{
		{"A", "/templates/app", nil, "app", a.BuildID},
		{"B", "/templates/app", asB, bApp, b.BuildID},
		{"B", "/templates/" + bApp, asB, bApp, b.BuildID},
	} {
		var got api.TemplateWithBuilds
		json.Unmarshal(want(200, "GET", c.path, "", c.hdr...), &got)
		if got.TemplateID != c.id || !slices.Equal(got.Names, []string{"app"}) || len(got.Builds) != 1 || got.Builds[0].BuildID != c.bld {
			t.Fatalf("%s GET %s: %+v, want %s with build %s", c.who, c.path, got, c.id, c.bld)
		}
	}
	want(200, "GET", "/templates/app/builds/"+b.BuildID+"/status", "", asB...)
	want(404, "GET", "/templates/app/builds/"+a.BuildID+"/status", "", asB...)
	want(404, "GET", "/templates/"+bApp, "")
	want(404, "GET", "/templates/"+bApp+"/builds/"+b.BuildID+"/status", "")

	// B's upload link names its key: the SDK uploads to B's template.
	var link api.FileUpload
	json.Unmarshal(want(201, "GET", "/templates/app/files/"+strings.Repeat("ab", 32), "", asB...), &link)
	if !strings.Contains(link.URL, "/templates/"+bApp+"/files/") {
		t.Fatalf("B's upload link %s, want under its template %s", link.URL, bApp)
	}

	// A name that would read as another team's key is refused.
	want(400, "POST", "/v3/templates", `{"name":"app.`+tb.TeamID+`"}`)
	want(400, "POST", "/v3/templates", `{"name":"`+strings.Repeat("x", 120)+`"}`, asB...)

	// B removes its own; A's stays.
	want(204, "DELETE", "/templates/app", "", asB...)
	want(404, "GET", "/templates/app", "", asB...)
	var got api.TemplateWithBuilds
	json.Unmarshal(want(200, "GET", "/templates/app", ""), &got)
	if got.TemplateID != "app" || len(got.Builds) != 1 || got.Builds[0].BuildID != a.BuildID {
		t.Fatalf("A's template after B removed its own: %+v", got)
	}
}

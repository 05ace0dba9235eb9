package api_test

import (
	"context"
	"encoding/json"
	"net/http"
	"regexp"
	"slices"
	"strings"
	"testing"

	"github.com/spore-run/spore/internal/api"
	"github.com/spore-run/spore/internal/control/controltest"
	"github.com/spore-run/spore/internal/store"
)

// teamRoute is a route called with another team's IDs: the path, with
// {sandboxID} and the like replaced by what team A made.
type teamRoute struct{ method, path, body string }

// crossTeamRoutes is every route that names a team's thing by ID or
// name, written out here (not read from the router's table), so that a
// route added to the router without its team check fails
// TestEveryRouteWithAnIDIsCoveredForTeams until it is listed here.
var crossTeamRoutes = []teamRoute{
	{"GET", "/sandboxes/{sandboxID}", ""},
	{"DELETE", "/sandboxes/{sandboxID}", ""},
	{"POST", "/sandboxes/{sandboxID}/connect", `{"timeout":60}`},
	{"POST", "/v2/sandboxes/{sandboxID}/connect", `{"timeout":60}`},
	{"POST", "/sandboxes/{sandboxID}/resume", `{}`},
	{"POST", "/sandboxes/{sandboxID}/pause", ""},
	{"POST", "/sandboxes/{sandboxID}/hibernate", ""},
	{"POST", "/sandboxes/{sandboxID}/timeout", `{"timeout":60}`},
	{"PUT", "/sandboxes/{sandboxID}/network", `{"allowOut":["example.com"]}`},
	{"GET", "/sandboxes/{sandboxID}/metrics", ""},
	{"GET", "/sandboxes/{sandboxID}/egress", ""},
	{"POST", "/sandboxes/{sandboxID}/snapshots", `{"name":"stolen"}`},
	{"POST", "/sandboxes/{sandboxID}/fork", `{"count":1}`},
	{"POST", "/sandboxes/{sandboxID}/rollback", `{"snapshotID":"{snapshotID}"}`},
	{"POST", "/sandboxes/{sandboxID}/export", `{"format":"oci-layout"}`},
	{"GET", "/sandboxes/{sandboxID}/logs", ""},
	{"GET", "/v2/sandboxes/{sandboxID}/logs", ""},
	{"POST", "/sandboxes/{sandboxID}/refreshes", `{}`},
	{"GET", "/snapshots/{snapshotID}", ""},
	{"GET", "/snapshots/{snapshotName}", ""},
	{"POST", "/snapshots/{snapshotID}/export", `{"format":"oci-layout"}`},
	{"GET", "/snapshots/{snapshotID}/diff/{snapshotID}", ""},
	{"DELETE", "/templates/{snapshotID}", ""},
	{"DELETE", "/templates/{snapshotName}", ""},
	{"DELETE", "/templates/{templateName}", ""},
	{"GET", "/templates/{templateName}", ""},
	{"PATCH", "/templates/{templateName}", `{"public":true}`},
	{"PATCH", "/v2/templates/{templateName}", `{"public":true}`},
	{"GET", "/templates/aliases/{templateName}", ""},
	{"GET", "/templates/{templateName}/tags", ""},
	{"GET", "/templates/{templateName}/files/{hash}", ""},
	{"PUT", "/templates/{templateName}/files/{hash}", "x"},
	{"POST", "/v2/templates/{templateName}/builds/{buildID}", `{}`},
	{"GET", "/templates/{templateName}/builds/{buildID}/status", ""},
	{"GET", "/templates/{templateName}/builds/{buildID}/logs", ""},
	{"GET", "/secrets/{secretID}", ""},
	{"GET", "/secrets/{secretName}", ""},
	{"POST", "/secrets/{secretID}", `{"value":"stolen"}`},
	{"DELETE", "/secrets/{secretID}", ""},
	{"DELETE", "/secrets/{secretName}", ""},
	{"GET", "/volumes/{volumeID}", ""},
	{"GET", "/volumes/{volumeName}", ""},
	{"DELETE", "/volumes/{volumeID}", ""},
	{"DELETE", "/api-keys/{apiKeyID}", ""},
	{"GET", "/teams/{teamID}", ""},
	{"GET", "/teams/{teamID}/metrics", ""},
	{"GET", "/teams/{teamID}/metrics/max", ""},
}

// The routes whose path parameter is not a team's thing.
var notTeamScoped = map[string]bool{
	"POST /nodes/{nodeID}/drain": true, "POST /nodes/{nodeID}/undrain": true, // operator routes
	"DELETE /teams/{teamID}": true, "PATCH /teams/{teamID}": true, // operator routes
	api.SignedUploadRoute: true, // its signature is its credential
	"GET /console/{file}": true, // the console's static assets
}

var pathParam = regexp.MustCompile(`\{[A-Za-z]+\}`)

// Every route with a path parameter is in crossTeamRoutes (or is known
// not to name a team's thing).
func TestEveryRouteWithAnIDIsCoveredForTeams(t *testing.T) {
	covered := map[string]bool{}
	for _, r := range crossTeamRoutes {
		covered[r.method+" "+pathParam.ReplaceAllString(r.path, "{}")] = true
	}
	routes := api.Routes()
	for _, p := range api.E2BUnimplemented() {
		routes[p] = true
	}
	for r := range routes {
		if !strings.Contains(r, "{") || notTeamScoped[r] {
			continue
		}
		if !covered[pathParam.ReplaceAllString(r, "{}")] {
			t.Errorf("route %s names a thing by ID but is not in crossTeamRoutes", r)
		}
	}
}

// Two teams on one deployment: team B's admin key, given every ID and
// name team A made, gets 404 on every route and changes nothing; team B
// may use the same names; lists show each team its own; a private
// template is A's alone until A publishes it, and only A changes it.
func TestTeamsAreIsolated(t *testing.T) { controltest.Each(t, testTeamsAreIsolated) }

func testTeamsAreIsolated(t *testing.T, _ controltest.Config) {
	f := newFnode(t, withSecrets(t))
	// The operator key acts in the default team: team A here.
	var tb api.TeamInfo
	json.Unmarshal(f.want(201, "POST", "/teams", `{"name":"team-b"}`), &tb)
	var bKey, aMember api.CreatedKey
	json.Unmarshal(f.want(201, "POST", "/api-keys", `{"name":"b-admin","role":"admin","teamID":"`+tb.TeamID+`"}`), &bKey)
	json.Unmarshal(f.want(201, "POST", "/api-keys", `{"name":"a-member"}`), &aMember)
	if bKey.TeamID != tb.TeamID || aMember.TeamID != store.DefaultTeam {
		t.Fatalf("keys: %+v %+v", bKey, aMember)
	}
	asB := []string{"X-API-KEY", bKey.Key}

	// Team A's things.
	sb := f.create(`{"templateID":"base","timeout":300}`)
	var sn api.SnapshotInfo
	json.Unmarshal(f.want(201, "POST", "/sandboxes/"+sb.SandboxID+"/snapshots", `{"name":"golden"}`), &sn)
	f.want(201, "POST", "/sandboxes/"+sb.SandboxID+"/snapshots", `{"name":"a-tpl","template":true}`)
	var sec api.Secret
	json.Unmarshal(f.want(201, "POST", "/secrets", `{"name":"token","value":"a-secret-value"}`), &sec)
	var vol api.Volume
	json.Unmarshal(f.want(201, "POST", "/volumes", `{"name":"data"}`), &vol)
	var build api.BuildRequestResponse
	if code, b, _ := f.do("POST", "/v3/templates", `{"name":"a-built"}`); code == 202 {
		json.Unmarshal(b, &build)
	}
	repl := strings.NewReplacer("{sandboxID}", sb.SandboxID, "{snapshotID}", sn.SnapshotID, "{snapshotName}", "golden",
		"{templateName}", "a-tpl", "{secretID}", sec.SecretID, "{secretName}", "token", "{volumeID}", vol.VolumeID,
		"{volumeName}", "data", "{apiKeyID}", aMember.ID, "{teamID}", store.DefaultTeam, "{hash}", strings.Repeat("a", 64),
		"{buildID}", build.BuildID)
	for _, r := range crossTeamRoutes {
		path, body := repl.Replace(r.path), repl.Replace(r.body)
		if build.BuildID == "" && strings.Contains(r.path, "{buildID}") {
			path = strings.ReplaceAll(path, "/builds//", "/builds/00000000-0000-0000-0000-000000000000/")
		}
		code, b, _ := f.do(r.method, path, body, asB...)
		if code != http.StatusNotFound {
			t.Errorf("team B: %s %s = %d %.200s, want 404", r.method, path, code, b)
			continue
		}
		var e api.ErrorBody
		if json.Unmarshal(b, &e) != nil || e.Code != 404 || strings.Contains(e.Message, "another team") {
			t.Errorf("team B: %s %s answered %s: want a JSON 404 that says nothing of A", r.method, path, b)
		}
	}

	// Nothing changed for A.
	if st, _ := f.state(sb.SandboxID); st != "running" {
		t.Fatalf("A's sandbox is %s after team B's calls", st)
	}
	f.want(200, "GET", "/snapshots/golden", "")
	f.want(200, "GET", "/secrets/token", "")
	f.want(200, "GET", "/volumes/data", "")
	f.want(200, "GET", "/templates/a-tpl", "")
	var keys []api.KeyInfo
	json.Unmarshal(f.want(200, "GET", "/api-keys", ""), &keys)
	if !slices.ContainsFunc(keys, func(k api.KeyInfo) bool { return k.ID == aMember.ID && k.RevokedAt == "" }) {
		t.Fatalf("A's key after team B's calls: %+v", keys)
	}

	// Lists: each team its own.
	for _, p := range []string{"/v2/sandboxes", "/snapshots", "/secrets", "/volumes"} {
		if b := f.want(200, "GET", p, "", asB...); strings.TrimSpace(string(b)) != "[]" {
			t.Errorf("team B lists %s: %s, want none", p, b)
		}
	}
	if b := f.want(200, "GET", "/templates", "", asB...); strings.Contains(string(b), "a-tpl") || !strings.Contains(string(b), `"base"`) {
		t.Errorf("team B's templates: %s, want base and not A's private a-tpl", b)
	}
	var teams []api.TeamEntry
	json.Unmarshal(f.want(200, "GET", "/teams", "", asB...), &teams)
	if len(teams) != 1 || teams[0].TeamID != tb.TeamID || !teams[0].IsDefault || teams[0].APIKey != bKey.Mask {
		t.Fatalf("GET /teams with B's key: %+v", teams)
	}
	json.Unmarshal(f.want(200, "GET", "/api-keys", "", asB...), &keys)
	if len(keys) != 1 || keys[0].ID != bKey.ID {
		t.Fatalf("B lists keys: %+v, want its own", keys)
	}

	// What B's own calls name is looked up among B's things only.
	var bsbB api.SandboxResponse
	json.Unmarshal(f.want(201, "POST", "/v2/sandboxes", `{"templateID":"base","timeout":300}`, asB...), &bsbB)
	for _, r := range []teamRoute{
		{"POST", "/v2/sandboxes", `{"templateID":"` + sn.SnapshotID + `"}`},
		{"POST", "/v2/sandboxes", `{"templateID":"golden"}`},
		{"POST", "/v2/sandboxes", `{"templateID":"a-tpl"}`},
		{"POST", "/sandboxes/" + bsbB.SandboxID + "/rollback", `{"snapshotID":"` + sn.SnapshotID + `"}`},
		{"POST", "/sandboxes/" + bsbB.SandboxID + "/rollback", `{"snapshotID":"golden"}`},
		{"POST", "/v2/sandboxes", `{"templateID":"base","volumeMounts":[{"name":"data","path":"/data"}]}`},
	} {
		f.want(404, r.method, r.path, r.body, asB...)
	}
	// A secret only A has does not exist for B's network rules.
	f.want(400, "POST", "/v2/sandboxes", `{"templateID":"base","network":{"rules":{"api.example.com":[{"transform":{"headers":{"Authorization":"Bearer ${e2b.secrets.token}"}}}]}}}`, asB...)

	// Names are per team: B uses A's names for its own things.
	bsb := f.create(`{"templateID":"base","timeout":300}`)
	f.want(404, "GET", "/sandboxes/"+bsb.SandboxID, "", asB...) // A's, not B's
	f.want(201, "POST", "/sandboxes/"+bsbB.SandboxID+"/snapshots", `{"name":"golden"}`, asB...)
	f.want(201, "POST", "/secrets", `{"name":"token","value":"b-secret-value"}`, asB...)
	f.want(201, "POST", "/volumes", `{"name":"data"}`, asB...)
	// B's name resolves to B's snapshot, A's to A's.
	var bsn, asn api.SnapshotInfo
	json.Unmarshal(f.want(200, "GET", "/snapshots/golden", "", asB...), &bsn)
	json.Unmarshal(f.want(200, "GET", "/snapshots/golden", ""), &asn)
	if bsn.SnapshotID == asn.SnapshotID || asn.SnapshotID != sn.SnapshotID {
		t.Fatalf("golden: B's %s, A's %s (want A's %s)", bsn.SnapshotID, asn.SnapshotID, sn.SnapshotID)
	}
	// A private template is A's; public, B uses it and still cannot change it.
	f.want(404, "POST", "/v2/sandboxes", `{"templateID":"a-tpl","timeout":60}`, asB...)
	f.want(200, "PATCH", "/templates/a-tpl", `{"public":true}`)
	var fromTpl api.SandboxResponse
	json.Unmarshal(f.want(201, "POST", "/v2/sandboxes", `{"templateID":"a-tpl","timeout":60}`, asB...), &fromTpl)
	f.want(403, "PATCH", "/templates/a-tpl", `{"public":false}`, asB...)
	f.want(403, "DELETE", "/templates/a-tpl", "", asB...)
	f.want(200, "GET", "/templates/a-tpl", "", asB...)

	// Template names are per team: B saves its own a-tpl, which B's names
	// then find; A's (public) is still A's, for A.
	var bTpl api.SnapshotInfo
	json.Unmarshal(f.want(201, "POST", "/sandboxes/"+bsbB.SandboxID+"/snapshots", `{"name":"a-tpl","template":true}`, asB...), &bTpl)
	if !slices.Equal(bTpl.Names, []string{"a-tpl"}) {
		t.Fatalf("B's template: %+v, want named a-tpl", bTpl)
	}
	made := func(asked string, hdr ...string) (id, from string) {
		var sb api.SandboxResponse
		json.Unmarshal(f.want(201, "POST", "/v2/sandboxes", `{"templateID":"`+asked+`","timeout":60}`, hdr...), &sb)
		es, err := f.n.Engine.Get(context.Background(), sb.SandboxID)
		if err != nil {
			t.Fatal(err)
		}
		return sb.SandboxID, es.Template
	}
	// (The node knows a template by its key: A's by its name.)
	bKeyOf := store.TemplateKey(tb.TeamID, "a-tpl")
	bFromOwn, from := made("a-tpl", asB...)
	if from != bKeyOf {
		t.Fatalf("B's create from a-tpl started from %s, want B's template %s", from, bKeyOf)
	}
	aFromOwn, from := made("a-tpl")
	if from != "a-tpl" {
		t.Fatalf("A's create from a-tpl started from %s, want A's", from)
	}
	f.want(204, "DELETE", "/sandboxes/"+aFromOwn, "")
	var bList, aList []api.TemplateInfo
	json.Unmarshal(f.want(200, "GET", "/templates", "", asB...), &bList)
	json.Unmarshal(f.want(200, "GET", "/templates", ""), &aList)
	ownB := slices.IndexFunc(bList, func(x api.TemplateInfo) bool { return x.TemplateID == bTpl.SnapshotID })
	named := 0
	for _, x := range bList {
		if slices.Equal(x.Names, []string{"a-tpl"}) {
			named++
		}
	}
	if ownB < 0 || !slices.Equal(bList[ownB].Names, []string{"a-tpl"}) || named != 2 {
		t.Fatalf("B lists %+v, want A's public a-tpl and its own a-tpl (%s)", bList, bTpl.SnapshotID)
	}
	if slices.ContainsFunc(aList, func(x api.TemplateInfo) bool { return x.TemplateID == bTpl.SnapshotID }) {
		t.Fatalf("A lists B's private template: %+v", aList)
	}
	var bGot api.TemplateWithBuilds
	json.Unmarshal(f.want(200, "GET", "/templates/a-tpl", "", asB...), &bGot)
	if !slices.Equal(bGot.Names, []string{"a-tpl"}) || bGot.TemplateID != bKeyOf || bGot.Public {
		t.Fatalf("B reads a-tpl: %+v, want its own (template ID its key, private)", bGot)
	}
	// A name that ends like a team's key is no template name.
	f.want(400, "POST", "/sandboxes/"+bsbB.SandboxID+"/snapshots", `{"name":"x.`+tb.TeamID+`","template":true}`, asB...)
	f.want(400, "POST", "/sandboxes/"+sb.SandboxID+"/snapshots", `{"name":"x.t0123456789abcdefghi","template":true}`)
	// B removes its own; A's stays, and B's name finds A's public one again.
	f.want(204, "DELETE", "/templates/a-tpl", "", asB...)
	f.want(200, "GET", "/templates/a-tpl", "")
	bFromA, from := made("a-tpl", asB...)
	if from != "a-tpl" {
		t.Fatalf("B's create from a-tpl after B removed its own started from %q, want A's public one", from)
	}
	for _, id := range []string{bFromOwn, bFromA} {
		f.want(204, "DELETE", "/sandboxes/"+id, "", asB...)
	}

	// An operator acts in B through the team header; a team key cannot.
	f.want(200, "GET", "/sandboxes/"+bsbB.SandboxID, "", api.TeamHeader, tb.TeamID)
	f.want(404, "GET", "/sandboxes/"+bsbB.SandboxID, "")
	f.want(403, "GET", "/v2/sandboxes", "", "X-API-KEY", bKey.Key, api.TeamHeader, store.DefaultTeam)
	f.want(404, "GET", "/v2/sandboxes", "", api.TeamHeader, "t-no-such-team")

	// Its usage: what it holds now.
	var info api.TeamInfo
	json.Unmarshal(f.want(200, "GET", "/teams/"+tb.TeamID, "", asB...), &info)
	if u := info.Usage; u == nil || u.Sandboxes != 2 || u.Snapshots != 1 || u.Volumes != 1 || u.VolumeBytes == 0 {
		t.Fatalf("team B's usage: %+v", info.Usage)
	}

	// A team that owns things is not removed; once it owns nothing it
	// is, and its keys stop working.
	f.want(201, "POST", "/sandboxes/"+bsbB.SandboxID+"/snapshots", `{"name":"b-tpl","template":true}`, asB...)
	if b := f.want(409, "DELETE", "/teams/"+tb.TeamID, ""); !strings.Contains(string(b), "b-tpl") {
		t.Fatalf("removing a team that owns a template: %s", b)
	}
	f.want(204, "DELETE", "/templates/b-tpl", "", asB...)
	if b := f.want(409, "DELETE", "/teams/"+tb.TeamID, ""); !strings.Contains(string(b), "sandboxes") {
		t.Fatalf("removing a team that owns sandboxes: %s", b)
	}
	for _, p := range []string{"/sandboxes/" + bsbB.SandboxID, "/sandboxes/" + fromTpl.SandboxID, "/templates/golden", "/secrets/token", "/volumes/data"} {
		f.want(204, "DELETE", p, "", asB...)
	}
	f.want(204, "DELETE", "/teams/"+tb.TeamID, "")
	f.want(401, "GET", "/v2/sandboxes", "", asB...)
	f.want(404, "GET", "/teams/"+tb.TeamID, "")
}

// A scoped key calls only its operations, creates only from templates
// its patterns match, and is refused the rest with a JSON 403.
func TestScopedKeys(t *testing.T) {
	f := newFnode(t)
	var ci api.CreatedKey
	json.Unmarshal(f.want(201, "POST", "/api-keys",
		`{"name":"ci","scope":{"operations":["sandboxes.create","sandboxes.read","sandboxes.control"],"templates":["ci-*"]}}`), &ci)
	asCI := []string{"X-API-KEY", ci.Key}
	f.want(403, "POST", "/v2/sandboxes", `{"templateID":"base"}`, asCI...)
	f.want(403, "POST", "/v2/sandboxes", `{}`, asCI...) // base, by default
	// A template it may use: made by the team, named ci-*.
	sb := f.create(`{"templateID":"base","timeout":300}`)
	f.want(201, "POST", "/sandboxes/"+sb.SandboxID+"/snapshots", `{"name":"ci-runner","template":true}`)
	var mine api.SandboxResponse
	json.Unmarshal(f.want(201, "POST", "/v2/sandboxes", `{"templateID":"ci-runner","timeout":60}`, asCI...), &mine)
	f.want(200, "GET", "/sandboxes/"+mine.SandboxID, "", asCI...)
	f.want(200, "GET", "/v2/sandboxes", "", asCI...)
	for _, r := range []teamRoute{
		{"POST", "/sandboxes/" + mine.SandboxID + "/snapshots", `{}`},
		{"POST", "/sandboxes/" + mine.SandboxID + "/fork", `{}`},
		{"GET", "/secrets", ""},
		{"POST", "/secrets", `{"name":"x","value":"y"}`},
		{"GET", "/snapshots", ""},
		{"DELETE", "/templates/ci-runner", ""},
		{"GET", "/api-keys", ""},
		{"GET", "/nodes", ""},
		{"GET", "/teams", ""},
	} {
		f.want(403, r.method, r.path, r.body, asCI...)
	}
	f.want(204, "DELETE", "/sandboxes/"+mine.SandboxID, "", asCI...)
	// Bad scopes are refused and make nothing.
	for _, body := range []string{
		`{"name":"x","scope":{"operations":["sandboxes.destroy"]}}`,
		`{"name":"x","scope":{"operations":[],"templates":["ci-["]}}`,
		`{"name":"x","role":"operator","teamID":"default"}`,
		`{"name":"x","expiresAt":"yesterday"}`,
		`{"name":"x","ttlSeconds":-1}`,
	} {
		f.want(400, "POST", "/api-keys", body)
	}
	var keys []api.KeyInfo
	json.Unmarshal(f.want(200, "GET", "/api-keys", ""), &keys)
	if len(keys) != 2 {
		t.Fatalf("keys after refused creates: %+v", keys)
	}
}

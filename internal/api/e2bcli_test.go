package api_test

import (
	"context"
	"encoding/json"
	"strings"
	"testing"

	"github.com/spore-run/spore/internal/api"
	"github.com/spore-run/spore/internal/control/controltest"
	"github.com/spore-run/spore/internal/envd"
	"github.com/spore-run/spore/internal/store"
)

// E2B's template update (the stock CLI's `e2b template publish` and
// `unpublish`): the flag is kept in the template's store row (other Spec
// keys kept) and read back by the template list, the alias answer and
// GET /templates/{templateID}; by name or snapshot ID; v1 and v2 routes;
// bad input answered with a 4xx that changes nothing. The same through
// the real CLI and a real build: test/sdk TestE2BCLITemplates.
func TestFastTemplatePublish(t *testing.T) { controltest.Each(t, testFastTemplatePublish) }

func testFastTemplatePublish(t *testing.T, _ controltest.Config) {
	f := newFnode(t)
	ctx := context.Background()
	sb := f.create(`{"templateID":"base","timeout":60}`)
	var sn api.SnapshotInfo
	json.Unmarshal(f.want(201, "POST", "/sandboxes/"+sb.SandboxID+"/snapshots", `{"name":"pub-app","template":true}`), &sn)
	f.want(204, "DELETE", "/sandboxes/"+sb.SandboxID, "")
	// Another key in the row's Spec must survive the flag's writes.
	if _, err := f.st.UpdateTemplate(ctx, "pub-app", func(tp *store.Template) error {
		tp.Spec = []byte(`{"other":{"k":1}}`)
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	listed := func() api.TemplateInfo {
		t.Helper()
		var list []api.TemplateInfo
		json.Unmarshal(f.want(200, "GET", "/templates?teamID=ignored", ""), &list)
		for _, ti := range list {
			if len(ti.Names) == 1 && ti.Names[0] == "pub-app" {
				return ti
			}
		}
		t.Fatalf("pub-app not listed: %+v", list)
		return api.TemplateInfo{}
	}
	public := func(want bool) {
		t.Helper()
		if got := listed().Public; got != want {
			t.Fatalf("list: public %v, want %v", got, want)
		}
		var alias api.AliasResponse
		json.Unmarshal(f.want(200, "GET", "/templates/aliases/pub-app", ""), &alias)
		if alias.Public != want || alias.TemplateID != sn.SnapshotID {
			t.Fatalf("alias: %+v, want public %v", alias, want)
		}
		var tb api.TemplateWithBuilds
		json.Unmarshal(f.want(200, "GET", "/templates/pub-app", ""), &tb)
		if tb.Public != want {
			t.Fatalf("GET /templates/pub-app: public %v, want %v", tb.Public, want)
		}
		tp, err := f.st.GetTemplate(ctx, "pub-app")
		if err != nil || !strings.Contains(string(tp.Spec), `"other":{"k":1}`) {
			t.Fatalf("row spec %s (%v): the other key is gone", tp.Spec, err)
		}
	}
	ti := listed()
	if ti.TemplateID != sn.SnapshotID || ti.Aliases[0] != "pub-app" || ti.Status != "ready" || ti.EnvdVersion != envd.Version ||
		ti.CreatedAt == "" || ti.UpdatedAt == "" || ti.CreatedBy != nil || ti.SpawnCount != 0 || ti.LastSpawnedAt != nil {
		t.Fatalf("listed: %+v", ti)
	}
	public(false)

	var res api.TemplateUpdateResponse
	json.Unmarshal(f.want(200, "PATCH", "/v2/templates/pub-app", `{"public":true}`), &res)
	if len(res.Names) != 1 || res.Names[0] != "pub-app" {
		t.Fatalf("publish answered names %v", res.Names)
	}
	public(true)
	// By snapshot ID (the list's templateID) and through v1.
	f.want(200, "PATCH", "/v2/templates/"+sn.SnapshotID, `{"public":false}`)
	public(false)
	f.want(200, "PATCH", "/templates/pub-app", `{"public":true}`)
	public(true)
	f.want(200, "PATCH", "/v2/templates/pub-app", `{}`) // nothing to change
	public(true)

	// Bad input changes nothing.
	f.want(400, "PATCH", "/v2/templates/pub-app", `{"public":"yes"}`)
	f.want(400, "PATCH", "/v2/templates/pub-app", `{"public":false,"other":1}`)
	f.want(400, "PATCH", "/v2/templates/..%2Fetc", `{"public":false}`)
	f.want(404, "PATCH", "/v2/templates/no-such-template", `{"public":false}`)
	f.want(404, "PATCH", "/templates/no-such-template", `{"public":false}`)
	// base is built into every node: no row keeps its flags.
	f.want(409, "PATCH", "/v2/templates/base", `{"public":true}`)
	public(true)
	var alias api.AliasResponse
	json.Unmarshal(f.want(200, "GET", "/templates/aliases/base", ""), &alias)
	if alias.Public {
		t.Fatal("base became public")
	}

	f.want(204, "DELETE", "/templates/pub-app", "")
	f.want(404, "PATCH", "/v2/templates/pub-app", `{"public":false}`)
}

package api_test

import (
	"archive/tar"
	"bytes"
	"context"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/spore-run/spore/internal/api"
	"github.com/spore-run/spore/internal/blob/local"
	"github.com/spore-run/spore/internal/build"
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

// The upload URL GET /templates/{templateID}/files/{hash} answers works
// with no headers (the E2B CLI's bundled SDK sends none: it expects a
// presigned URL), only for that template and hash, only while a build of
// the template waits for its files; a missing or wrong signature is a
// JSON 401 and stores nothing.
func TestSignedUpload(t *testing.T) {
	st := openStore(t) // holds the test key
	blobs, err := local.Open(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { blobs.Close() })
	bs := &build.Service{St: st, Blobs: blobs}
	srv := httptest.NewServer(api.New(api.Config{Store: st, Builds: bs}))
	t.Cleanup(srv.Close)
	// do sends a request with only the headers given (no API key unless
	// one is).
	do := func(method, url, body string, hdr ...string) (int, []byte) {
		t.Helper()
		req, _ := http.NewRequest(method, url, strings.NewReader(body))
		for i := 0; i+1 < len(hdr); i += 2 {
			req.Header.Set(hdr[i], hdr[i+1])
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, b
	}
	hash := strings.Repeat("ab", 32)
	other := strings.Repeat("cd", 32)
	var req api.BuildRequestResponse
	_, b := do("POST", srv.URL+"/v3/templates", `{"name":"signed-app"}`, "X-API-KEY", key)
	json.Unmarshal(b, &req)
	var link api.FileUpload
	code, b := do("GET", srv.URL+"/templates/signed-app/files/"+hash, "", "X-API-KEY", key)
	if json.Unmarshal(b, &link); code != 201 || link.Present || !strings.Contains(link.URL, "/signed?signature=") {
		t.Fatalf("upload link: %d %s", code, b)
	}
	tarball := tarOf(t, "hello.txt", "hi\n")
	// The signature's last digit changed (to another digit: a CI run once
	// "changed" a signature ending in 0 to 0, 1 in 16 runs).
	flipped := "0"
	if strings.HasSuffix(link.URL, "0") {
		flipped = "1"
	}
	// Tampered: another hash, another template, a changed or no signature.
	for _, u := range []string{
		strings.Replace(link.URL, hash, other, 1),
		strings.Replace(link.URL, "/signed-app/", "/other-app/", 1),
		link.URL[:len(link.URL)-1] + flipped,
		link.URL[:strings.IndexByte(link.URL, '?')],
	} {
		if code, b := do("PUT", u, tarball); code != 401 || !strings.Contains(string(b), `"code":401`) {
			t.Errorf("PUT %s: %d %s, want a JSON 401", u, code, b)
		}
	}
	for _, h := range []string{hash, other} {
		if present, _ := bs.FilesPresent(context.Background(), h); present {
			t.Fatalf("a refused upload stored %s", h)
		}
	}
	if code, b := do("PUT", link.URL, tarball); code != 201 {
		t.Fatalf("PUT the signed URL, no headers: %d %s", code, b)
	}
	if present, _ := bs.FilesPresent(context.Background(), hash); !present {
		t.Fatal("the signed upload stored nothing")
	}
	// Once no build waits (here: the template's builds are gone), the URL
	// is dead.
	if err := st.DeleteBuilds(context.Background(), "signed-app"); err != nil {
		t.Fatal(err)
	}
	if code, b := do("PUT", link.URL, tarball); code != 401 {
		t.Fatalf("PUT after the build stopped waiting: %d %s, want 401", code, b)
	}
	// With no build waiting the link is the authenticated route.
	_, b = do("GET", srv.URL+"/templates/signed-app/files/"+other, "", "X-API-KEY", key)
	if json.Unmarshal(b, &link); strings.Contains(link.URL, "/signed?") || link.Headers["X-API-Key"] != key {
		t.Fatalf("link with no waiting build: %s", b)
	}
}

func tarOf(t *testing.T, name, text string) string {
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	tw.WriteHeader(&tar.Header{Name: name, Mode: 0o644, Size: int64(len(text)), Typeflag: tar.TypeReg})
	tw.Write([]byte(text))
	if err := tw.Close(); err != nil {
		t.Fatal(err)
	}
	return buf.String()
}

package api_test

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/spore-run/spore/internal/api"
	"github.com/spore-run/spore/internal/store"
	"github.com/spore-run/spore/internal/volume"
)

// E2B's volume API: create (the stock SDK sends only a name: a shared
// volume of the default size), read by ID or name with its token, list by
// pages, delete; Spore's mode and size; bad input is a 4xx that changes
// nothing; a volume a sandbox holds is not deleted.
func TestVolumesAPI(t *testing.T) {
	f := newFnode(t)
	var v api.VolumeAndToken
	b := f.want(201, "POST", "/volumes", `{"name":"data"}`)
	if err := json.Unmarshal(b, &v); err != nil || !volume.IsID(v.VolumeID) || v.Name != "data" || v.Mode != store.VolumeShared ||
		v.SizeMB != volume.DefaultSize/volume.MiB || !strings.HasPrefix(v.Token, volume.TokenPrefix) || v.CreatedAt == "" {
		t.Fatalf("create = %s (%v)", b, err)
	}
	var x api.VolumeAndToken
	for _, ref := range []string{v.VolumeID, "data"} {
		b = f.want(200, "GET", "/volumes/"+ref, "")
		if json.Unmarshal(b, &x); x != v {
			t.Fatalf("GET /volumes/%s = %s, want %+v", ref, b, v)
		}
	}
	b = f.want(201, "POST", "/volumes", `{"name":"scratch","mode":"exclusive","sizeMB":64}`)
	var e api.VolumeAndToken
	if json.Unmarshal(b, &e); e.Mode != store.VolumeExclusive || e.SizeMB != 64 || e.Token == v.Token {
		t.Fatalf("exclusive create = %s", b)
	}

	// Refused, nothing stored.
	f.want(409, "POST", "/volumes", `{"name":"data"}`)
	for _, body := range []string{
		`{"name":""}`, `{"name":"../etc"}`, `{"name":"a/b"}`, `{"name":"-x"}`, `{"name":"` + strings.Repeat("n", 64) + `"}`,
		`{"name":"` + volume.NewID() + `"}`, // shaped like an ID
		`{"name":"ok","mode":"private"}`, `{"name":"ok","sizeMB":-1}`, `{"name":"ok","sizeMB":1}`,
		`{"name":"ok","sizeMB":99999999999999}`, `{"name":"ok","extra":1}`, `{"name":1}`,
	} {
		f.want(400, "POST", "/volumes", body)
	}
	f.want(404, "GET", "/volumes/nope", "")
	f.want(404, "GET", "/volumes/"+volume.NewID(), "")
	f.want(400, "GET", "/volumes/a%7Bb", "")
	f.want(404, "DELETE", "/volumes/nope", "")

	// Pages, oldest first; a list carries no tokens.
	for i := range 3 {
		f.want(201, "POST", "/volumes", fmt.Sprintf(`{"name":"v%d"}`, i))
	}
	b = f.want(200, "GET", "/volumes", "")
	var all []map[string]any
	if json.Unmarshal(b, &all); len(all) != 5 || all[0]["name"] != "data" || all[4]["name"] != "v2" {
		t.Fatalf("list = %s", b)
	}
	if strings.Contains(string(b), volume.TokenPrefix) {
		t.Fatalf("the list carries tokens: %s", b)
	}
	names := []string{}
	next := ""
	for range 10 {
		code, body, hdr := f.do("GET", "/volumes?limit=2&nextToken="+next, "")
		if code != 200 {
			t.Fatalf("page: %d %s", code, body)
		}
		var page []api.Volume
		json.Unmarshal(body, &page)
		for _, p := range page {
			names = append(names, p.Name)
		}
		if next = hdr.Get("X-Next-Token"); next == "" {
			break
		}
	}
	if got := strings.Join(names, ","); got != "data,scratch,v0,v1,v2" {
		t.Fatalf("pages = %s", got)
	}
	f.want(400, "GET", "/volumes?nextToken=garbage", "")

	// A volume a sandbox holds stays; once let go, it is deleted.
	ctx := context.Background()
	if _, err := f.st.UpdateVolume(ctx, store.DefaultTeam, "scratch", func(x *store.Volume) error { x.Holder = "isandbox"; return nil }); err != nil {
		t.Fatal(err)
	}
	if b := f.want(409, "DELETE", "/volumes/scratch", ""); !strings.Contains(string(b), "isandbox") {
		t.Fatalf("delete of a held volume: %s", b)
	}
	f.want(200, "GET", "/volumes/scratch", "")
	if _, err := f.st.UpdateVolume(ctx, store.DefaultTeam, "scratch", func(x *store.Volume) error { x.Holder = ""; return nil }); err != nil {
		t.Fatal(err)
	}
	f.want(204, "DELETE", "/volumes/scratch", "")
	f.want(204, "DELETE", "/volumes/"+v.VolumeID, "")
	f.want(404, "GET", "/volumes/data", "")
	f.want(404, "DELETE", "/volumes/data", "")
}

// The volume routes need an API key; the content routes, which the SDK
// calls with the volume's token, answer 501 (not served yet), never a
// 404 the SDK would read as "no such path".
func TestVolumeRoutesAuthAndContent(t *testing.T) {
	f := newFnode(t)
	for _, r := range []string{"GET /volumes", "POST /volumes", "GET /volumes/x", "DELETE /volumes/x"} {
		m, p, _ := strings.Cut(r, " ")
		if code, b := callKey(t, f.url, "", m, p, `{"name":"x"}`); code != 401 {
			t.Fatalf("%s without a key: %d %s", r, code, b)
		}
	}
	for _, r := range []string{"GET /volumecontent/v1/dir?path=/", "PUT /volumecontent/v1/file?path=/a", "DELETE /volumecontent/v1/path?path=/a"} {
		m, p, _ := strings.Cut(r, " ")
		if code, b := callKey(t, f.url, "", m, p, ""); code != 501 || !strings.Contains(string(b), "volumecontent") {
			t.Fatalf("%s: %d %s", r, code, b)
		}
	}
}

// Authorize: the volume's own token only; a wrong token, another volume's
// token and an unknown volume are all the same refusal.
func TestVolumeTokenAuthorizesOneVolume(t *testing.T) {
	f := newFnode(t)
	cat := volume.NewCatalog(f.st)
	ctx := context.Background()
	a, err := cat.Create(ctx, volume.CreateOptions{Name: "a"})
	if err != nil {
		t.Fatal(err)
	}
	b, err := cat.Create(ctx, volume.CreateOptions{Name: "b"})
	if err != nil {
		t.Fatal(err)
	}
	if got, err := cat.Authorize(ctx, a.ID, a.Token); err != nil || got.ID != a.ID {
		t.Fatalf("own token: %+v %v", got, err)
	}
	for _, c := range []struct{ ref, token string }{
		{a.ID, b.Token}, {a.ID, a.Token + "x"}, {a.ID, ""}, {a.ID, strings.TrimPrefix(a.Token, volume.TokenPrefix)},
		{volume.NewID(), a.Token}, {"../a", a.Token},
	} {
		if _, err := cat.Authorize(ctx, c.ref, c.token); err == nil || !strings.Contains(err.Error(), volume.ErrBadToken.Error()) {
			t.Fatalf("Authorize(%q, %q) = %v, want refused", c.ref, c.token, err)
		}
	}
}

// volumeMounts on create: every bad mount is refused with a 4xx naming
// what is wrong, before anything is made; a good one is reported by
// getInfo, and its volume is deleted only once the sandbox is gone.
func TestVolumeMountsRefused(t *testing.T) {
	f := newFnode(t)
	f.want(201, "POST", "/volumes", `{"name":"data"}`)
	f.want(201, "POST", "/volumes", `{"name":"other"}`)
	f.want(201, "POST", "/volumes", `{"name":"excl","mode":"exclusive"}`)
	for _, c := range []struct {
		code int
		body string
		says string
	}{
		{404, `{"volumeMounts":[{"name":"nope","path":"/data"}]}`, "no volume"},
		{400, `{"volumeMounts":[{"name":"../x","path":"/data"}]}`, "volume"},
		{400, `{"volumeMounts":[{"name":"data","path":"data"}]}`, "absolute"},
		{400, `{"volumeMounts":[{"name":"data","path":"/home/../etc"}]}`, "clean"},
		{400, `{"volumeMounts":[{"name":"data","path":"/proc/x"}]}`, "/proc"},
		{400, `{"volumeMounts":[{"name":"data","path":"/etc"}]}`, "system directory"},
		{400, `{"volumeMounts":[{"name":"data","path":"/run/spore/volumes/0"}]}`, "/run"},
		{400, `{"volumeMounts":[{"name":"data","path":"/"}]}`, "system directory"},
		{400, `{"volumeMounts":[{"name":"data","path":"/a"},{"name":"other","path":"/a/b"}]}`, "overlap"},
		{400, `{"volumeMounts":[{"name":"data","path":"/a"},{"name":"data","path":"/b"}]}`, "twice"},
		{400, `{"volumeMounts":[{"name":"data","path":"/a","size":1}]}`, "size"},
		{400, `{"volumeMounts":[{"name":"data","path":"/a"},{"name":"other","path":"/b"},{"name":"excl","path":"/c","readOnly":true},{"name":"data","path":"/d"},{"name":"data","path":"/e"}]}`, "at most"},
	} {
		code, b, _ := f.do("POST", "/v2/sandboxes", c.body)
		if code != c.code || !strings.Contains(string(b), c.says) {
			t.Errorf("create %s = %d %s, want %d saying %q", c.body, code, b, c.code, c.says)
		}
	}
	if b := f.want(200, "GET", "/v2/sandboxes", ""); string(b) != "[]\n" {
		t.Fatalf("refused creates left sandboxes: %s", b)
	}
	// A good one: getInfo reports the mounts; the volume stays while the
	// sandbox lives.
	sb := f.create(`{"volumeMounts":[{"name":"data","path":"/home/user/data"},{"name":"excl","path":"/ro","readOnly":true}]}`)
	var d api.SandboxDetail
	json.Unmarshal(f.want(200, "GET", "/sandboxes/"+sb.SandboxID, ""), &d)
	if len(d.VolumeMounts) != 2 || d.VolumeMounts[0] != (api.VolumeMount{Name: "data", Path: "/home/user/data"}) || !d.VolumeMounts[1].ReadOnly {
		t.Fatalf("getInfo volumeMounts %+v", d.VolumeMounts)
	}
	// GET /volumes/{id} reports its usage from its node; one no node
	// holds yet has none.
	var info api.VolumeAndToken
	json.Unmarshal(f.want(200, "GET", "/volumes/data", ""), &info)
	if info.Usage == nil || info.Usage.CapacityBytes != 10<<30 || info.Usage.UsedBytes != 0 {
		t.Fatalf("volume info's usage %+v", info.Usage)
	}
	if info.NodeID == "" || info.NodeID != d.ClientID {
		t.Fatalf("volume info names node %q, the sandbox runs on %q", info.NodeID, d.ClientID)
	}
	if b := f.want(200, "GET", "/volumes/other", ""); strings.Contains(string(b), "usage") || strings.Contains(string(b), "sporeNodeID") {
		t.Fatalf("usage or node of a volume no node holds: %s", b)
	}
	f.want(409, "DELETE", "/volumes/data", "")
	f.want(204, "DELETE", "/sandboxes/"+sb.SandboxID, "")
	f.want(204, "DELETE", "/volumes/data", "")
	// An exclusive volume has one read-write holder: a second is a 409
	// naming it, and makes nothing; once the holder is gone, another may.
	holder := f.create(`{"volumeMounts":[{"name":"excl","path":"/work"}]}`)
	if code, b, _ := f.do("POST", "/v2/sandboxes", `{"volumeMounts":[{"name":"excl","path":"/work"}]}`); code != 409 || !strings.Contains(string(b), "exclusive") || !strings.Contains(string(b), holder.SandboxID) {
		t.Fatalf("a second read-write mount of an exclusive volume = %d %s", code, b)
	}
	var list []json.RawMessage
	if json.Unmarshal(f.want(200, "GET", "/v2/sandboxes", ""), &list); len(list) != 1 {
		t.Fatalf("the refused create left sandboxes: %s", list)
	}
	f.want(204, "DELETE", "/sandboxes/"+holder.SandboxID, "")
	next := f.create(`{"volumeMounts":[{"name":"excl","path":"/work"}]}`)
	f.want(204, "DELETE", "/sandboxes/"+next.SandboxID, "")
}

// The content API with a volume's token (Authorization: Bearer, as the
// stock SDK sends it): its own volume only; no token, a wrong one, an API
// key and another volume's token are the same 401, and reach no file.
func TestVolumeContentNeedsTheVolumesToken(t *testing.T) {
	f := newFnode(t)
	dir := t.TempDir()
	srv := httptest.NewServer(api.New(api.Config{Control: f.ctl, Store: f.st, VolumeContent: func(_ context.Context, v store.Volume) (*os.Root, error) {
		os.MkdirAll(filepath.Join(dir, v.ID), 0o755)
		return os.OpenRoot(filepath.Join(dir, v.ID))
	}}))
	t.Cleanup(srv.Close)
	var a, b api.VolumeAndToken
	json.Unmarshal(f.want(201, "POST", "/volumes", `{"name":"a"}`), &a)
	json.Unmarshal(f.want(201, "POST", "/volumes", `{"name":"b"}`), &b)
	call := func(method, path, auth, body string) (int, string) {
		req, _ := http.NewRequest(method, srv.URL+path, strings.NewReader(body))
		if auth != "" {
			req.Header.Set("Authorization", auth)
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		out, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(out)
	}
	put := "/volumecontent/" + a.VolumeID + "/file?path=/notes.txt"
	for _, auth := range []string{"", "Bearer ", "Bearer " + b.Token, "Bearer " + a.Token + "x", "Bearer " + key, a.Token} {
		if code, out := call("PUT", put, auth, "x"); code != 401 {
			t.Fatalf("PUT with %q: %d %s", auth, code, out)
		}
	}
	if code, out := call("PUT", "/volumecontent/"+volume.NewID()+"/file?path=/x", "Bearer "+a.Token, "x"); code != 401 {
		t.Fatalf("an unknown volume: %d %s", code, out)
	}
	if ents, _ := os.ReadDir(dir); len(ents) != 0 {
		t.Fatalf("refused requests reached a volume: %v", ents)
	}
	if code, out := call("PUT", put, "Bearer "+a.Token, "mine"); code != 200 || !strings.Contains(out, `"name":"notes.txt"`) {
		t.Fatalf("PUT with the token: %d %s", code, out)
	}
	// By ID only: a name is its team's, and the content API names no team
	// (the client resolves a name through GET /volumes/{name}).
	if code, out := call("GET", "/volumecontent/"+a.VolumeID+"/file?path=/notes.txt", "Bearer "+a.Token, ""); code != 200 || out != "mine" {
		t.Fatalf("GET with the token: %d %s", code, out)
	}
	if code, out := call("GET", "/volumecontent/a/file?path=/notes.txt", "Bearer "+a.Token, ""); code != 401 {
		t.Fatalf("GET by name with the token: %d %s, want 401", code, out)
	}
	if code, out := call("GET", "/volumecontent/"+b.VolumeID+"/file?path=/notes.txt", "Bearer "+a.Token, ""); code != 401 {
		t.Fatalf("a's token on b: %d %s", code, out)
	}
}

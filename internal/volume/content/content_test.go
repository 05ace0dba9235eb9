package content_test

import (
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/spore-run/spore/internal/errdefs"
	"github.com/spore-run/spore/internal/volume/content"
)

type client struct {
	t   *testing.T
	url string
}

func (c client) do(method, path, body string) (int, []byte) {
	c.t.Helper()
	req, _ := http.NewRequest(method, c.url+path, strings.NewReader(body))
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		c.t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, b
}

func (c client) want(code int, method, path, body string) []byte {
	c.t.Helper()
	got, b := c.do(method, path, body)
	if got != code {
		c.t.Fatalf("%s %s = %d %s, want %d", method, path, got, b, code)
	}
	return b
}

func serve(t *testing.T) (client, string) {
	dir := t.TempDir()
	mux := http.NewServeMux()
	h := content.Handler(func(r *http.Request, id string) (*os.Root, error) {
		if id != "vol" {
			return nil, content.StatusError(404, "no volume "+id)
		}
		return os.OpenRoot(dir)
	})
	for _, p := range content.Routes {
		mux.HandleFunc(p, h)
	}
	srv := httptest.NewServer(mux)
	t.Cleanup(srv.Close)
	return client{t, srv.URL + "/volumecontent/vol"}, dir
}

// The content API over a directory: write (parents with force), read,
// list with depth, make directories, stat, change mode, remove; every
// path resolved inside the volume: '..' and a link out of it refused.
func TestContentAPI(t *testing.T) {
	c, dir := serve(t)
	var e content.EntryStat
	b := c.want(200, "PUT", "/file?path=/a/b/hello.txt&force=true&mode=384", "hello volume")
	if json.Unmarshal(b, &e); e.Type != "file" || e.Path != "/a/b/hello.txt" || e.Name != "hello.txt" || e.Size != 12 || e.Mode != 0o600 || e.Mtime == "" {
		t.Fatalf("write = %s", b)
	}
	if got, _ := os.ReadFile(filepath.Join(dir, "a/b/hello.txt")); string(got) != "hello volume" {
		t.Fatalf("on disk: %q", got)
	}
	if b := c.want(200, "GET", "/file?path=a/b/hello.txt", ""); string(b) != "hello volume" {
		t.Fatalf("read = %q", b)
	}
	c.want(200, "PUT", "/file?path=/a/b/hello.txt", "replaced")
	if b := c.want(200, "GET", "/file?path=/a/b/hello.txt", ""); string(b) != "replaced" {
		t.Fatalf("read after overwrite = %q", b)
	}
	c.want(404, "PUT", "/file?path=/no/parent.txt", "x") // no force: the parent must exist
	c.want(400, "PUT", "/file?path=/a", "x")             // a directory
	c.want(400, "PUT", "/file?path=/", "x")
	if ents, _ := os.ReadDir(filepath.Join(dir, "a/b")); len(ents) != 1 {
		t.Fatalf("an upload left files: %v", ents)
	}

	var list []content.EntryStat
	json.Unmarshal(c.want(200, "GET", "/dir?path=/", ""), &list)
	if len(list) != 1 || list[0].Name != "a" || list[0].Type != "directory" {
		t.Fatalf("list depth 1 = %+v", list)
	}
	json.Unmarshal(c.want(200, "GET", "/dir?path=/&depth=3", ""), &list)
	if len(list) != 3 {
		t.Fatalf("list depth 3 = %+v", list)
	}
	c.want(400, "GET", "/dir?path=/a/b/hello.txt", "")
	c.want(404, "GET", "/dir?path=/missing", "")
	c.want(400, "GET", "/dir?path=/&depth=0", "")

	c.want(404, "POST", "/dir?path=/x/y", "")
	if json.Unmarshal(c.want(201, "POST", "/dir?path=/x/y&force=true", ""), &e); e.Type != "directory" || e.Path != "/x/y" {
		t.Fatalf("mkdir = %+v", e)
	}
	c.want(409, "POST", "/dir?path=/x/y", "")
	c.want(201, "POST", "/dir?path=/x/y&force=true", "")
	c.want(400, "POST", "/dir?path=/x/z&mode=99999", "")

	if json.Unmarshal(c.want(200, "GET", "/path?path=/x", ""), &e); e.Type != "directory" {
		t.Fatalf("stat = %+v", e)
	}
	c.want(404, "GET", "/path?path=/nope", "")
	if json.Unmarshal(c.want(200, "PATCH", "/path?path=/x", `{"mode":448}`), &e); e.Mode != 0o700 {
		t.Fatalf("chmod = %+v", e)
	}
	c.want(400, "PATCH", "/path?path=/x", `{"mode":448,"owner":"me"}`)
	c.want(404, "PATCH", "/path?path=/nope", `{"mode":448}`)

	c.want(204, "DELETE", "/path?path=/x", "")
	c.want(404, "GET", "/path?path=/x/y", "")
	c.want(404, "DELETE", "/path?path=/x", "")
	c.want(400, "DELETE", "/path?path=/", "")

	// Nothing outside the volume: '..', and a link out of it.
	outside := t.TempDir()
	os.WriteFile(filepath.Join(outside, "secret"), []byte("not yours"), 0o644)
	os.Symlink(outside, filepath.Join(dir, "out"))
	os.Symlink("/etc", filepath.Join(dir, "etc"))
	for _, p := range []string{"/file?path=../secret", "/file?path=/a/../../secret", "/file?path=/out/secret", "/file?path=/etc/hostname", "/dir?path=/out"} {
		code, b := c.do("GET", p, "")
		if code != 400 && code != 404 || strings.Contains(string(b), "not yours") {
			t.Fatalf("GET %s = %d %s", p, code, b)
		}
	}
	if code, _ := c.do("PUT", "/file?path=/out/planted", "x"); code < 400 {
		t.Fatal("a write through a link out of the volume passed")
	}
	if _, err := os.Stat(filepath.Join(outside, "planted")); err == nil {
		t.Fatal("a file was planted outside the volume")
	}
	if json.Unmarshal(c.want(200, "GET", "/path?path=/out", ""), &e); e.Type != "symlink" || e.Target != outside {
		t.Fatalf("stat of a link = %+v", e)
	}
	// Another volume of the opener: its answer.
	if code, b := (client{t, strings.TrimSuffix(c.url, "/vol") + "/other"}).do("GET", "/dir?path=/", ""); code != 404 || !strings.Contains(string(b), "no volume") {
		t.Fatalf("unknown volume: %d %s", code, b)
	}
}

// Behind a prefix (a node serves it so, not with ServeMux patterns): the
// volume and the route come from the path; a bad path is a 404, an
// opener's kinded error its status.
func TestHandlerBehindAPrefix(t *testing.T) {
	dir := t.TempDir()
	h := content.Handler(func(r *http.Request, id string) (*os.Root, error) {
		if id != "vol" {
			return nil, errdefs.NotFoundf("volume %s", id)
		}
		return os.OpenRoot(dir)
	})
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if strings.HasPrefix(r.URL.Path, "/volumecontent/") {
			h(w, r)
		}
	}))
	t.Cleanup(srv.Close)
	c := client{t, srv.URL}
	c.want(200, "PUT", "/volumecontent/vol/file?path=/x", "behind a prefix")
	if b := c.want(200, "GET", "/volumecontent/vol/file?path=/x", ""); string(b) != "behind a prefix" {
		t.Fatalf("read = %q", b)
	}
	c.want(404, "GET", "/volumecontent/other/file?path=/x", "")
	c.want(404, "GET", "/volumecontent/vol/file/extra?path=/x", "")
	c.want(404, "GET", "/volumecontent//file?path=/x", "")
	c.want(404, "GET", "/volumecontent/vol/nothing?path=/x", "")
}

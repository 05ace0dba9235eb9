package api_test

import (
	"bufio"
	"context"
	"crypto/sha256"
	"encoding/base64"
	"encoding/json"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/spore-run/spore/internal/api"
	"github.com/spore-run/spore/internal/apikey"
	"github.com/spore-run/spore/internal/control"
	"github.com/spore-run/spore/internal/errdefs"
	"github.com/spore-run/spore/internal/ids"
	"github.com/spore-run/spore/internal/node"
	"github.com/spore-run/spore/internal/nodeapi/local"
	"github.com/spore-run/spore/internal/proxy"
	"github.com/spore-run/spore/internal/runtime"
	"github.com/spore-run/spore/internal/store"
	"github.com/spore-run/spore/internal/store/sqlite"
	"github.com/spore-run/spore/internal/testenv"
)

const key = "test-api-key"

// The OpenAPI document describes exactly the routes the server has.
func TestOpenAPIMatchesRoutes(t *testing.T) {
	doc := map[string]bool{}
	path := ""
	inPaths := false
	for _, line := range strings.Split(string(api.OpenAPI()), "\n") {
		switch {
		case line == "paths:":
			inPaths = true
		case inPaths && len(line) > 0 && line[0] != ' ':
			inPaths = false
		case inPaths && strings.HasPrefix(line, "  /") && strings.HasSuffix(line, ":"):
			path = strings.TrimSuffix(strings.TrimSpace(line), ":")
		case inPaths && strings.HasPrefix(line, "    ") && !strings.HasPrefix(line, "     "):
			m := strings.TrimSuffix(strings.TrimSpace(line), ":")
			switch m {
			case "get", "post", "put", "delete", "patch":
				doc[strings.ToUpper(m)+" "+path] = true
			}
		}
	}
	routes := api.Routes()
	for r := range routes {
		if !doc[r] {
			t.Errorf("route %s is not in openapi.yaml", r)
		}
	}
	for d := range doc {
		if _, ok := routes[d]; !ok {
			t.Errorf("openapi.yaml documents %s, which the server does not serve", d)
		}
	}
	if len(doc) < 20 {
		t.Fatalf("parsed only %d operations from the document", len(doc))
	}
}

func openStore(t testing.TB) store.Store {
	st, err := sqlite.Open(context.Background(), filepath.Join(t.TempDir(), "spore.db"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { st.Close() })
	st.AddAPIKey(context.Background(), store.APIKey{ID: "k", Hash: apikey.Hash(key), CreatedAt: time.Now()})
	return st
}

// Every route but the health check and the document refuses a missing or
// wrong key, with a JSON 401.
func TestAuthOnEveryRoute(t *testing.T) {
	srv := httptest.NewServer(api.New(api.Config{Store: openStore(t)}))
	defer srv.Close()
	for r, needsKey := range api.Routes() {
		method, path, _ := strings.Cut(r, " ")
		path = strings.NewReplacer("{sandboxID}", "i0000000000000000000", "{templateID}", "base", "{file}", "app.js").Replace(path)
		for _, k := range []string{"", "wrong-key"} {
			req, _ := http.NewRequest(method, srv.URL+path, strings.NewReader("{}"))
			if k != "" {
				req.Header.Set("X-API-KEY", k)
			}
			resp, err := http.DefaultClient.Do(req)
			if err != nil {
				t.Fatal(err)
			}
			var e api.ErrorBody
			json.NewDecoder(resp.Body).Decode(&e)
			resp.Body.Close()
			if needsKey && (resp.StatusCode != 401 || e.Code != 401 || e.Message == "") {
				t.Errorf("%s with key %q = %d %+v, want a JSON 401", r, k, resp.StatusCode, e)
			}
			if r == api.SignedUploadRoute { // public, but its credential is a signature
				if resp.StatusCode != 401 || e.Code != 401 {
					t.Errorf("%s without a signature = %d %+v, want a JSON 401", r, resp.StatusCode, e)
				}
				continue
			}
			if !needsKey && resp.StatusCode != 200 {
				t.Errorf("%s (public) = %d", r, resp.StatusCode)
			}
		}
	}
}

// harness is a full API over a real node.
type harness struct {
	t   testing.TB
	url string
	ctl *control.Service
	st  store.Store
	n   *node.Node
	now time.Time
	// apiLog holds what the API logged, as JSON lines.
	apiLog *syncBuffer
}

func newHarness(t testing.TB) *harness {
	testenv.RequireRoot(t)
	dir := t.TempDir()
	cgroup := "/spore-test-" + ids.New('g')
	ctx := context.Background()
	log := slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn}))
	n, err := node.Open(ctx, node.Config{DataDir: dir, RootFSDir: testenv.RootFSDir(t), Runsc: testenv.Runsc(t),
		EnvdBinary: testenv.EnvdBinary(t), NetPrefix: "spi", CgroupParent: cgroup, Logger: log})
	if err != nil {
		t.Fatal(err)
	}
	h := &harness{t: t, n: n, now: time.Now()}
	t.Cleanup(func() {
		cctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
		defer cancel()
		for _, sb := range n.Engine.List(cctx) {
			if err := n.Engine.Kill(cctx, sb.ID); err != nil && !errdefs.IsNotFound(err) {
				t.Errorf("cleanup: %v", err)
			}
		}
		n.Close()
		n.Runtime.Purge(cctx)
		n.Net.Sweep(cctx, nil)
		n.Net.RemoveHostRules()
	})
	if err := n.EnsureTemplates(ctx); err != nil {
		t.Fatal(err)
	}
	st := openStore(t)
	h.st = st
	h.ctl = control.New(control.Config{Store: st, Nodes: control.Nodes{"local": local.New(n.Engine, local.Config{ID: "local"})}, Logger: log, Now: func() time.Time { return h.now }})
	t.Cleanup(h.ctl.Close)
	h.apiLog = &syncBuffer{}
	apiLog := slog.New(slog.NewMultiHandler(log.Handler(), slog.NewJSONHandler(h.apiLog, nil)))
	srv := httptest.NewServer(api.New(api.Config{Control: h.ctl, Store: st, Proxy: proxy.New(h.ctl, apikey.NewChecker(st).Check, apiLog), Logger: apiLog}))
	t.Cleanup(srv.Close)
	h.url = srv.URL
	return h
}

func (h *harness) do(method, path, body string, hdr ...string) (int, []byte, http.Header) {
	h.t.Helper()
	return call(h.t, h.url, method, path, body, hdr...)
}

// call sends one API request with the test key to the server at base;
// hdr holds name, value pairs ("Host" sets the request's host).
func call(t testing.TB, base, method, path, body string, hdr ...string) (int, []byte, http.Header) {
	t.Helper()
	req, _ := http.NewRequest(method, base+path, strings.NewReader(body))
	req.Header.Set("X-API-KEY", key)
	req.Header.Set("Content-Type", "application/json")
	for i := 0; i+1 < len(hdr); i += 2 {
		if hdr[i] == "Host" {
			req.Host = hdr[i+1]
		} else {
			req.Header.Set(hdr[i], hdr[i+1])
		}
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, b, resp.Header
}

func (h *harness) create(body string) api.SandboxResponse {
	h.t.Helper()
	code, b, _ := h.do("POST", "/v2/sandboxes", body)
	if code != 201 {
		h.t.Fatalf("create %s: %d %s", body, code, b)
	}
	var r api.SandboxResponse
	json.Unmarshal(b, &r)
	return r
}

func (h *harness) count() int {
	_, b, _ := h.do("GET", "/v2/sandboxes", "")
	var l []any
	json.Unmarshal(b, &l)
	return len(l)
}

// Bad input: a JSON 4xx with a clear message, and nothing changes.
func TestBadInput(t *testing.T) {
	h := newHarness(t)
	sb := h.create(`{"templateID":"base"}`)
	before := h.count()
	big := `{"templateID":"base","metadata":{"k":"` + strings.Repeat("x", api.MaxBody) + `"}}`
	cases := []struct {
		method, path, body string
		want               int
	}{
		{"POST", "/v2/sandboxes", `{not json`, 400},
		{"POST", "/v2/sandboxes", `{"timeout":"soon"}`, 400},
		{"POST", "/v2/sandboxes", `{"timeout":-5}`, 400},
		{"POST", "/v2/sandboxes", `{"timeout":99999999}`, 400},
		{"POST", "/v2/sandboxes", `{"templateID":"no-such-template"}`, 404},
		{"POST", "/v2/sandboxes", `{"templateID":"../../etc"}`, 400},
		{"POST", "/v2/sandboxes", `{"metadata":{"":"x"}}`, 400},
		{"POST", "/v2/sandboxes", `{"network":{"denyOut":["not-a-cidr"]}}`, 400},
		{"POST", "/v2/sandboxes", big, 413},
		{"GET", "/sandboxes/..%2F..%2Fetc", "", 400},
		{"GET", "/sandboxes/UPPER", "", 400},
		{"GET", "/sandboxes/i0000000000000000000", "", 404},
		{"DELETE", "/sandboxes/i0000000000000000000", "", 404},
		{"POST", "/sandboxes/i0000000000000000000/pause", "", 404},
		{"POST", "/sandboxes/" + sb.SandboxID + "/fork", `{"count":0}`, 400},
		{"POST", "/sandboxes/" + sb.SandboxID + "/fork", `{"count":101}`, 400},
		{"POST", "/sandboxes/" + sb.SandboxID + "/fork", `{"count":"3"}`, 400},
		{"POST", "/sandboxes/" + sb.SandboxID + "/rollback", `{}`, 400},
		{"POST", "/sandboxes/" + sb.SandboxID + "/rollback", `{"snapshotID":"s0000000000000000000"}`, 404},
		{"POST", "/sandboxes/" + sb.SandboxID + "/snapshots", `{"name":"../x"}`, 400},
		{"POST", "/sandboxes/" + sb.SandboxID + "/timeout", `{}`, 400},
		{"POST", "/sandboxes/" + sb.SandboxID + "/timeout", `{"timeout":-1}`, 400},
		{"POST", "/sandboxes/" + sb.SandboxID + "/resume", `{}`, 409},
		{"PUT", "/sandboxes/" + sb.SandboxID + "/network", `{"allowOut":["300.1.1.1"]}`, 400},
		{"GET", "/v2/sandboxes?nextToken=garbage", "", 400},
		{"GET", "/v2/sandboxes?limit=0", "", 400},
		{"GET", "/v2/sandboxes?limit=abc", "", 400},
		{"GET", "/v2/sandboxes?state=exploded", "", 400},
		{"GET", "/v2/sandboxes?metadata=%25zz", "", 400},
		{"GET", "/snapshots?nextToken=%21%21", "", 400},
		{"DELETE", "/templates/s0000000000000000000", "", 404},
		{"DELETE", "/templates/%2E%2E", "", 400},
		{"DELETE", "/templates/a%2Fb", "", 400},
		{"GET", "/no/such/route", "", 404},
	}
	for _, c := range cases {
		code, b, _ := h.do(c.method, c.path, c.body)
		var e api.ErrorBody
		if code != c.want || json.Unmarshal(b, &e) != nil || e.Code != c.want || e.Message == "" {
			t.Errorf("%s %s %.60s = %d %.200s, want a JSON %d", c.method, c.path, c.body, code, b, c.want)
		}
	}
	if after := h.count(); after != before {
		t.Fatalf("bad input changed the sandboxes: %d -> %d", before, after)
	}
	if code, _, _ := h.do("GET", "/sandboxes/"+sb.SandboxID, ""); code != 200 {
		t.Fatalf("sandbox after bad input: %d", code)
	}
}

// Timeouts kill, or hibernate with autoPause; connect resumes; pause is
// 409 when paused; connect only extends the timeout.
func TestLifecycle(t *testing.T) {
	h := newHarness(t)
	killMe := h.create(`{"timeout":10}`)
	keepMe := h.create(`{"timeout":10,"autoPause":true}`)
	long := h.create(`{"timeout":3600}`)
	h.now = h.now.Add(11 * time.Second)
	h.ctl.ReapExpired(context.Background())
	if code, _, _ := h.do("GET", "/sandboxes/"+killMe.SandboxID, ""); code != 404 {
		t.Fatalf("expired sandbox still there: %d", code)
	}
	if _, err := h.n.Engine.Get(context.Background(), killMe.SandboxID); !errdefs.IsNotFound(err) {
		t.Fatalf("expired sandbox still on the node: %v", err)
	}
	_, b, _ := h.do("GET", "/sandboxes/"+keepMe.SandboxID, "")
	var d api.SandboxDetail
	json.Unmarshal(b, &d)
	if d.State != "paused" || d.SporeState != "hibernated" {
		t.Fatalf("autoPause sandbox after timeout: %s", b)
	}
	if code, b, _ := h.do("GET", "/sandboxes/"+long.SandboxID, ""); code != 200 || !strings.Contains(string(b), `"state":"running"`) {
		t.Fatalf("unexpired sandbox: %d %s", code, b)
	}
	// Connect resumes (201), then is a no-op (200).
	if code, b, _ := h.do("POST", "/v2/sandboxes/"+keepMe.SandboxID+"/connect", `{"timeout":60}`); code != 201 {
		t.Fatalf("connect to hibernated: %d %s", code, b)
	}
	if code, _, _ := h.do("POST", "/sandboxes/"+keepMe.SandboxID+"/connect", `{}`); code != 200 {
		t.Fatalf("connect to running: %d", code)
	}
	// Pause: 204, then 409.
	if code, _, _ := h.do("POST", "/sandboxes/"+long.SandboxID+"/pause", `{}`); code != 204 {
		t.Fatalf("pause: %d", code)
	}
	if code, _, _ := h.do("POST", "/sandboxes/"+long.SandboxID+"/pause", `{}`); code != 409 {
		t.Fatalf("second pause: %d", code)
	}
	// Connect with a shorter timeout does not shorten it.
	_, b, _ = h.do("GET", "/sandboxes/"+long.SandboxID, "")
	json.Unmarshal(b, &d)
	end1 := d.EndAt
	if code, _, _ := h.do("POST", "/sandboxes/"+long.SandboxID+"/connect", `{"timeout":5}`); code != 201 {
		t.Fatalf("connect to paused: %d", code)
	}
	_, b, _ = h.do("GET", "/sandboxes/"+long.SandboxID, "")
	json.Unmarshal(b, &d)
	if d.EndAt != end1 || d.State != "running" {
		t.Fatalf("connect shortened the timeout or did not resume: %s -> %s, %s", end1, d.EndAt, d.State)
	}
	// Metrics of a running sandbox.
	code, b, _ := h.do("GET", "/sandboxes/"+long.SandboxID+"/metrics", "")
	var ms []control.Metric
	json.Unmarshal(b, &ms)
	if code != 200 || len(ms) != 1 || ms[0].MemTotal == 0 || ms[0].DiskTotal == 0 {
		t.Fatalf("metrics: %d %s", code, b)
	}
}

// The proxy: by header and by Host, streaming; JSON 502 for unknown and
// paused sandboxes; presigned URLs find their sandbox.
func TestProxy(t *testing.T) {
	h := newHarness(t)
	sb := h.create(`{"templateID":"code-interpreter-v1"}`)
	if code, _, _ := h.do("GET", "/health", "", "E2b-Sandbox-Id", sb.SandboxID); code != 204 {
		t.Fatalf("envd health by header: %d", code)
	}
	if code, _, _ := h.do("GET", "/health", "", "Host", "49983-"+sb.SandboxID+".spore.localhost"); code != 204 {
		t.Fatalf("envd health by Host: %d", code)
	}
	// Streaming: the code interpreter's NDJSON arrives line by line.
	req, _ := http.NewRequest("POST", h.url+"/execute", strings.NewReader(`{"code":"import time\nfor i in range(3):\n    print(i, flush=True)\n    time.sleep(0.3)"}`))
	req.Header.Set("E2b-Sandbox-Id", sb.SandboxID)
	req.Header.Set("E2b-Sandbox-Port", "49999")
	req.Header.Set("X-Access-Token", sb.EnvdAccessToken)
	t0 := time.Now()
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	first, _ := bufio.NewReader(resp.Body).ReadString('\n')
	firstAt := time.Since(t0)
	io.Copy(io.Discard, resp.Body)
	total := time.Since(t0)
	resp.Body.Close()
	if !strings.Contains(first, `"0\n"`) || firstAt > total/2 {
		t.Fatalf("first line %q after %v of %v: not streamed", first, firstAt, total)
	}
	// Presigned download: no sandbox header, no token.
	h.do("POST", "/files?path=/home/user/p.txt", "presigned", "E2b-Sandbox-Id", sb.SandboxID, "X-Access-Token", sb.EnvdAccessToken, "Content-Type", "application/octet-stream")
	sum := sha256.Sum256([]byte("/home/user/p.txt:read::" + sb.EnvdAccessToken))
	sig := "v1_" + strings.TrimRight(base64.StdEncoding.EncodeToString(sum[:]), "=")
	r2, _ := http.Get(h.url + "/files?path=/home/user/p.txt&signature=" + url.QueryEscape(sig))
	body, _ := io.ReadAll(r2.Body)
	r2.Body.Close()
	if r2.StatusCode != 200 || string(body) != "presigned" {
		t.Fatalf("presigned download: %d %s", r2.StatusCode, body)
	}
	r3, _ := http.Get(h.url + "/files?path=/home/user/p.txt&signature=v1_forged")
	r3.Body.Close()
	if r3.StatusCode != 401 {
		t.Fatalf("forged signature: %d", r3.StatusCode)
	}
	// 502 for unknown and paused sandboxes.
	for _, c := range []struct{ id, setup string }{{"i0000000000000000000", ""}, {sb.SandboxID, "pause"}} {
		if c.setup == "pause" {
			h.do("POST", "/sandboxes/"+c.id+"/pause", "")
		}
		code, b, _ := h.do("GET", "/health", "", "E2b-Sandbox-Id", c.id)
		var e api.ErrorBody
		if code != 502 || json.Unmarshal(b, &e) != nil || e.Code != 502 {
			t.Fatalf("proxy to %s (%s) = %d %s, want JSON 502", c.id, c.setup, code, b)
		}
	}
	if code, _, _ := h.do("GET", "/health", "", "E2b-Sandbox-Id", "../etc"); code != 400 {
		t.Fatalf("malformed sandbox header: %d", code)
	}
	if code, _, _ := h.do("GET", "/health", "", "E2b-Sandbox-Id", sb.SandboxID, "E2b-Sandbox-Port", "99999"); code != 400 {
		t.Fatalf("bad port header: %d", code)
	}

}

// echoServer is a user's app in a sandbox: it answers every GET with the
// request's headers, as JSON pairs.
const echoServer = `import http.server, json
class H(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        b = json.dumps(list(self.headers.items())).encode()
        self.send_response(200)
        self.send_header("Content-Length", str(len(b)))
        self.end_headers()
        self.wfile.write(b)
    def log_message(self, *a):
        pass
http.server.ThreadingHTTPServer(("0.0.0.0", 8000), H).serve_forever()
`

// The API key never reaches a sandbox: a server in one that echoes its
// request headers, reached through the proxy by header and by Host with
// the key in X-API-KEY and Authorization, sees neither, while the
// client's own headers (a custom one, its own Bearer token) arrive, and
// envd still takes its Basic user and access token.
func TestProxyKeepsAPIKeyOut(t *testing.T) {
	h := newHarness(t)
	sb := h.create(`{"templateID":"base"}`)
	ctx := context.Background()
	var out strings.Builder
	code, err := h.n.Engine.Exec(ctx, sb.SandboxID, runtime.ExecSpec{Args: []string{"/bin/bash", "-c",
		"cat > /tmp/echo.py <<'PY'\n" + echoServer + "PY\nnohup python3 /tmp/echo.py >/tmp/echo.log 2>&1 &"}, Stdout: &out, Stderr: &out})
	if err != nil || code != 0 {
		t.Fatalf("start the echo server: %d %v %s", code, err, out.String())
	}
	echoed := func(hdr ...string) string {
		t.Helper()
		deadline := time.Now().Add(30 * time.Second)
		for {
			code, b, _ := h.do("GET", "/", "", hdr...)
			if code == 200 {
				return string(b)
			}
			if time.Now().After(deadline) {
				t.Fatalf("echo server through the proxy: %d %s", code, b)
			}
			time.Sleep(100 * time.Millisecond)
		}
	}
	routes := [][]string{
		{"E2b-Sandbox-Id", sb.SandboxID, "E2b-Sandbox-Port", "8000"},
		{"Host", "8000-" + sb.SandboxID + ".spore.localhost"},
	}
	for _, route := range routes {
		// h.do sends the key in X-API-KEY on every request.
		got := echoed(append(route, "Authorization", "Bearer "+key, "X-Custom", "arrives")...)
		if strings.Contains(got, key) {
			t.Fatalf("the sandbox saw the API key (route %v): %s", route, got)
		}
		if !strings.Contains(got, `["X-Custom", "arrives"]`) {
			t.Fatalf("the client's own header did not arrive (route %v): %s", route, got)
		}
		if got := echoed(append(route, "Authorization", "Bearer the-app-s-own")...); !strings.Contains(got, `["Authorization", "Bearer the-app-s-own"]`) {
			t.Fatalf("the app's own Authorization did not arrive (route %v): %s", route, got)
		}
	}
	// envd: Basic selects the user, X-Access-Token admits; the key beside
	// them changes nothing. The command prints who runs it.
	start := `{"process":{"cmd":"/usr/bin/id","args":["-un"]}}`
	frame := string([]byte{0, 0, 0, 0, byte(len(start))}) + start
	for _, user := range []string{"root", "user"} {
		code, b, _ := h.do("POST", "/process.Process/Start", frame, "E2b-Sandbox-Id", sb.SandboxID, "Content-Type", "application/connect+json",
			"X-Access-Token", sb.EnvdAccessToken, "Authorization", "Basic "+base64.StdEncoding.EncodeToString([]byte(user+":")))
		if want := base64.StdEncoding.EncodeToString([]byte(user + "\n")); code != 200 || !strings.Contains(string(b), want) {
			t.Fatalf("envd as %s with the key beside: %d %q, want stdout %s", user, code, b, want)
		}
	}
}

// A damaged snapshot is Spore's failure, not the client's: creating from
// one answers a 500 with an error ID and no host path or runsc output,
// and the log has that ID beside the full error. Both damages: the image
// truncated (runsc fails) and the image gone (the runtime finds nothing).
func TestDamagedSnapshotAnswersAnID(t *testing.T) {
	h := newHarness(t)
	sb := h.create(`{"templateID":"base"}`)
	for _, damage := range []string{"truncate", "remove"} {
		code, b, _ := h.do("POST", "/sandboxes/"+sb.SandboxID+"/snapshots", `{}`)
		var sn api.SnapshotInfo
		if code != 201 || json.Unmarshal(b, &sn) != nil {
			t.Fatalf("snapshot: %d %s", code, b)
		}
		img := filepath.Join(h.n.Engine.Snapshots().ImageDir(sn.SnapshotID), "checkpoint.img")
		var err error
		if damage == "truncate" {
			err = os.Truncate(img, 4096)
		} else {
			err = os.Remove(img)
		}
		if err != nil {
			t.Fatal(err)
		}
		code, b, _ = h.do("POST", "/v2/sandboxes", `{"templateID":"`+sn.SnapshotID+`"}`)
		var eb api.ErrorBody
		json.Unmarshal(b, &eb)
		if code != 500 || eb.Code != 500 {
			t.Fatalf("%s: create from the damaged snapshot = %d %s, want a JSON 500", damage, code, b)
		}
		for _, leak := range []string{"/var/lib", h.n.Engine.Snapshots().Dir(), "runsc", "checkpoint"} {
			if strings.Contains(eb.Message, leak) {
				t.Fatalf("%s: the answer carries %q: %s", damage, leak, eb.Message)
			}
		}
		_, id, ok := strings.Cut(eb.Message, "error id ")
		id = strings.TrimSuffix(id, ")")
		if !ok || id == "" || !strings.Contains(h.apiLog.String(), `"error_id":"`+id+`"`) {
			t.Fatalf("%s: error ID %q of %q not in the log", damage, id, eb.Message)
		}
		t.Logf("%s: answer %q", damage, eb.Message)
	}
}

package interp_test

import (
	"bufio"
	"context"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/spore-run/spore/internal/envd/identity"
	"github.com/spore-run/spore/internal/envd/interp"
	"github.com/spore-run/spore/internal/envd/reaper"
)

type server struct {
	t   *testing.T
	url string
	h   http.Handler
	d   *identity.Defaults
}

func newServer(t *testing.T) *server {
	d := identity.NewDefaults("root", nil)
	s := interp.New(interp.Config{Python: "/usr/bin/python3", Reaper: reaper.New(false), Defaults: d})
	srv := httptest.NewServer(s)
	t.Cleanup(func() {
		srv.Close()
		// Kernels are killed with their contexts (the handler, not the
		// closed listener, so a leftover kernel is never left running).
		for _, c := range listContexts(t, s, d.Token()) {
			rec := httptest.NewRecorder()
			req := httptest.NewRequest("DELETE", "/contexts/"+c.ID, nil)
			req.Header.Set("X-Access-Token", d.Token())
			s.ServeHTTP(rec, req)
		}
	})
	return &server{t: t, url: srv.URL, h: s, d: d}
}

func listContexts(t *testing.T, h http.Handler, token string) []interp.Context {
	rec := httptest.NewRecorder()
	req := httptest.NewRequest("GET", "/contexts", nil)
	req.Header.Set("X-Access-Token", token)
	h.ServeHTTP(rec, req)
	var out []interp.Context
	if err := json.NewDecoder(rec.Body).Decode(&out); err != nil {
		t.Errorf("list contexts: %d %s", rec.Code, rec.Body)
	}
	return out
}

// execute runs code and returns the events, in order.
func (s *server) execute(ctx context.Context, body map[string]any, hdr map[string]string) (int, []map[string]any) {
	s.t.Helper()
	b, _ := json.Marshal(body)
	req, _ := http.NewRequestWithContext(ctx, "POST", s.url+"/execute", strings.NewReader(string(b)))
	for k, v := range hdr {
		req.Header.Set(k, v)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		s.t.Fatal(err)
	}
	defer resp.Body.Close()
	var evs []map[string]any
	sc := bufio.NewScanner(resp.Body)
	for sc.Scan() {
		var ev map[string]any
		if err := json.Unmarshal(sc.Bytes(), &ev); err != nil {
			s.t.Fatalf("line %q is not JSON", sc.Text())
		}
		evs = append(evs, ev)
	}
	return resp.StatusCode, evs
}

func text(evs []map[string]any, typ string) string {
	var b strings.Builder
	for _, e := range evs {
		if e["type"] == typ {
			b.WriteString(e["text"].(string))
		}
	}
	return b.String()
}

func find(evs []map[string]any, typ string) map[string]any {
	for _, e := range evs {
		if e["type"] == typ {
			return e
		}
	}
	return nil
}

func TestExecuteStateErrorsContexts(t *testing.T) {
	s := newServer(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()

	code, evs := s.execute(ctx, map[string]any{"code": "x = 41\nprint('hello')\nimport sys; print('oops', file=sys.stderr)\nx + 1"}, nil)
	if code != 200 || text(evs, "stdout") != "hello\n" || text(evs, "stderr") != "oops\n" {
		t.Fatalf("execute = %d %v", code, evs)
	}
	if r := find(evs, "result"); r == nil || r["text"] != "42" || r["is_main_result"] != true {
		t.Fatalf("result = %v", r)
	}
	if n := find(evs, "number_of_executions"); n == nil || n["execution_count"] != float64(1) {
		t.Fatalf("count = %v", n)
	}
	// Variables persist; output of child processes is captured too.
	_, evs = s.execute(ctx, map[string]any{"code": "import os\nos.system('echo from-child')\nx"}, nil)
	if text(evs, "stdout") != "from-child\n" || find(evs, "result")["text"] != "41" {
		t.Fatalf("second execute = %v", evs)
	}
	// Errors with name, value, traceback; the kernel survives.
	_, evs = s.execute(ctx, map[string]any{"code": "def f():\n    return 1/0\nf()"}, nil)
	e := find(evs, "error")
	if e == nil || e["name"] != "ZeroDivisionError" || e["value"] != "division by zero" || !strings.Contains(e["traceback"].(string), "line 2, in f") {
		t.Fatalf("error = %v", e)
	}
	_, evs = s.execute(ctx, map[string]any{"code": "x"}, nil)
	if find(evs, "result")["text"] != "41" {
		t.Fatalf("after an error = %v", evs)
	}
	// Per-execution env vars.
	_, evs = s.execute(ctx, map[string]any{"code": "os.environ.get('ONLY_NOW')", "env_vars": map[string]string{"ONLY_NOW": "yes"}}, nil)
	if find(evs, "result")["text"] != "'yes'" {
		t.Fatalf("env var = %v", evs)
	}
	_, evs = s.execute(ctx, map[string]any{"code": "os.environ.get('ONLY_NOW')"}, nil)
	if find(evs, "result") != nil {
		t.Fatalf("env var leaked into the next execution: %v", evs)
	}
	// Rich output through the display protocol.
	_, evs = s.execute(ctx, map[string]any{"code": "class H:\n    def _repr_html_(self): return '<b>hi</b>'\nH()"}, nil)
	if find(evs, "result")["html"] != "<b>hi</b>" {
		t.Fatalf("html = %v", evs)
	}

	// A separate context has its own variables.
	resp, err := http.Post(s.url+"/contexts", "application/json", strings.NewReader(`{"language":"python","cwd":"/tmp"}`))
	if err != nil {
		t.Fatal(err)
	}
	var c interp.Context
	json.NewDecoder(resp.Body).Decode(&c)
	resp.Body.Close()
	if c.ID == "" || c.Cwd != "/tmp" || c.Language != "python" {
		t.Fatalf("context = %+v", c)
	}
	_, evs = s.execute(ctx, map[string]any{"code": "import os\n'x' in globals(), os.getcwd()", "context_id": c.ID}, nil)
	if find(evs, "result")["text"] != "(False, '/tmp')" {
		t.Fatalf("new context = %v", evs)
	}
	if got := listContexts(t, s.h, ""); len(got) != 2 {
		t.Fatalf("contexts = %+v", got)
	}
	// Restart clears its state.
	s.execute(ctx, map[string]any{"code": "y = 1", "context_id": c.ID}, nil)
	resp, _ = http.Post(s.url+"/contexts/"+c.ID+"/restart", "application/json", nil)
	if resp.StatusCode != 204 {
		t.Fatalf("restart = %d", resp.StatusCode)
	}
	_, evs = s.execute(ctx, map[string]any{"code": "'y' in globals()", "context_id": c.ID}, nil)
	if find(evs, "result")["text"] != "False" {
		t.Fatalf("after restart = %v", evs)
	}
	req, _ := http.NewRequest("DELETE", s.url+"/contexts/"+c.ID, nil)
	resp, _ = http.DefaultClient.Do(req)
	if resp.StatusCode != 204 {
		t.Fatalf("delete = %d", resp.StatusCode)
	}
	for _, bad := range []struct {
		body map[string]any
		want int
	}{
		{map[string]any{"code": "1", "context_id": c.ID}, 404},
		{map[string]any{"code": "1", "language": "cobol"}, 400},
		{map[string]any{"code": "1", "language": "python", "context_id": "x"}, 400},
	} {
		if code, _ := s.execute(ctx, bad.body, nil); code != bad.want {
			t.Errorf("execute %v = %d, want %d", bad.body, code, bad.want)
		}
	}
	resp, _ = http.Post(s.url+"/execute", "application/json", strings.NewReader("{not json"))
	if resp.StatusCode != 400 {
		t.Errorf("malformed body = %d", resp.StatusCode)
	}

	// With a token, /execute needs it.
	s.d.Update(nil, "", "", "tok", "", true)
	if code, _ := s.execute(ctx, map[string]any{"code": "1"}, nil); code != 401 {
		t.Fatalf("execute without token = %d", code)
	}
	if code, evs := s.execute(ctx, map[string]any{"code": "1"}, map[string]string{"X-Access-Token": "tok"}); code != 200 || find(evs, "result")["text"] != "1" {
		t.Fatalf("execute with token = %d %v", code, evs)
	}
}

// A client that goes away interrupts the running code; the context keeps
// its state.
func TestInterruptOnDisconnect(t *testing.T) {
	s := newServer(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	s.execute(ctx, map[string]any{"code": "kept = 'yes'"}, nil)
	short, cancelShort := context.WithTimeout(ctx, 500*time.Millisecond)
	defer cancelShort()
	b, _ := json.Marshal(map[string]any{"code": "import time\nwhile True: time.sleep(0.01)"})
	req, _ := http.NewRequestWithContext(short, "POST", s.url+"/execute", strings.NewReader(string(b)))
	if resp, err := http.DefaultClient.Do(req); err == nil {
		bufio.NewReader(resp.Body).ReadString('\n')
		resp.Body.Close()
	}
	_, evs := s.execute(ctx, map[string]any{"code": "kept"}, nil)
	if r := find(evs, "result"); r == nil || r["text"] != "'yes'" {
		t.Fatalf("after interrupt = %v", evs)
	}
}

// With an access token set, every route but /health refuses a request
// without it or with a wrong one (and the refused request changes nothing),
// and serves one with it.
func TestTokenOnEveryRoute(t *testing.T) {
	s := newServer(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	do := func(method, path, body, token string) (int, string) {
		t.Helper()
		req, _ := http.NewRequestWithContext(ctx, method, s.url+path, strings.NewReader(body))
		if token != "" {
			req.Header.Set("X-Access-Token", token)
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(b)
	}
	// A context holding a variable, made before the token is set.
	code, body := do("POST", "/contexts", `{"language":"python"}`, "")
	var c interp.Context
	if code != 200 || json.Unmarshal([]byte(body), &c) != nil || c.ID == "" {
		t.Fatalf("create context = %d %s", code, body)
	}
	if code, evs := s.execute(ctx, map[string]any{"code": "kept = 7", "context_id": c.ID}, nil); code != 200 || find(evs, "error") != nil {
		t.Fatalf("set variable = %d %v", code, evs)
	}

	s.d.Update(nil, "", "", "tok", "", true)
	routes := []struct{ method, path, body string }{
		{"POST", "/execute", `{"code":"1"}`},
		{"POST", "/contexts", `{"language":"python"}`},
		{"GET", "/contexts", ""},
		{"POST", "/contexts/" + c.ID + "/restart", ""},
		{"DELETE", "/contexts/" + c.ID, ""},
		{"GET", "/no-such-route", ""},
	}
	for _, r := range routes {
		for _, tok := range []string{"", "wrong"} {
			if code, body := do(r.method, r.path, r.body, tok); code != 401 || !strings.Contains(body, `"code":401`) {
				t.Errorf("%s %s with token %q = %d %s, want a JSON 401", r.method, r.path, tok, code, body)
			}
		}
	}
	if code, _ := do("GET", "/health", "", ""); code != 200 {
		t.Errorf("health without a token = %d", code)
	}
	// The refused create, restart and delete did nothing.
	if got := listContexts(t, s.h, "tok"); len(got) != 1 || got[0].ID != c.ID {
		t.Fatalf("contexts after refused requests = %+v", got)
	}
	tok := map[string]string{"X-Access-Token": "tok"}
	if _, evs := s.execute(ctx, map[string]any{"code": "kept", "context_id": c.ID}, tok); find(evs, "result")["text"] != "7" {
		t.Fatalf("variable after a refused restart = %v", evs)
	}

	// With the token, each route answers.
	for _, r := range routes {
		want := map[string]int{"/execute": 200, "/contexts": 200, "/no-such-route": 404}[r.path]
		if want == 0 {
			want = 204
		}
		if code, body := do(r.method, r.path, r.body, "tok"); code != want {
			t.Errorf("%s %s with the token = %d %s, want %d", r.method, r.path, code, body, want)
		}
	}
}

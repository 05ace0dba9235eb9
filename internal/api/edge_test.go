package api_test

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"

	"github.com/spore-run/spore/internal/api"
	"github.com/spore-run/spore/internal/apikey"
	"github.com/spore-run/spore/internal/control"
	"github.com/spore-run/spore/internal/errdefs"
	"github.com/spore-run/spore/internal/nodeapi"
	"github.com/spore-run/spore/internal/store"
)

// scriptedEngine is the part of a node the API edge tests reach: create,
// get, kill, resume and fork succeed or fail as scripted. Any other method
// panics (the embedded nil interface): these tests do not call them.
type scriptedEngine struct {
	nodeapi.Node
	createErr error
	forkErrs  []error // one per child; nil: that child succeeds

	mu      sync.Mutex
	created map[string]nodeapi.Sandbox
}

func (e *scriptedEngine) Info(context.Context) (nodeapi.NodeInfo, error) {
	return nodeapi.NodeInfo{ID: "local", Capacity: nodeapi.Resources{MemoryMB: 1 << 30, VCPUs: 1 << 10, Sandboxes: 1 << 20}}, nil
}

// Stats: what a fork's placement asks of the parent (how much memory each
// child takes); unknown here, so placement goes by the limits alone.
func (e *scriptedEngine) Stats(context.Context, string) (nodeapi.Stats, error) {
	return nodeapi.Stats{}, errdefs.ErrUnavailable
}

func (e *scriptedEngine) Events(ctx context.Context) (<-chan nodeapi.Event, error) {
	ch := make(chan nodeapi.Event)
	go func() { <-ctx.Done(); close(ch) }()
	return ch, nil
}

func (e *scriptedEngine) Create(_ context.Context, req nodeapi.CreateRequest) (nodeapi.Sandbox, error) {
	if e.createErr != nil {
		return nodeapi.Sandbox{}, e.createErr
	}
	return e.add(req.SandboxID, req.Template, req.AccessToken), nil
}

func (e *scriptedEngine) add(id, template, token string) nodeapi.Sandbox {
	sb := nodeapi.Sandbox{ID: id, State: nodeapi.StateRunning, Template: template, AccessToken: token}
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.created == nil {
		e.created = map[string]nodeapi.Sandbox{}
	}
	e.created[sb.ID] = sb
	return sb
}

func (e *scriptedEngine) count() int {
	e.mu.Lock()
	defer e.mu.Unlock()
	return len(e.created)
}

func (e *scriptedEngine) Get(_ context.Context, id string) (nodeapi.Sandbox, error) {
	e.mu.Lock()
	defer e.mu.Unlock()
	if sb, ok := e.created[id]; ok {
		return sb, nil
	}
	return nodeapi.Sandbox{}, fmt.Errorf("sandbox %s: %w", id, errdefs.ErrNotFound)
}

func (e *scriptedEngine) Kill(context.Context, string) error { return nil }
func (e *scriptedEngine) Resume(ctx context.Context, id string) (nodeapi.Sandbox, error) {
	return e.Get(ctx, id)
}
func (e *scriptedEngine) Hibernate(context.Context, string) error { return nil }
func (e *scriptedEngine) SetPolicy(context.Context, string, nodeapi.Policy) error {
	return nil
}

func (e *scriptedEngine) Fork(_ context.Context, id string, req nodeapi.ForkRequest) (nodeapi.ForkResult, error) {
	var fr nodeapi.ForkResult
	for i, c := range req.Children {
		if i < len(e.forkErrs) && e.forkErrs[i] != nil {
			fr.Children = append(fr.Children, nodeapi.ForkChild{Err: e.forkErrs[i]})
			continue
		}
		fr.Children = append(fr.Children, nodeapi.ForkChild{Sandbox: e.add(c.SandboxID, "base", c.AccessToken)})
	}
	return fr, nil
}

// edge is an API over a scripted engine, its log captured.
type edge struct {
	t   *testing.T
	url string
	eng *scriptedEngine
	log *syncBuffer
}

// syncBuffer is a log destination safe for the server's goroutines.
type syncBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *syncBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

func (b *syncBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}

func newEdge(t *testing.T, eng *scriptedEngine) *edge {
	st := openStore(t)
	buf := &syncBuffer{}
	log := slog.New(slog.NewJSONHandler(buf, nil))
	ctl := control.New(control.Config{Store: st, Nodes: control.Nodes{"local": eng}, Logger: log})
	srv := httptest.NewServer(api.New(api.Config{Control: ctl, Store: st, Logger: log}))
	t.Cleanup(srv.Close)
	return &edge{t: t, url: srv.URL, eng: eng, log: buf}
}

func (e *edge) do(method, path, body string) (int, []byte) {
	e.t.Helper()
	req, _ := http.NewRequest(method, e.url+path, strings.NewReader(body))
	req.Header.Set("X-API-KEY", key)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		e.t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, b
}

// What a failing runsc leaves in an error: its stderr and host paths.
const runscFailure = "runsc restore: exit status 128: stderr: W0101 loading checkpoint /var/lib/spore/snapshots/s0123/checkpoint.img: permission denied"

// A server-side failure answers a plain message with an error ID; the
// full error (runsc's stderr, host paths) is in the log under that ID and
// nowhere in the answer. Kinds a client can act on keep their message.
func TestInternalErrorsAnswerAnID(t *testing.T) {
	cases := []struct {
		name string
		err  error
		code int
	}{
		{"unkinded", fmt.Errorf("restore instance i1: %s", runscFailure), 500},
		{"damaged image", fmt.Errorf("%w: restore instance i1: image /var/lib/spore/snapshots/s0123: %w", errdefs.ErrInternal, errdefs.ErrNotFound), 500},
		{"runsc timeout", fmt.Errorf("runsc restore: %w after 1m0s: %s", errdefs.ErrUnavailable, runscFailure), 503},
	}
	for _, c := range cases {
		e := newEdge(t, &scriptedEngine{createErr: c.err})
		code, body := e.do("POST", "/v2/sandboxes", `{"templateID":"base"}`)
		var eb api.ErrorBody
		json.Unmarshal(body, &eb)
		if code != c.code || eb.Code != c.code {
			t.Fatalf("%s: %d %s, want %d", c.name, code, body, c.code)
		}
		assertHidden(t, c.name, eb.Message, c.err, e.log.String())
	}
	// A user's mistake is still explained.
	e := newEdge(t, &scriptedEngine{createErr: errdefs.NotFoundf("template %q", "nope")})
	if code, body := e.do("POST", "/v2/sandboxes", `{"templateID":"nope"}`); code != 404 || !strings.Contains(string(body), "nope") {
		t.Fatalf("not found: %d %s", code, body)
	}
}

// A fork child's internal error is answered the same way, per child.
func TestForkChildErrorAnswersAnID(t *testing.T) {
	childErr := fmt.Errorf("restore instance i2: %s", runscFailure)
	e := newEdge(t, &scriptedEngine{forkErrs: []error{nil, childErr, errdefs.ErrResourceLimit}})
	code, body := e.do("POST", "/v2/sandboxes", `{}`)
	var parent api.SandboxResponse
	if code != 201 || json.Unmarshal(body, &parent) != nil {
		t.Fatalf("create: %d %s", code, body)
	}
	code, body = e.do("POST", "/sandboxes/"+parent.SandboxID+"/fork", `{"count":3}`)
	var children []api.ForkChild
	if code != 201 || json.Unmarshal(body, &children) != nil || len(children) != 3 {
		t.Fatalf("fork: %d %s", code, body)
	}
	if children[0].Sandbox == nil || children[1].Error == nil || children[1].Error.Code != 500 || children[2].Error == nil || children[2].Error.Code != 429 {
		t.Fatalf("fork children: %s", body)
	}
	assertHidden(t, "fork child", children[1].Error.Message, childErr, e.log.String())
	if !strings.Contains(children[2].Error.Message, "resource exhausted") {
		t.Fatalf("a 429 child lost its message: %s", body)
	}
}

// assertHidden checks an answer's message names an error ID and none of
// err's text, and the log has that ID beside the full error.
func assertHidden(t *testing.T, name, msg string, err error, log string) {
	t.Helper()
	for _, leak := range []string{"/var/lib", "runsc", "stderr", "checkpoint"} {
		if strings.Contains(msg, leak) {
			t.Errorf("%s: the answer carries %q: %s", name, leak, msg)
		}
	}
	_, id, ok := strings.Cut(msg, "error id ")
	id = strings.TrimSuffix(id, ")")
	if !ok || len(id) != 16 {
		t.Fatalf("%s: no error ID in %q", name, msg)
	}
	for _, line := range strings.Split(log, "\n") {
		var rec map[string]any
		if json.Unmarshal([]byte(line), &rec) != nil || rec["error_id"] != id {
			continue
		}
		if rec["err"] != err.Error() {
			t.Fatalf("%s: log line for %s has err %q, want %q", name, id, rec["err"], err.Error())
		}
		return
	}
	t.Fatalf("%s: error ID %s not in the log:\n%s", name, id, log)
}

// Every E2B field Spore does not implement is refused with a 400 naming it
// unless its value means what Spore does; the stock SDKs' default requests
// pass. Nothing is created by a refused request.
func TestUnsupportedFieldsRefused(t *testing.T) {
	e := newEdge(t, &scriptedEngine{})
	refused := []struct{ field, body string }{
		{"secure", `{"secure":false}`},
		{"autoPauseMemory", `{"autoPause":true,"autoPauseMemory":false}`},
		{"autoResume", `{"autoResume":{"enabled":true}}`}, // without autoPause
		{"mcp", `{"mcp":{"github":{}}}`},
		{"iam", `{"iam":{"tokens":{"t":{"audience":"a","tokenType":"b"}}}}`},
		{"network.egressProxy", `{"network":{"egressProxy":{"address":"proxy:3128"}}}`},
		{"network.httpsPorts", `{"network":{"httpsPorts":[443]}}`},
		{"network.maskRequestHost", `{"network":{"maskRequestHost":"example.com"}}`},
		{"allowInternetAccess", `{"allowInternetAccess":false}`}, // the wire name is allow_internet_access
		{"someFutureFeature", `{"someFutureFeature":true}`},
		{"lifecycle", `{"lifecycle":{"onTimeout":"pause"}}`},
	}
	for _, c := range refused {
		code, body := e.do("POST", "/v2/sandboxes", c.body)
		var eb api.ErrorBody
		json.Unmarshal(body, &eb)
		last := c.field[strings.LastIndex(c.field, ".")+1:]
		if code != 400 || eb.Code != 400 || !strings.Contains(eb.Message, `"`+c.field+`"`) && !strings.Contains(eb.Message, `"`+last+`"`) {
			t.Errorf("create %s = %d %s, want a 400 naming %s", c.body, code, body, c.field)
		}
	}
	if n := e.eng.count(); n != 0 {
		t.Fatalf("refused creates made %d sandboxes", n)
	}
	// The stock SDKs' default creates (read from their request builders):
	// e2b 2.51 and @e2b/code-interpreter 2.8 send templateID and timeout;
	// e2b 2.50 adds secure: true and allow_internet_access: true. Values
	// that mean what Spore does anyway pass too.
	accepted := []string{
		`{"templateID":"base","timeout":300}`,
		`{"templateID":"code-interpreter-v1","timeout":300}`,
		`{"templateID":"base","timeout":300,"secure":true,"allow_internet_access":true}`,
		`{"templateID":"base","metadata":null,"envVars":null,"mcp":null,"iam":null,"volumeMounts":[],"autoResume":{"enabled":false}}`,
		`{"autoPause":true,"autoPauseMemory":true,"autoResume":{"enabled":false}}`,
		`{"network":{"allowOut":["10.0.0.0/8"],"denyOut":["0.0.0.0/0"],"allowPublicTraffic":true,"egressProxy":null,"rules":{},"httpsPorts":[]}}`,
	}
	var id string
	for _, b := range accepted {
		code, body := e.do("POST", "/v2/sandboxes", b)
		var sr api.SandboxResponse
		if code != 201 || json.Unmarshal(body, &sr) != nil {
			t.Fatalf("create %s = %d %s, want 201", b, code, body)
		}
		id = sr.SandboxID
	}
	// connect, the older resume, and the network update.
	for _, c := range []struct {
		method, path, body, field string
		want                      int
	}{
		{"POST", "/v2/sandboxes/" + id + "/connect", `{"timeout":300}`, "", 200},
		{"POST", "/sandboxes/" + id + "/connect", `{"timeout":300,"memory":true}`, "", 200},
		{"POST", "/v2/sandboxes/" + id + "/connect", `{"timeout":300,"memory":false}`, "memory", 400},
		{"POST", "/v2/sandboxes/" + id + "/connect", `{"autoPause":true}`, "autoPause", 400},
		{"PUT", "/sandboxes/" + id + "/network", `{"allowOut":["1.1.1.1"],"allow_internet_access":false}`, "", 204},
		{"PUT", "/sandboxes/" + id + "/network", `{"egressProxy":{"address":"p:1"}}`, "egressProxy", 400},
		{"POST", "/sandboxes/" + id + "/pause", `{"memory":true,"extra":1}`, "extra", 400},
		{"POST", "/sandboxes/" + id + "/fork", `{"count":1,"concurrency":4}`, "concurrency", 400},
		// The older resume may only restate the sandbox's autoPause.
		{"POST", "/sandboxes/" + id + "/hibernate", ``, "", 204},
		{"POST", "/sandboxes/" + id + "/resume", `{"timeout":300,"autoPause":true}`, "autoPause", 400},
		{"POST", "/sandboxes/" + id + "/resume", `{"timeout":300,"memory":false}`, "memory", 400},
		{"POST", "/sandboxes/" + id + "/resume", `{"timeout":300,"autoPause":false}`, "", 201},
	} {
		code, body := e.do(c.method, c.path, c.body)
		if code != c.want || c.field != "" && !strings.Contains(string(body), `\"`+c.field+`\"`) {
			t.Errorf("%s %s %s = %d %s, want %d naming %q", c.method, c.path, c.body, code, body, c.want, c.field)
		}
	}
}

// brokenKeys is a store that cannot look keys up.
type brokenKeys struct{ store.Store }

func (brokenKeys) APIKeyByHash(context.Context, string) (store.APIKey, error) {
	return store.APIKey{}, errors.New("database is locked")
}

func (brokenKeys) APIKeysVersion(context.Context) (int64, error) {
	return 0, errors.New("database is locked")
}

func (brokenKeys) ListAPIKeys(context.Context, bool) ([]store.APIKey, error) {
	return nil, errors.New("database is locked")
}

// The proxy's key check knows the keys, and when the store cannot answer
// it holds the credential back rather than let a key into a sandbox.
func TestKeyCheck(t *testing.T) {
	st := openStore(t)
	ctx := context.Background()
	check := apikey.NewChecker(st).Check
	if !check(ctx, key) || check(ctx, "not-a-key") {
		t.Fatalf("KeyCheck: key %v, non-key %v", check(ctx, key), check(ctx, "not-a-key"))
	}
	if !apikey.NewChecker(brokenKeys{st}).Check(ctx, "anything") {
		t.Fatal("a store failure let a credential through")
	}
}

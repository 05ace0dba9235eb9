package api_test

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/spore-run/spore/internal/api"
	"github.com/spore-run/spore/internal/apikey"
	"github.com/spore-run/spore/internal/control"
	"github.com/spore-run/spore/internal/control/controltest"
	"github.com/spore-run/spore/internal/proxy"
	"github.com/spore-run/spore/internal/store"
)

// The API and the proxy over a fake node (controltest: the real engine on
// the fake runtime, a loopback network) and a real SQLite store: status
// codes, JSON errors, paging and proxying, fast and under -race. The same
// behaviour over real sandboxes: TestLifecycle, TestProxy, TestBadInput.

type fnode struct {
	t   *testing.T
	url string
	n   *controltest.Node
	ctl *control.Service
	st  store.Store
}

// newFnode builds the API in the test's configuration
// (controltest.ConfigOf): SQLite and the node in process, or PostgreSQL
// and the node over the node protocol.
func newFnode(t *testing.T, opts ...func(*control.Config)) *fnode {
	t.Helper()
	c := controltest.ConfigOf(t)
	st := c.Store(t)
	if err := st.AddAPIKey(context.Background(), store.APIKey{ID: "k", Hash: apikey.Hash(key), CreatedAt: time.Now()}); err != nil {
		t.Fatal(err)
	}
	f := &fnode{t: t, n: controltest.New(t), st: st}
	cfg := control.Config{Store: st, Nodes: control.Nodes{controltest.NodeID: c.Node(t, f.n.Local)}}
	for _, o := range opts {
		o(&cfg)
	}
	f.ctl = control.New(cfg)
	t.Cleanup(f.ctl.Close)
	srv := httptest.NewServer(api.New(api.Config{Control: f.ctl, Store: st, Proxy: proxy.New(f.ctl, apikey.NewChecker(st).Check, nil), Audit: cfg.Audit}))
	t.Cleanup(srv.Close)
	f.url = srv.URL
	return f
}

func (f *fnode) do(method, path, body string, hdr ...string) (int, []byte, http.Header) {
	f.t.Helper()
	return call(f.t, f.url, method, path, body, hdr...)
}

// want checks a status; an error status must come with a JSON
// {code,message} of the same code.
func (f *fnode) want(code int, method, path, body string, hdr ...string) []byte {
	f.t.Helper()
	got, b, _ := f.do(method, path, body, hdr...)
	if got != code {
		f.t.Fatalf("%s %s %.80s = %d %.300s, want %d", method, path, body, got, b, code)
	}
	if code >= 400 {
		var e api.ErrorBody
		if json.Unmarshal(b, &e) != nil || e.Code != code || e.Message == "" {
			f.t.Fatalf("%s %s = %d with body %.300s, want a JSON {code,message}", method, path, code, b)
		}
	}
	return b
}

func (f *fnode) create(body string) api.SandboxResponse {
	f.t.Helper()
	var r api.SandboxResponse
	if err := json.Unmarshal(f.want(201, "POST", "/v2/sandboxes", body), &r); err != nil || r.SandboxID == "" {
		f.t.Fatalf("create: %v %+v", err, r)
	}
	return r
}

func (f *fnode) state(id string) (string, string) {
	f.t.Helper()
	var d api.SandboxDetail
	json.Unmarshal(f.want(200, "GET", "/sandboxes/"+id, ""), &d)
	return d.State, d.SporeState
}

// The lifecycle's status codes: create 201; pause 204 then 409; connect
// 201 when it resumed, 200 when it was running; resume of a running
// sandbox 409; hibernate; snapshot, fork, rollback; kill 204 then 404.
func TestFastLifecycleStatuses(t *testing.T) { controltest.Each(t, testFastLifecycleStatuses) }

func testFastLifecycleStatuses(t *testing.T, _ controltest.Config) {
	f := newFnode(t)
	sb := f.create(`{"templateID":"base","timeout":60,"metadata":{"k":"v"}}`)
	if st, sp := f.state(sb.SandboxID); st != "running" || sp != "running" {
		t.Fatalf("new sandbox: %s/%s", st, sp)
	}
	f.want(204, "POST", "/sandboxes/"+sb.SandboxID+"/pause", "")
	f.want(409, "POST", "/sandboxes/"+sb.SandboxID+"/pause", "")
	f.want(201, "POST", "/sandboxes/"+sb.SandboxID+"/connect", `{"timeout":60}`)
	f.want(200, "POST", "/sandboxes/"+sb.SandboxID+"/connect", `{"timeout":60}`)
	f.want(409, "POST", "/sandboxes/"+sb.SandboxID+"/resume", `{}`)
	f.want(204, "POST", "/sandboxes/"+sb.SandboxID+"/hibernate", "")
	if st, sp := f.state(sb.SandboxID); st != "paused" || sp != "hibernated" {
		t.Fatalf("hibernated sandbox: %s/%s", st, sp)
	}
	f.want(201, "POST", "/v2/sandboxes/"+sb.SandboxID+"/connect", `{"timeout":60}`)
	f.want(204, "POST", "/sandboxes/"+sb.SandboxID+"/timeout", `{"timeout":120}`)
	var sn struct {
		SnapshotID string `json:"snapshotID"`
	}
	json.Unmarshal(f.want(201, "POST", "/sandboxes/"+sb.SandboxID+"/snapshots", `{"name":"fast-snap"}`), &sn)
	f.want(409, "POST", "/sandboxes/"+sb.SandboxID+"/snapshots", `{"name":"fast-snap"}`)
	var kids []api.ForkChild
	json.Unmarshal(f.want(201, "POST", "/sandboxes/"+sb.SandboxID+"/fork", `{"count":2}`), &kids)
	if len(kids) != 2 || kids[0].Sandbox == nil || kids[1].Sandbox == nil || kids[0].Sandbox.SandboxID == kids[1].Sandbox.SandboxID {
		t.Fatalf("fork children: %+v", kids)
	}
	f.want(200, "POST", "/sandboxes/"+sb.SandboxID+"/rollback", `{"snapshotID":"`+sn.SnapshotID+`"}`)
	f.want(404, "POST", "/sandboxes/"+sb.SandboxID+"/rollback", `{"snapshotID":"s0000000000000000000"}`)
	f.want(204, "DELETE", "/sandboxes/"+sb.SandboxID, "")
	f.want(404, "DELETE", "/sandboxes/"+sb.SandboxID, "")
	f.want(404, "GET", "/sandboxes/"+sb.SandboxID, "")
	// The snapshot outlives its sandbox and creates a new one.
	f.create(`{"templateID":"` + sn.SnapshotID + `"}`)
}

// Bad input is a JSON 4xx and changes nothing.
func TestFastBadInput(t *testing.T) { controltest.Each(t, testFastBadInput) }

func testFastBadInput(t *testing.T, _ controltest.Config) {
	f := newFnode(t)
	sb := f.create(`{"templateID":"base"}`)
	for _, c := range []struct {
		method, path, body string
		want               int
	}{
		{"POST", "/v2/sandboxes", `{not json`, 400},
		{"POST", "/v2/sandboxes", `{"timeout":-5}`, 400},
		{"POST", "/v2/sandboxes", `{"templateID":"no-such-template"}`, 404},
		{"POST", "/v2/sandboxes", `{"templateID":"../../etc"}`, 400},
		{"POST", "/v2/sandboxes", `{"network":{"denyOut":["not-a-cidr"]}}`, 400},
		{"GET", "/sandboxes/UPPER", "", 400},
		{"GET", "/sandboxes/i0000000000000000000", "", 404},
		{"POST", "/sandboxes/" + sb.SandboxID + "/fork", `{"count":0}`, 400},
		{"POST", "/sandboxes/" + sb.SandboxID + "/fork", `{"count":101}`, 400},
		{"POST", "/sandboxes/" + sb.SandboxID + "/rollback", `{}`, 400},
		{"POST", "/sandboxes/" + sb.SandboxID + "/timeout", `{"timeout":-1}`, 400},
		{"GET", "/v2/sandboxes?nextToken=garbage", "", 400},
		{"GET", "/v2/sandboxes?limit=0", "", 400},
		{"GET", "/v2/sandboxes?state=exploded", "", 400},
	} {
		f.want(c.want, c.method, c.path, c.body)
	}
	var list []api.SandboxDetail
	json.Unmarshal(f.want(200, "GET", "/v2/sandboxes", ""), &list)
	if len(list) != 1 || list[0].SandboxID != sb.SandboxID {
		t.Fatalf("bad input changed the sandboxes: %+v", list)
	}
}

// Paging walks every sandbox exactly once; filters select by metadata
// and state.
func TestFastPaging(t *testing.T) { controltest.Each(t, testFastPaging) }

func testFastPaging(t *testing.T, _ controltest.Config) {
	f := newFnode(t)
	want := map[string]bool{}
	for i := range 5 {
		sb := f.create(fmt.Sprintf(`{"templateID":"base","metadata":{"i":"%d","even":"%v"}}`, i, i%2 == 0))
		want[sb.SandboxID] = true
	}
	seen := map[string]bool{}
	next, pages := "", 0
	for {
		code, b, hdr := f.do("GET", "/v2/sandboxes?limit=2&nextToken="+next, "")
		var page []api.SandboxDetail
		if code != 200 || json.Unmarshal(b, &page) != nil || len(page) > 2 {
			t.Fatalf("page %d: %d %s", pages, code, b)
		}
		for _, d := range page {
			if seen[d.SandboxID] || !want[d.SandboxID] {
				t.Fatalf("page %d: %s repeated or unknown", pages, d.SandboxID)
			}
			seen[d.SandboxID] = true
		}
		pages++
		if next = hdr.Get("X-Next-Token"); next == "" {
			break
		}
	}
	if len(seen) != 5 || pages != 3 {
		t.Fatalf("paging saw %d sandboxes in %d pages, want 5 in 3", len(seen), pages)
	}
	var evens []api.SandboxDetail
	json.Unmarshal(f.want(200, "GET", "/v2/sandboxes?metadata=even%3Dtrue", ""), &evens)
	if len(evens) != 3 {
		t.Fatalf("metadata filter: %d sandboxes, want 3", len(evens))
	}
	for id := range want {
		f.want(204, "POST", "/sandboxes/"+id+"/pause", "")
		break
	}
	var paused []api.SandboxDetail
	json.Unmarshal(f.want(200, "GET", "/v2/sandboxes?state=paused", ""), &paused)
	if len(paused) != 1 {
		t.Fatalf("state filter: %d paused, want 1", len(paused))
	}
}

// backend is "the sandbox's" server: it listens on the port every fake
// instance's loopback address shares. /stream writes a line, then waits
// until the client has read it (so streaming is checked by order, not
// time), then writes lines until the request ends.
type backend struct {
	port    int
	readOne chan struct{}
	ended   chan struct{}
	once    sync.Once
}

func newBackend(t *testing.T) *backend {
	t.Helper()
	ln, err := net.Listen("tcp", "0.0.0.0:0")
	if err != nil {
		t.Fatal(err)
	}
	b := &backend{port: ln.Addr().(*net.TCPAddr).Port, readOne: make(chan struct{}), ended: make(chan struct{})}
	srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path != "/stream" {
			fmt.Fprintf(w, "hello from %s", r.Host)
			return
		}
		defer b.once.Do(func() { close(b.ended) })
		fmt.Fprintln(w, "first")
		w.(http.Flusher).Flush()
		select {
		case <-b.readOne:
		case <-r.Context().Done():
			return
		}
		for i := 0; ; i++ {
			if _, err := fmt.Fprintln(w, i); err != nil {
				return
			}
			w.(http.Flusher).Flush()
			select {
			case <-r.Context().Done():
				return
			case <-time.After(10 * time.Millisecond):
			}
		}
	})}
	go srv.Serve(ln)
	t.Cleanup(func() { srv.Close() })
	return b
}

// The proxy routes by header and by Host, streams as the sandbox writes,
// answers a JSON 502 for paused and unknown sandboxes and a 400 for bad
// routes, and ends a stream when its sandbox goes (kill, hibernate).
func TestFastProxy(t *testing.T) { controltest.Each(t, testFastProxy) }

func testFastProxy(t *testing.T, _ controltest.Config) {
	f := newFnode(t)
	be := newBackend(t)
	port := strconv.Itoa(be.port)
	sb := f.create(`{"templateID":"base"}`)
	if b := f.want(200, "GET", "/hello", "", "E2b-Sandbox-Id", sb.SandboxID, "E2b-Sandbox-Port", port); !strings.HasPrefix(string(b), "hello from 127.1.") {
		t.Fatalf("by header: %s", b)
	}
	if b := f.want(200, "GET", "/hello", "", "Host", port+"-"+sb.SandboxID+".spore.localhost"); !strings.HasPrefix(string(b), "hello from 127.1.") {
		t.Fatalf("by Host: %s", b)
	}
	f.want(400, "GET", "/hello", "", "E2b-Sandbox-Id", "../etc")
	f.want(400, "GET", "/hello", "", "E2b-Sandbox-Id", sb.SandboxID, "E2b-Sandbox-Port", "99999")
	f.want(502, "GET", "/hello", "", "E2b-Sandbox-Id", "i0000000000000000000", "E2b-Sandbox-Port", port)

	for _, end := range []struct{ name, method, path string }{
		{"hibernate", "POST", "/sandboxes/" + sb.SandboxID + "/hibernate"},
		{"kill", "DELETE", "/sandboxes/" + sb.SandboxID},
	} {
		t.Run(end.name, func(t *testing.T) {
			be.readOne, be.ended, be.once = make(chan struct{}), make(chan struct{}), sync.Once{}
			f.want(map[bool]int{true: 201, false: 200}[end.name == "kill"], "POST", "/sandboxes/"+sb.SandboxID+"/connect", `{}`)
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			req, _ := http.NewRequestWithContext(ctx, "GET", f.url+"/stream", nil)
			req.Header.Set("E2b-Sandbox-Id", sb.SandboxID)
			req.Header.Set("E2b-Sandbox-Port", port)
			resp, err := http.DefaultClient.Do(req)
			if err != nil {
				t.Fatal(err)
			}
			defer resp.Body.Close()
			rd := bufio.NewReader(resp.Body)
			if l, err := rd.ReadString('\n'); l != "first\n" {
				t.Fatalf("first line %q, %v: not streamed", l, err)
			}
			close(be.readOne)
			if l, err := rd.ReadString('\n'); err != nil || l != "0\n" {
				t.Fatalf("second line %q, %v", l, err)
			}
			f.want(204, end.method, end.path, "")
			if _, err := io.Copy(io.Discard, rd); ctx.Err() != nil {
				t.Fatalf("the stream did not end when the sandbox went (%s): %v", end.name, err)
			}
			select {
			case <-be.ended:
			case <-ctx.Done():
				t.Fatal("the sandbox side of the stream was not ended")
			}
			if end.name == "hibernate" {
				f.want(502, "GET", "/hello", "", "E2b-Sandbox-Id", sb.SandboxID, "E2b-Sandbox-Port", port)
			}
		})
	}
}

// A sandbox created with network.allowPublicTraffic false (E2B) takes
// requests on its ports only with its traffic access token; its detail
// says so; its fork children inherit it; a public one needs no token; the
// setting cannot be changed by a network update (E2B's has no such field).
func TestFastPrivatePorts(t *testing.T) { controltest.Each(t, testFastPrivatePorts) }

func testFastPrivatePorts(t *testing.T, _ controltest.Config) {
	f := newFnode(t)
	be := newBackend(t)
	port := strconv.Itoa(be.port)
	priv := f.create(`{"templateID":"base","network":{"allowPublicTraffic":false}}`)
	pub := f.create(`{"templateID":"base","network":{"allowPublicTraffic":true}}`)
	if priv.TrafficAccessToken == "" {
		t.Fatal("no traffic access token in the create response")
	}
	route := func(id string, hdr ...string) []string {
		return append([]string{"E2b-Sandbox-Id", id, "E2b-Sandbox-Port", port}, hdr...)
	}
	f.want(403, "GET", "/hello", "", route(priv.SandboxID)...)
	f.want(403, "GET", "/hello", "", route(priv.SandboxID, "E2B-Traffic-Access-Token", pub.TrafficAccessToken)...)
	f.want(200, "GET", "/hello", "", route(priv.SandboxID, "E2B-Traffic-Access-Token", priv.TrafficAccessToken)...)
	f.want(200, "GET", "/hello", "", route(pub.SandboxID)...)
	var d api.SandboxDetail
	json.Unmarshal(f.want(200, "GET", "/sandboxes/"+priv.SandboxID, ""), &d)
	if d.Network == nil || d.Network.AllowPublicTraffic == nil || *d.Network.AllowPublicTraffic {
		t.Fatalf("detail of a private sandbox: network %+v", d.Network)
	}
	d = api.SandboxDetail{}
	json.Unmarshal(f.want(200, "GET", "/sandboxes/"+pub.SandboxID, ""), &d)
	if d.Network != nil {
		t.Fatalf("detail of a public sandbox: network %+v", d.Network)
	}
	var kids []api.ForkChild
	json.Unmarshal(f.want(201, "POST", "/sandboxes/"+priv.SandboxID+"/fork", `{"count":1}`), &kids)
	if len(kids) != 1 || kids[0].Sandbox == nil {
		t.Fatalf("fork: %+v", kids)
	}
	f.want(403, "GET", "/hello", "", route(kids[0].Sandbox.SandboxID)...)
	f.want(200, "GET", "/hello", "", route(kids[0].Sandbox.SandboxID, "E2B-Traffic-Access-Token", kids[0].Sandbox.TrafficAccessToken)...)
	f.want(400, "PUT", "/sandboxes/"+pub.SandboxID+"/network", `{"allowPublicTraffic":false}`)
	f.want(200, "GET", "/hello", "", route(pub.SandboxID)...)
}

// A sandbox created with autoResume (E2B's lifecycle) is resumed by
// traffic while paused or hibernated, and then runs with its timeout; one
// without answers 502 as before and stays paused.
func TestFastAutoResume(t *testing.T) { controltest.Each(t, testFastAutoResume) }

func testFastAutoResume(t *testing.T, _ controltest.Config) {
	f := newFnode(t)
	be := newBackend(t)
	port := strconv.Itoa(be.port)
	auto := f.create(`{"templateID":"base","timeout":600,"autoPause":true,"autoResume":{"enabled":true}}`)
	plain := f.create(`{"templateID":"base","timeout":600,"autoPause":true}`)
	route := func(id string) []string { return []string{"E2b-Sandbox-Id", id, "E2b-Sandbox-Port", port} }
	var d api.SandboxDetail
	json.Unmarshal(f.want(200, "GET", "/sandboxes/"+auto.SandboxID, ""), &d)
	if !d.Lifecycle.AutoResume || d.Lifecycle.OnTimeout != "pause" {
		t.Fatalf("lifecycle %+v", d.Lifecycle)
	}
	for _, how := range []string{"pause", "hibernate"} {
		f.want(204, "POST", "/sandboxes/"+auto.SandboxID+"/"+how, "")
		f.want(204, "POST", "/sandboxes/"+plain.SandboxID+"/"+how, "")
		f.want(502, "GET", "/hello", "", route(plain.SandboxID)...)
		if st, _ := f.state(plain.SandboxID); st == "running" {
			t.Fatalf("traffic resumed a sandbox without autoResume (%s)", how)
		}
		if b := f.want(200, "GET", "/hello", "", route(auto.SandboxID)...); !strings.HasPrefix(string(b), "hello from 127.1.") {
			t.Fatalf("after %s: %s", how, b)
		}
		if st, _ := f.state(auto.SandboxID); st != "running" {
			t.Fatalf("after %s and traffic: %s", how, st)
		}
		f.want(201, "POST", "/sandboxes/"+plain.SandboxID+"/connect", `{"timeout":600}`)
	}
}

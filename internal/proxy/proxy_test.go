package proxy_test

import (
	"context"
	"encoding/json"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"net/url"
	"strconv"
	"strings"
	"testing"

	"github.com/spore-run/spore/internal/errdefs"
	"github.com/spore-run/spore/internal/proxy"
)

const apiKey = "spore-test-key-0123456789"

// loopback is a Resolver whose every sandbox is 127.0.0.1: the "sandbox"
// is a local server on the port the request names.
type loopback struct{}

func (loopback) Lookup(string) (netip.Addr, bool, bool, <-chan struct{}) {
	return netip.MustParseAddr("127.0.0.1"), true, true, make(chan struct{})
}
func (loopback) SignedBy(context.Context, url.Values, string) (string, error) {
	return "", errdefs.ErrNotFound
}
func (loopback) TrafficAllowed(_ context.Context, id, tt string) (string, bool) {
	return "envd-token-of-" + id, tt == "traffic-token-of-"+id
}

// interpLoopback routes to 127.0.0.3, where the test's code interpreter
// stand-in listens on the interpreter's port.
type interpLoopback struct{ loopback }

func (interpLoopback) Lookup(string) (netip.Addr, bool, bool, <-chan struct{}) {
	return netip.MustParseAddr("127.0.0.3"), true, true, make(chan struct{})
}

// echo serves the request's headers back as JSON.
func echo(t *testing.T) (port string) {
	t.Helper()
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		json.NewEncoder(w).Encode(r.Header)
	}))
	t.Cleanup(srv.Close)
	_, port, _ = net.SplitHostPort(srv.Listener.Addr().String())
	return port
}

func isKey(_ context.Context, k string) bool { return k == apiKey }

// What authenticates a client to Spore never reaches the sandbox; what the
// sandbox's own protocols need (envd's token and Basic user, a user app's
// own Authorization) does.
func TestStripsCredentials(t *testing.T) {
	port := echo(t)
	front := httptest.NewServer(proxy.New(loopback{}, isKey, nil))
	defer front.Close()
	cases := []struct {
		name     string
		hdr      [][2]string
		wantAuth []string // Authorization values the sandbox sees
	}{
		{"key in both", [][2]string{{"X-API-KEY", apiKey}, {"Authorization", "Bearer " + apiKey}}, nil},
		{"key lower-case bearer", [][2]string{{"Authorization", "bearer  " + apiKey}}, nil},
		{"key bare", [][2]string{{"Authorization", apiKey}}, nil},
		{"envd basic user", [][2]string{{"X-API-KEY", apiKey}, {"Authorization", "Basic dXNlcjo="}}, []string{"Basic dXNlcjo="}},
		{"user's own bearer", [][2]string{{"Authorization", "Bearer user-app-token"}}, []string{"Bearer user-app-token"}},
		{"key and user's own", [][2]string{{"Authorization", "Bearer " + apiKey}, {"Authorization", "Bearer mine"}}, []string{"Bearer mine"}},
	}
	for _, c := range cases {
		req, _ := http.NewRequest("GET", front.URL+"/", nil)
		req.Header.Set("E2b-Sandbox-Id", "i0000000000000000000")
		req.Header.Set("E2b-Sandbox-Port", port)
		req.Header.Set("X-Access-Token", "envd-token")
		req.Header.Set("X-Custom", "arrives")
		for _, h := range c.hdr {
			req.Header.Add(h[0], h[1])
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		var seen http.Header
		if resp.StatusCode != 200 || json.Unmarshal(body, &seen) != nil {
			t.Fatalf("%s: %d %s", c.name, resp.StatusCode, body)
		}
		if strings.Contains(string(body), apiKey) {
			t.Errorf("%s: the sandbox saw the API key: %s", c.name, body)
		}
		if got := seen.Values("Authorization"); strings.Join(got, "|") != strings.Join(c.wantAuth, "|") {
			t.Errorf("%s: Authorization in the sandbox = %q, want %q", c.name, got, c.wantAuth)
		}
		for _, h := range []string{"X-Api-Key", "E2b-Sandbox-Id", "E2b-Sandbox-Port"} {
			if v := seen.Get(h); v != "" {
				t.Errorf("%s: %s reached the sandbox: %q", c.name, h, v)
			}
		}
		if seen.Get("X-Access-Token") != "envd-token" || seen.Get("X-Custom") != "arrives" {
			t.Errorf("%s: the sandbox's own headers did not arrive: %s", c.name, body)
		}
	}
}

// Without a key check every Bearer credential is held back: the safe side.
func TestStripsEveryBearerWithoutKeyCheck(t *testing.T) {
	port := echo(t)
	front := httptest.NewServer(proxy.New(loopback{}, nil, nil))
	defer front.Close()
	req, _ := http.NewRequest("GET", front.URL+"/", nil)
	req.Header.Set("E2b-Sandbox-Id", "i0000000000000000000")
	req.Header.Set("E2b-Sandbox-Port", port)
	req.Header.Set("Authorization", "Bearer anything")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if strings.Contains(string(body), "anything") {
		t.Fatalf("a Bearer credential passed without a key check: %s", body)
	}
}

// A port nothing listens on is named as such; other failures answer an
// error ID, never the sandbox's internal address.
func TestUnreachableAnswer(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	port := ln.Addr().(*net.TCPAddr).Port
	ln.Close()
	front := httptest.NewServer(proxy.New(loopback{}, isKey, nil))
	defer front.Close()
	req, _ := http.NewRequest("GET", front.URL+"/", nil)
	req.Header.Set("E2b-Sandbox-Id", "i0000000000000000000")
	req.Header.Set("E2b-Sandbox-Port", strconv.Itoa(port))
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != 502 || strings.Contains(string(body), "127.0.0.1") || !strings.Contains(string(body), "nothing listens on port") {
		t.Fatalf("closed port: %d %s", resp.StatusCode, body)
	}
}

// The stock code-interpreter SDK authenticates its /contexts calls with the
// sandbox's traffic token only: the proxy checks it and presents the
// sandbox's access token to the interpreter instead. A wrong traffic token
// gets nothing, a client's own access token is left alone, the traffic
// token never enters the sandbox, and other ports get no access token.
func TestTrafficTokenOpensTheInterpreter(t *testing.T) {
	ln, err := net.Listen("tcp", net.JoinHostPort("127.0.0.3", strconv.Itoa(proxy.InterpreterPort)))
	if err != nil {
		t.Fatalf("listen on the interpreter's port: %v", err)
	}
	srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		json.NewEncoder(w).Encode(r.Header)
	})}
	go srv.Serve(ln)
	t.Cleanup(func() { srv.Close() })
	front := httptest.NewServer(proxy.New(interpLoopback{}, isKey, nil))
	defer front.Close()
	const id = "i0000000000000000000"
	cases := []struct {
		name, port, traffic, own, wantToken string
	}{
		{"traffic token", strconv.Itoa(proxy.InterpreterPort), "traffic-token-of-" + id, "", "envd-token-of-" + id},
		{"wrong traffic token", strconv.Itoa(proxy.InterpreterPort), "traffic-token-of-other", "", ""},
		{"own access token wins", strconv.Itoa(proxy.InterpreterPort), "traffic-token-of-" + id, "mine", "mine"},
		{"no token", strconv.Itoa(proxy.InterpreterPort), "", "", ""},
	}
	for _, c := range cases {
		req, _ := http.NewRequest("GET", front.URL+"/contexts", nil)
		req.Header.Set("E2b-Sandbox-Id", id)
		req.Header.Set("E2b-Sandbox-Port", c.port)
		if c.traffic != "" {
			req.Header.Set("E2B-Traffic-Access-Token", c.traffic)
		}
		if c.own != "" {
			req.Header.Set("X-Access-Token", c.own)
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		var seen http.Header
		err = json.NewDecoder(resp.Body).Decode(&seen)
		resp.Body.Close()
		if err != nil || resp.StatusCode != 200 {
			t.Fatalf("%s: %d %v", c.name, resp.StatusCode, err)
		}
		if got := seen.Get("X-Access-Token"); got != c.wantToken {
			t.Errorf("%s: the interpreter saw X-Access-Token %q, want %q", c.name, got, c.wantToken)
		}
		if v := seen.Get("E2b-Traffic-Access-Token"); v != "" {
			t.Errorf("%s: the traffic token entered the sandbox: %q", c.name, v)
		}
	}
	// Another port: the traffic token is not exchanged.
	port := echo(t)
	req, _ := http.NewRequest("GET", front.URL+"/", nil)
	req.Header.Set("E2b-Sandbox-Id", id)
	req.Header.Set("E2b-Sandbox-Port", port)
	req.Header.Set("E2B-Traffic-Access-Token", "traffic-token-of-"+id)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if strings.Contains(string(body), "envd-token") || strings.Contains(string(body), "traffic-token") {
		t.Fatalf("a user port got a token: %s", body)
	}
}

// countingResolver records which resolution a request took.
type countingResolver struct {
	loopback
	lookups []string
	signed  int
}

func (c *countingResolver) Lookup(id string) (netip.Addr, bool, bool, <-chan struct{}) {
	c.lookups = append(c.lookups, id)
	return c.loopback.Lookup(id)
}

func (c *countingResolver) SignedBy(context.Context, url.Values, string) (string, error) {
	c.signed++
	return "i0000000000000000002", nil
}

// A presigned /files URL whose Host names its sandbox (the stock SDK's
// form, {port}-{sandboxID}.{domain}) is routed by a lookup of that
// sandbox: no signature search over running sandboxes (envd checks the
// signature). Only a URL with no sandbox in it (built against a single
// E2B_SANDBOX_URL) needs the search.
func TestPresignedURLByHostIsALookup(t *testing.T) {
	port := echo(t)
	res := &countingResolver{}
	front := httptest.NewServer(proxy.New(res, isKey, nil))
	defer front.Close()
	req, _ := http.NewRequest("GET", front.URL+"/files?path=/home/user/a.txt&signature=v1_abc&signature_expiration=9999999999", nil)
	req.Host = port + "-i0000000000000000001.spore.test"
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != 200 || res.signed != 0 || len(res.lookups) != 1 || res.lookups[0] != "i0000000000000000001" {
		t.Fatalf("by host: %d, %d signature searches, lookups %v; want 200, none, [i0000000000000000001]", resp.StatusCode, res.signed, res.lookups)
	}
	req, _ = http.NewRequest("GET", front.URL+"/files?path=/home/user/a.txt&signature=v1_abc", nil)
	resp, err = http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if res.signed != 1 || len(res.lookups) != 2 || res.lookups[1] != "i0000000000000000002" {
		t.Fatalf("bare host: %d signature searches, lookups %v; want 1 and the signer looked up", res.signed, res.lookups)
	}
}

// privateLoopback keeps the ports of sandboxes whose ID starts with "p"
// private.
type privateLoopback struct{ loopback }

func (privateLoopback) PrivateTraffic(_ context.Context, id string) bool {
	return strings.HasPrefix(id, "p")
}

// A private sandbox's ports (E2B's allowPublicTraffic false) take only
// requests with its traffic access token, which never reaches the
// sandbox; envd's port checks its own token; a public sandbox's ports
// need none.
func TestPrivatePortsNeedTheTrafficToken(t *testing.T) {
	port := echo(t)
	front := httptest.NewServer(proxy.New(privateLoopback{}, isKey, nil))
	defer front.Close()
	get := func(id, port, token string) (int, string) {
		req, _ := http.NewRequest("GET", front.URL+"/", nil)
		req.Header.Set("E2b-Sandbox-Id", id)
		req.Header.Set("E2b-Sandbox-Port", port)
		if token != "" {
			req.Header.Set("E2b-Traffic-Access-Token", token)
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(b)
	}
	const priv, pub = "p0000000000000000001", "i0000000000000000001"
	for _, c := range []struct {
		id, token string
		want      int
	}{
		{priv, "", 403},
		{priv, "traffic-token-of-" + pub, 403}, // another sandbox's token
		{priv, "traffic-token-of-" + priv, 200},
		{pub, "", 200},
	} {
		code, body := get(c.id, port, c.token)
		if code != c.want {
			t.Errorf("%s with token %q: %d %s, want %d", c.id, c.token, code, body, c.want)
		}
		if code == 200 && strings.Contains(strings.ToLower(body), "traffic-access-token") {
			t.Errorf("the traffic token reached the sandbox: %s", body)
		}
	}
	// envd's port is not gated by the traffic token (envd checks its own).
	if code, body := get(priv, strconv.Itoa(proxy.DefaultPort), ""); code == 403 {
		t.Errorf("envd's port of a private sandbox: %d %s", code, body)
	}
}

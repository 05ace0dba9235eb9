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

	"github.com/spore-run/spore/internal/proxy"
)

const apiKey = "spore-test-key-0123456789"

// loopback is a Resolver whose every sandbox is 127.0.0.1: the "sandbox"
// is a local server on the port the request names.
type loopback struct{}

func (loopback) Lookup(string) (netip.Addr, bool, bool, <-chan struct{}) {
	return netip.MustParseAddr("127.0.0.1"), true, true, make(chan struct{})
}
func (loopback) SignedBy(url.Values, string) (string, bool) { return "", false }

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

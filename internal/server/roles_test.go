package server

import (
	"bytes"
	"context"
	"crypto/tls"
	"encoding/json"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/spore-run/spore/internal/api"
	"github.com/spore-run/spore/internal/control"
	"github.com/spore-run/spore/internal/control/controltest"
	"github.com/spore-run/spore/internal/errdefs"
	"github.com/spore-run/spore/internal/fleetauth"
	"github.com/spore-run/spore/internal/fleetauth/fleettest"
	"github.com/spore-run/spore/internal/nodeapi"
	"github.com/spore-run/spore/internal/nodeapi/local"
	"github.com/spore-run/spore/internal/nodeapi/rpc"
	"github.com/spore-run/spore/internal/proxy"
	"github.com/spore-run/spore/internal/store"
	"github.com/spore-run/spore/internal/store/sqlite"
)

const testToken = "cluster-token-0123456789abcdef"

func testCtx(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	t.Cleanup(cancel)
	return ctx
}

// hops counts the proxied requests the node server received.
var hops atomic.Int64

// pair is the two sides of a test fleet: node "na"'s and an API replica's.
type pair struct {
	node, replica *fleetauth.Fleet
}

// insecurePair is a fleet of the cluster token (--insecure-fleet).
func insecurePair(t testing.TB) pair {
	f, err := fleetauth.Insecure(testToken, nil)
	if err != nil {
		t.Fatal(err)
	}
	return pair{node: f, replica: f}
}

// securePair is a fleet of mutual TLS: node na (at 127.0.0.1) and
// replica r1, both of one CA.
func securePair(t testing.TB) pair {
	ca := fleettest.New(t)
	return pair{node: ca.Member(t, fleetauth.RoleNode, "na", "127.0.0.1"), replica: ca.Member(t, fleetauth.RoleReplica, "r1")}
}

// both runs a test in an insecure fleet and in one of mutual TLS.
func both(t *testing.T, test func(t *testing.T, p pair)) {
	t.Run("insecure", func(t *testing.T) { test(t, insecurePair(t)) })
	t.Run("mtls", func(t *testing.T) { test(t, securePair(t)) })
}

// nodeServer serves a fake node as `spore node` does (NodeHandler), in
// an insecure fleet.
func nodeServer(t *testing.T) (*controltest.Node, *httptest.Server) {
	return nodeServerIn(t, insecurePair(t))
}

// nodeServerIn serves a fake node "na" as `spore node` does in fleet p:
// over TLS that requires a fleet certificate when p is secure.
func nodeServerIn(t *testing.T, p pair) (*controltest.Node, *httptest.Server) {
	t.Helper()
	n := controltest.New(t)
	ln := local.New(n.Engine, local.Config{ID: "na"})
	nh, err := NodeHandler(testCtx(t), ln, p.node, nil, nil, nil, slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Header.Get("E2b-Sandbox-Id") != "" {
			hops.Add(1)
		}
		nh.ServeHTTP(w, r)
	}))
	srv.Config = rpc.Server(srv.Config.Handler, p.node.ServerTLS(tls.RequireAndVerifyClientCert))
	if p.node.IsSecure() {
		srv.TLS = srv.Config.TLSConfig
		srv.StartTLS()
	} else {
		srv.Start()
	}
	t.Cleanup(srv.Close)
	return n, srv
}

// addrOf is the host:port of a test server.
func addrOf(srv *httptest.Server) string {
	return strings.TrimPrefix(strings.TrimPrefix(srv.URL, "http://"), "https://")
}

// Nothing a node agent serves answers without the cluster token: the RPC
// (no token, a wrong one), the node's proxy (the token in Authorization
// instead of its own header, none), any other path.
func TestNodeRefusesUnauthenticated(t *testing.T) {
	_, srv := nodeServer(t)
	ctx := testCtx(t)
	for _, tc := range []struct {
		name   string
		path   string
		header map[string]string
	}{
		{"rpc without token", "/spore.node.v1.Node/Info", nil},
		{"rpc wrong token", "/spore.node.v1.Node/Info", map[string]string{"Authorization": "Bearer wrong-token-0123456789"}},
		{"proxy without token", "/health", map[string]string{"E2b-Sandbox-Id": "ixxxxxxxxxxxxxxxxxxx"}},
		{"proxy with token as bearer", "/health", map[string]string{"E2b-Sandbox-Id": "ixxxxxxxxxxxxxxxxxxx", "Authorization": "Bearer " + testToken}},
		{"proxy wrong token", "/health", map[string]string{"E2b-Sandbox-Id": "ixxxxxxxxxxxxxxxxxxx", proxy.ClusterTokenHeader: "nope"}},
		{"other path", "/", nil},
	} {
		req, _ := http.NewRequestWithContext(ctx, http.MethodPost, srv.URL+tc.path, strings.NewReader("{}"))
		req.Header.Set("Content-Type", "application/json")
		for k, v := range tc.header {
			req.Header.Set(k, v)
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != http.StatusUnauthorized {
			t.Errorf("%s: %d, want 401", tc.name, resp.StatusCode)
		}
	}
	bad, err := rpc.NewClient(srv.URL, "wrong-token-0123456789", nil)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := bad.Info(ctx); err == nil || !strings.Contains(err.Error(), "cluster token") {
		t.Errorf("rpc with a wrong token: %v, want unauthenticated", err)
	}
	good, _ := rpc.NewClient(srv.URL, testToken, nil)
	if info, err := good.Info(ctx); err != nil || info.ID != "na" {
		t.Fatalf("rpc with the token: %+v %v", info, err)
	}
}

// apiSide is an API replica's control plane over one remote node, in an
// insecure fleet.
func apiSide(t *testing.T, srv *httptest.Server) (*control.Service, store.Store, *registry) {
	return apiSideIn(t, insecurePair(t))
}

// apiSideIn is an API replica's control plane in fleet p.
func apiSideIn(t *testing.T, p pair) (*control.Service, store.Store, *registry) {
	t.Helper()
	st, err := sqlite.Open(context.Background(), filepath.Join(t.TempDir(), "spore.db"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { st.Close() })
	reg := newRegistry(p.replica, slog.New(slog.DiscardHandler))
	ctl := control.New(control.Config{Store: st, Nodes: reg, Hop: reg.hop})
	t.Cleanup(ctl.Close)
	return ctl, st, reg
}

// The registration route refuses a caller without the cluster token (no
// row is written) and registers one with it: the node joins the
// registry and placements reach it.
func TestRegisterRequiresClusterToken(t *testing.T) {
	_, srv := nodeServer(t)
	ctl, st, reg := apiSide(t, srv)
	h := http.NewServeMux()
	h.Handle("PUT "+RegisterPath+"{id}", registerHandler(ctl, st, reg, insecurePair(t).replica, slog.New(slog.DiscardHandler)))
	addr := strings.TrimPrefix(srv.URL, "http://")
	body, _ := json.Marshal(Registration{Info: mustInfo(t, srv), Addr: addr, Joined: true})
	for _, auth := range []string{"", "Bearer wrong-token-0123456789", testToken} {
		req := httptest.NewRequest(http.MethodPut, RegisterPath+"na", bytes.NewReader(body))
		if auth != "" {
			req.Header.Set("Authorization", auth)
		}
		w := httptest.NewRecorder()
		h.ServeHTTP(w, req)
		if w.Code != http.StatusUnauthorized {
			t.Fatalf("registration with Authorization %q: %d, want 401", auth, w.Code)
		}
	}
	if _, err := st.GetNode(testCtx(t), "na"); !errdefs.IsNotFound(err) {
		t.Fatalf("an unauthenticated registration wrote a node: %v", err)
	}
	req := httptest.NewRequest(http.MethodPut, RegisterPath+"na", bytes.NewReader(body))
	req.Header.Set("Authorization", "Bearer "+testToken)
	w := httptest.NewRecorder()
	h.ServeHTTP(w, req)
	if w.Code != http.StatusNoContent {
		t.Fatalf("registration: %d %s", w.Code, w.Body)
	}
	if n, err := st.GetNode(testCtx(t), "na"); err != nil || n.State != store.NodeReady || n.Addr != addr {
		t.Fatalf("node row %+v %v", n, err)
	}
	if _, ok := reg.Node("na"); !ok {
		t.Fatal("the registry has no client for the registered node")
	}
	sb, err := ctl.Create(testCtx(t), control.CreateRequest{Timeout: time.Minute})
	if err != nil || sb.NodeID != "na" {
		t.Fatalf("create over the registered node: %+v %v", sb, err)
	}
}

// An API replica's proxy reaches a sandbox on a remote node through that
// node's proxy: the request arrives at the sandbox's address on the node
// without the cluster token or the API key, streamed.
func TestProxyHopToNode(t *testing.T) { both(t, testProxyHopToNode) }

func testProxyHopToNode(t *testing.T, p pair) {
	_, srv := nodeServerIn(t, p)
	ctl, st, reg := apiSideIn(t, p)
	ctx := testCtx(t)
	addr := addrOf(srv)
	if _, err := ctl.Heartbeat(ctx, "na", addr, mustInfoIn(t, srv, p), true); err != nil {
		t.Fatal(err)
	}
	if err := ctl.Joined(ctx, "na"); err != nil {
		t.Fatal(err)
	}
	if _, err := reg.refresh(ctx, st); err != nil {
		t.Fatal(err)
	}
	sb, err := ctl.Create(ctx, control.CreateRequest{Timeout: time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	// The "sandbox": an HTTP server on its address on the node.
	l, err := net.Listen("tcp", net.JoinHostPort(sb.Addr, "0"))
	if err != nil {
		t.Fatal(err)
	}
	seen := make(chan http.Header, 1)
	inner := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		seen <- r.Header.Clone()
		w.Write([]byte("part1\n"))
		w.(http.Flusher).Flush()
		w.Write([]byte("part2\n"))
	})}
	go inner.Serve(l)
	t.Cleanup(func() { inner.Close() })
	port := l.Addr().(*net.TCPAddr).Port

	key := "spore_testkey"
	px := proxy.New(ctl, func(_ context.Context, k string) bool { return k == key }, nil).WithHop(reg.hopTransport, p.replica.Scheme())
	front := httptest.NewServer(api.New(api.Config{Control: ctl, Store: st, Proxy: px}))
	t.Cleanup(front.Close)
	req, _ := http.NewRequestWithContext(ctx, http.MethodGet, front.URL+"/hello", nil)
	req.Header.Set("E2b-Sandbox-Id", sb.ID)
	req.Header.Set("E2b-Sandbox-Port", strconv.Itoa(port))
	req.Header.Set("X-Api-Key", key)
	req.Header.Set(proxy.ClusterTokenHeader, "smuggled")
	before := hops.Load()
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	b, _ := io.ReadAll(resp.Body)
	if hops.Load() != before+1 {
		t.Fatal("the request did not go through the node's proxy")
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK || string(b) != "part1\npart2\n" {
		t.Fatalf("through the hop: %d %q", resp.StatusCode, b)
	}
	h := <-seen
	for _, name := range []string{proxy.ClusterTokenHeader, "X-Api-Key", "E2b-Sandbox-Id"} {
		if h.Get(name) != "" {
			t.Errorf("the sandbox received %s", name)
		}
	}
}

func mustInfo(t *testing.T, srv *httptest.Server) nodeapi.NodeInfo {
	return mustInfoIn(t, srv, insecurePair(t))
}

// mustInfoIn asks node na for its info as replica of fleet p does.
func mustInfoIn(t *testing.T, srv *httptest.Server, p pair) nodeapi.NodeInfo {
	t.Helper()
	hc := rpc.HTTPClient(p.replica.ClientTLS(fleetauth.IsNode("na")))
	t.Cleanup(hc.CloseIdleConnections)
	c, err := rpc.NewClient(srv.URL, p.replica.Token(), hc)
	if err != nil {
		t.Fatal(err)
	}
	i, err := c.Info(testCtx(t))
	if err != nil {
		t.Fatal(err)
	}
	return i
}

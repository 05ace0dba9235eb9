package server

import (
	"bytes"
	"context"
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

// nodeServer serves a fake node as `spore node` does (NodeHandler).
func nodeServer(t *testing.T) (*controltest.Node, *httptest.Server) {
	t.Helper()
	n := controltest.New(t)
	ln := local.New(n.Engine, local.Config{ID: "na"})
	path, h, err := rpc.NewHandler(ln, testToken)
	if err != nil {
		t.Fatal(err)
	}
	nh := NodeHandler(testCtx(t), ln, path, h, testToken, slog.New(slog.DiscardHandler))
	srv := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Header.Get("E2b-Sandbox-Id") != "" {
			hops.Add(1)
		}
		nh.ServeHTTP(w, r)
	}))
	srv.Config = rpc.Server(srv.Config.Handler, nil)
	srv.Start()
	t.Cleanup(srv.Close)
	return n, srv
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

// apiSide is an API replica's control plane over one remote node.
func apiSide(t *testing.T, srv *httptest.Server) (*control.Service, store.Store, *registry) {
	t.Helper()
	st, err := sqlite.Open(context.Background(), filepath.Join(t.TempDir(), "spore.db"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { st.Close() })
	reg := newRegistry(testToken, slog.New(slog.DiscardHandler))
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
	h.Handle("PUT "+RegisterPath+"{id}", registerHandler(ctl, st, reg, testToken, slog.New(slog.DiscardHandler)))
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
func TestProxyHopToNode(t *testing.T) {
	_, srv := nodeServer(t)
	ctl, st, reg := apiSide(t, srv)
	ctx := testCtx(t)
	addr := strings.TrimPrefix(srv.URL, "http://")
	if _, err := ctl.Heartbeat(ctx, "na", addr, mustInfo(t, srv), true); err != nil {
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
	px := proxy.New(ctl, func(_ context.Context, k string) bool { return k == key }, nil).WithHop(testToken)
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
	t.Helper()
	c, _ := rpc.NewClient(srv.URL, testToken, nil)
	i, err := c.Info(testCtx(t))
	if err != nil {
		t.Fatal(err)
	}
	return i
}

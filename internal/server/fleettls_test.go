package server

import (
	"bytes"
	"crypto/tls"
	"encoding/json"
	"errors"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"connectrpc.com/connect"

	"github.com/spore-run/spore/internal/errdefs"
	"github.com/spore-run/spore/internal/fleetauth"
	"github.com/spore-run/spore/internal/fleetauth/fleettest"
	"github.com/spore-run/spore/internal/nodeapi"
	"github.com/spore-run/spore/internal/nodeapi/rpc"
	"github.com/spore-run/spore/internal/proxy"
	"github.com/spore-run/spore/internal/store"
)

// A node of a fleet with certificates serves its RPC and its proxy to
// API replicas only: another node of the same CA gets Unauthenticated
// and 401s, and a client without a certificate of the fleet's CA gets no
// TLS session at all.
func TestNodeServesOnlyReplicas(t *testing.T) {
	ca := fleettest.New(t)
	p := pair{node: ca.Member(t, fleetauth.RoleNode, "na", "127.0.0.1"), replica: ca.Member(t, fleetauth.RoleReplica, "r1")}
	_, srv := nodeServerIn(t, p)
	ctx := testCtx(t)
	if info := mustInfoIn(t, srv, p); info.ID != "na" {
		t.Fatalf("info through the replica's certificate: %+v", info)
	}
	do := func(f *fleetauth.Fleet, path string, hdr map[string]string) (int, error) {
		hc := f.Client(nil, 0)
		defer hc.CloseIdleConnections()
		req, _ := http.NewRequestWithContext(ctx, http.MethodPost, srv.URL+path, strings.NewReader("{}"))
		req.Header.Set("Content-Type", "application/json")
		for k, v := range hdr {
			req.Header.Set(k, v)
		}
		resp, err := hc.Do(req)
		if err != nil {
			return 0, err
		}
		resp.Body.Close()
		return resp.StatusCode, nil
	}
	hop := map[string]string{"E2b-Sandbox-Id": "ixxxxxxxxxxxxxxxxxxx"}
	// Admitted: the node's proxy answers that the sandbox is not there
	// (503 in transition: the replica looks it up again).
	if code, err := do(p.replica, "/health", hop); err != nil || code != http.StatusServiceUnavailable {
		t.Fatalf("the replica's hop to an unknown sandbox: %d %v, want the node proxy's 503", code, err)
	}
	other := ca.Member(t, fleetauth.RoleNode, "nb")
	for _, tc := range []struct {
		path string
		hdr  map[string]string
		want int
	}{
		{"/spore.node.v1.Node/Info", nil, http.StatusUnauthorized},
		{"/health", hop, http.StatusUnauthorized},
		{"/anything", nil, http.StatusNotFound}, // a member, but nothing there
	} {
		if code, err := do(other, tc.path, tc.hdr); err != nil || code != tc.want {
			t.Errorf("another node: %s: %d %v, want %d", tc.path, code, err, tc.want)
		}
	}
	hc := rpc.HTTPClient(other.ClientTLS(fleetauth.IsNode("na")))
	t.Cleanup(hc.CloseIdleConnections)
	c, _ := rpc.NewClient(srv.URL, "", hc)
	_, err := c.Info(ctx)
	if ce := new(connect.Error); !errors.As(err, &ce) || ce.Code() != connect.CodeUnauthenticated {
		t.Fatalf("another node's RPC: %v, want unauthenticated", err)
	}
	if err == nil || !errors.Is(err, errdefs.ErrInternal) {
		t.Fatalf("another node's RPC: %v, want refused (internal: a misconfigured fleet)", err)
	}
	foreign := fleettest.New(t).Member(t, fleetauth.RoleReplica, "r1")
	if _, err := do(foreign, "/spore.node.v1.Node/Info", nil); err == nil {
		t.Fatal("a replica of another CA got a TLS session")
	}
	plain := &http.Client{Transport: &http.Transport{TLSClientConfig: &tls.Config{InsecureSkipVerify: true}}}
	if resp, err := plain.Get(srv.URL + "/health"); err == nil {
		resp.Body.Close()
		t.Fatalf("a client without a certificate: %d, want no TLS session", resp.StatusCode)
	}
}

// Registration is bound to the certificate: node na registers as na; as
// nb it is refused (403) and no row is written; a replica's certificate or
// none at all is 401.
func TestRegistrationBoundToCertificate(t *testing.T) {
	ca := fleettest.New(t)
	p := pair{node: ca.Member(t, fleetauth.RoleNode, "na", "127.0.0.1"), replica: ca.Member(t, fleetauth.RoleReplica, "r1")}
	_, nsrv := nodeServerIn(t, p)
	ctl, st, reg := apiSideIn(t, p)
	mux := http.NewServeMux()
	mux.Handle("PUT "+RegisterPath+"{id}", registerHandler(ctl, st, reg, p.replica, slog.New(slog.DiscardHandler)))
	srv := httptest.NewUnstartedServer(mux)
	srv.TLS = p.replica.ServerTLS(tls.VerifyClientCertIfGiven)
	srv.StartTLS()
	t.Cleanup(srv.Close)
	ctx := testCtx(t)
	body, _ := json.Marshal(Registration{Info: mustInfoIn(t, nsrv, p), Addr: addrOf(nsrv), Joined: true})
	put := func(f *fleetauth.Fleet, id string) int {
		var hc *http.Client
		if f != nil {
			hc = f.Client(fleetauth.IsRole(fleetauth.RoleReplica), 0)
		} else {
			hc = &http.Client{Transport: &http.Transport{TLSClientConfig: &tls.Config{InsecureSkipVerify: true}}}
		}
		defer hc.CloseIdleConnections()
		req, _ := http.NewRequestWithContext(ctx, http.MethodPut, srv.URL+RegisterPath+id, bytes.NewReader(body))
		resp, err := hc.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		return resp.StatusCode
	}
	if code := put(p.node, "nb"); code != http.StatusForbidden {
		t.Fatalf("node na registering as nb: %d, want 403", code)
	}
	if code := put(p.replica, "na"); code != http.StatusUnauthorized {
		t.Fatalf("a replica's certificate registering a node: %d, want 401", code)
	}
	if code := put(nil, "na"); code != http.StatusUnauthorized {
		t.Fatalf("no certificate: %d, want 401", code)
	}
	for _, id := range []string{"na", "nb"} {
		if _, err := st.GetNode(ctx, id); !errdefs.IsNotFound(err) {
			t.Fatalf("a refused registration wrote node %s: %v", id, err)
		}
	}
	if code := put(p.node, "na"); code != http.StatusNoContent {
		t.Fatalf("node na registering as na: %d, want 204", code)
	}
	if n, err := st.GetNode(ctx, "na"); err != nil || n.State != store.NodeReady {
		t.Fatalf("node row %+v %v", n, err)
	}
}

// The node's proxy answers 503 with Retry-After (not the 502 of a sandbox
// that is not there) for a sandbox the replica in front saw running but
// that is paused on the node: it is being paused or hibernated (a drain),
// and a retry reaches it once resumed.
func TestNodeProxyTransitionIs503(t *testing.T) {
	p, srv, ln := insecureNodeClient(t)
	ctx := testCtx(t)
	sb, err := ln.Create(ctx, nodeapi.CreateRequest{SandboxID: "itransit000000000001", AccessToken: "tok-0123456789abcdef", Template: "base"})
	if err != nil {
		t.Fatal(err)
	}
	if err := ln.Pause(ctx, sb.ID); err != nil {
		t.Fatal(err)
	}
	req, _ := http.NewRequestWithContext(ctx, http.MethodGet, srv.URL+"/health", nil)
	req.Header.Set("E2b-Sandbox-Id", sb.ID)
	resp, err := p.replica.Client(nil, 0).Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusServiceUnavailable || resp.Header.Get("Retry-After") == "" {
		t.Fatalf("a paused sandbox through the node's proxy: %d (Retry-After %q), want 503 with Retry-After", resp.StatusCode, resp.Header.Get("Retry-After"))
	}
	req, _ = http.NewRequestWithContext(ctx, http.MethodGet, srv.URL+"/health", nil)
	req.Header.Set("E2b-Sandbox-Id", "inotthere00000000001")
	resp, err = p.replica.Client(nil, 0).Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	// Not on this node (its hibernation or move ended before the
	// replica's row caught up): a transition too, which the replica sends
	// again after looking the sandbox up (proxy.forwardReplaying).
	if resp.StatusCode != http.StatusServiceUnavailable || resp.Header.Get(proxy.TransitionHeader) == "" {
		t.Fatalf("an unknown sandbox through the node's proxy: %d (%s %q), want 503 in transition", resp.StatusCode, proxy.TransitionHeader, resp.Header.Get(proxy.TransitionHeader))
	}
}

// The node RPC's Quiesce reaches the node's proxy in front of its
// sandboxes (gatedNode): after it a request to the sandbox gets the
// transition 503 (the replica sends it again), not forwarded; the
// sandbox's next lifecycle call (here a pause and resume: a hibernation
// that did not come) lifts the mark. An unknown sandbox is NotFound.
func TestNodeRPCQuiesceMarksTheNodeProxy(t *testing.T) {
	p, srv, ln := insecureNodeClient(t)
	ctx := testCtx(t)
	sb, err := ln.Create(ctx, nodeapi.CreateRequest{SandboxID: "iquiesce000000000009", AccessToken: "tok-0123456789abcdef", Template: "base"})
	if err != nil {
		t.Fatal(err)
	}
	through := func() (int, string) {
		req, _ := http.NewRequestWithContext(ctx, http.MethodGet, srv.URL+"/health", nil)
		req.Header.Set("E2b-Sandbox-Id", sb.ID)
		resp, err := p.replica.Client(nil, 0).Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(b)
	}
	if code, body := through(); strings.Contains(body, "being hibernated") {
		t.Fatalf("before the quiesce: %d %s", code, body)
	}
	if n, err := ln.Quiesce(ctx, sb.ID, 5*time.Second); err != nil || n != 0 {
		t.Fatalf("quiesce: %d in flight, %v", n, err)
	}
	if code, body := through(); code != http.StatusServiceUnavailable || !strings.Contains(body, "being hibernated") {
		t.Fatalf("after the quiesce: %d %s, want the transition 503", code, body)
	}
	if err := ln.Pause(ctx, sb.ID); err != nil {
		t.Fatal(err)
	}
	if _, err := ln.Resume(ctx, sb.ID); err != nil {
		t.Fatal(err)
	}
	if code, body := through(); strings.Contains(body, "being hibernated") {
		t.Fatalf("after a pause and resume the mark stayed: %d %s", code, body)
	}
	if _, err := ln.Quiesce(ctx, "inotthere00000000001", time.Second); !errdefs.IsNotFound(err) {
		t.Fatalf("quiesce of an unknown sandbox: %v, want not found", err)
	}
	if _, err := ln.Quiesce(ctx, sb.ID, time.Hour); !errdefs.IsInvalidArgument(err) {
		t.Fatalf("quiesce with a grace over the bound: %v, want invalid", err)
	}
}

// insecureNodeClient serves a node of an insecure fleet and returns the
// fleet's members, the node's server and a node RPC client of it.
func insecureNodeClient(t *testing.T) (pair, *httptest.Server, *rpc.Client) {
	p := insecurePair(t)
	_, srv := nodeServerIn(t, p)
	hc := rpc.HTTPClient(nil)
	t.Cleanup(hc.CloseIdleConnections)
	ln, err := rpc.NewClient(srv.URL, testToken, hc)
	if err != nil {
		t.Fatal(err)
	}
	return p, srv, ln
}

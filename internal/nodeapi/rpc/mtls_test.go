package rpc

import (
	"crypto/tls"
	"errors"
	"net/http"
	"net/http/httptest"
	"testing"

	"connectrpc.com/connect"

	"github.com/spore-run/spore/internal/errdefs"
	"github.com/spore-run/spore/internal/fleetauth"
	"github.com/spore-run/spore/internal/fleetauth/fleettest"
)

// A node of a fleet with certificates answers only API replicas of its
// CA, over TLS 1.3, and a replica checks that it reached the node it
// meant: another node, a foreign CA's replica, a client without a
// certificate or with only the old cluster token get nothing from it.
func TestMutualTLS(t *testing.T) {
	ca := fleettest.New(t)
	nodeF := ca.Member(t, fleetauth.RoleNode, "n1", "127.0.0.1")
	path, h, err := NewFleetHandler(&stubNode{err: errdefs.NotFoundf("stub")}, nodeF)
	if err != nil {
		t.Fatal(err)
	}
	mux := http.NewServeMux()
	mux.Handle(path, h)
	srv := httptest.NewUnstartedServer(mux)
	srv.Config = Server(mux, nodeF.ServerTLS(tls.RequireAndVerifyClientCert))
	srv.TLS = srv.Config.TLSConfig
	srv.StartTLS()
	t.Cleanup(srv.Close)
	ctx := ctxFor(t)

	call := func(hc *http.Client, token string) error {
		t.Cleanup(hc.CloseIdleConnections)
		c, err := NewClient(srv.URL, token, hc)
		if err != nil {
			t.Fatal(err)
		}
		_, err = c.Get(ctx, "x")
		return err
	}
	replica := ca.Member(t, fleetauth.RoleReplica, "r1")
	if err := call(HTTPClient(replica.ClientTLS(fleetauth.IsNode("n1"))), ""); !errdefs.IsNotFound(err) {
		t.Fatalf("a replica calling n1: %v, want the node's not found", err)
	}
	if err := call(HTTPClient(replica.ClientTLS(fleetauth.IsNode("n2"))), ""); err == nil || errdefs.IsNotFound(err) {
		t.Fatalf("a replica that meant n2 but reached n1: %v, want a refusal", err)
	}
	otherNode := ca.Member(t, fleetauth.RoleNode, "n2")
	err = call(HTTPClient(otherNode.ClientTLS(fleetauth.IsNode("n1"))), "")
	if ce := new(connect.Error); !errors.As(err, &ce) || ce.Code() != connect.CodeUnauthenticated {
		t.Fatalf("a node calling another node's RPC: %v, want unauthenticated", err)
	}
	foreign := fleettest.New(t).Member(t, fleetauth.RoleReplica, "r1")
	if err := call(HTTPClient(foreign.ClientTLS(nil)), ""); err == nil || errdefs.IsNotFound(err) {
		t.Fatalf("a replica of another CA: %v, want a refusal", err)
	}
	noCert := &tls.Config{MinVersion: tls.VersionTLS13, InsecureSkipVerify: true}
	if err := call(HTTPClient(noCert), newToken()); err == nil || errdefs.IsNotFound(err) {
		t.Fatalf("a client without a certificate: %v, want a refusal", err)
	}
}

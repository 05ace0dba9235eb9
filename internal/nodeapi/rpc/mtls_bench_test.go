package rpc

import (
	"crypto/tls"
	"net/http"
	"net/http/httptest"
	"testing"

	"github.com/spore-run/spore/internal/errdefs"
	"github.com/spore-run/spore/internal/fleetauth"
	"github.com/spore-run/spore/internal/fleetauth/fleettest"
)

// BenchmarkCallTransport is one node call (a Get the node answers at
// once) over the insecure fleet's h2c with the token, and over mutual
// TLS, on kept-alive connections: what fleet TLS adds to each call.
//
//	go test -run '^$' -bench CallTransport -benchtime 3000x ./internal/nodeapi/rpc/
func BenchmarkCallTransport(b *testing.B) {
	stub := &stubNode{err: errdefs.NotFoundf("stub")}
	run := func(b *testing.B, srv *httptest.Server, hc *http.Client, token string) {
		c, err := NewClient(srv.URL, token, hc)
		if err != nil {
			b.Fatal(err)
		}
		ctx := b.Context()
		c.Get(ctx, "x") // the connection, and for TLS the handshake
		b.ResetTimer()
		for b.Loop() {
			if _, err := c.Get(ctx, "x"); !errdefs.IsNotFound(err) {
				b.Fatal(err)
			}
		}
	}
	b.Run("h2c-token", func(b *testing.B) {
		token := newToken()
		path, h, _ := NewHandler(stub, token)
		mux := http.NewServeMux()
		mux.Handle(path, h)
		srv := httptest.NewUnstartedServer(mux)
		srv.Config = Server(mux, nil)
		srv.Start()
		defer srv.Close()
		hc := HTTPClient(nil)
		defer hc.CloseIdleConnections()
		run(b, srv, hc, token)
	})
	b.Run("mtls", func(b *testing.B) {
		ca := fleettest.New(b)
		node, replica := ca.Member(b, fleetauth.RoleNode, "n1"), ca.Member(b, fleetauth.RoleReplica, "r1")
		path, h, _ := NewFleetHandler(stub, node)
		mux := http.NewServeMux()
		mux.Handle(path, h)
		srv := httptest.NewUnstartedServer(mux)
		srv.Config = Server(mux, node.ServerTLS(tls.RequireAndVerifyClientCert))
		srv.TLS = srv.Config.TLSConfig
		srv.StartTLS()
		defer srv.Close()
		hc := HTTPClient(replica.ClientTLS(fleetauth.IsNode("n1")))
		defer hc.CloseIdleConnections()
		run(b, srv, hc, "")
	})
}

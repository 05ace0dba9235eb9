package proxy_test

import (
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/spore-run/spore/internal/proxy"
)

// The totals (metrics) count each request once by the status the client
// got, whether it was forwarded, and the body bytes both ways; a request
// the proxy answers itself (no sandbox named) counts as not forwarded.
func TestTotals(t *testing.T) {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		b, _ := io.ReadAll(r.Body)
		w.WriteHeader(http.StatusCreated)
		w.Write(append([]byte("got "), b...))
	}))
	defer srv.Close()
	_, port, _ := net.SplitHostPort(srv.Listener.Addr().String())
	p := proxy.New(loopback{}, isKey, nil)
	front := httptest.NewServer(p)
	defer front.Close()

	send := func(sandboxID, body string) int {
		req, _ := http.NewRequest("POST", front.URL+"/", strings.NewReader(body))
		if sandboxID != "" {
			req.Header.Set("E2b-Sandbox-Id", sandboxID)
			req.Header.Set("E2b-Sandbox-Port", port)
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		io.ReadAll(resp.Body)
		resp.Body.Close()
		return resp.StatusCode
	}
	if c := send("i0000000000000000000", "hello"); c != 201 {
		t.Fatalf("forwarded = %d", c)
	}
	if c := send("i0000000000000000000", "sixsix"); c != 201 {
		t.Fatalf("forwarded = %d", c)
	}
	if c := send("", "x"); c != 400 {
		t.Fatalf("no sandbox named = %d", c)
	}
	got := p.Totals()
	if got.Requests[201] != 2 || got.Requests[400] != 1 || got.Forwarded != 2 || got.BytesIn != 5+6 || got.BytesOut < int64(len("got hello")+len("got sixsix")) {
		t.Fatalf("totals = %+v", got)
	}
}

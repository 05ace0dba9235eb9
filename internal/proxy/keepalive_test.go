package proxy_test

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/spore-run/spore/internal/proxy"
)

// A response that starts before the client has sent its request body gets
// through the proxy, the body reaches the sandbox whole, and the client's
// connection stays open for the next exchange (keep-alive). This is the
// stock SDK's failure on reused connections made deterministic: net/http's
// server, sending the response headers of a keep-alive exchange, drained
// the request body the proxy's transport was forwarding (here it waits
// for the body the client sends only after "ready": stuck; under load with
// a body already sent, the transport's last read found it closed and cut
// the sandbox's response). With Connection: close on every exchange, the
// second request on the connection fails instead.
func TestResponseBeforeRequestBodyKeepsConnection(t *testing.T) {
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method == http.MethodGet {
			io.WriteString(w, "unary")
			return
		}
		rc := http.NewResponseController(w)
		rc.EnableFullDuplex()
		io.WriteString(w, "ready\n")
		rc.Flush()
		b, err := io.ReadAll(r.Body)
		fmt.Fprintf(w, "got %d bytes %q err %v", len(b), b, err)
	}))
	defer up.Close()
	_, port, _ := net.SplitHostPort(up.Listener.Addr().String())
	front := httptest.NewServer(proxy.New(loopback{}, isKey, nil))
	defer front.Close()

	c, err := net.Dial("tcp", front.Listener.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	// Generous: the steps must happen at all, not fast.
	c.SetDeadline(time.Now().Add(20 * time.Second))
	br := bufio.NewReader(c)
	body := "the request body"
	fmt.Fprintf(c, "POST /stream HTTP/1.1\r\nHost: x\r\nE2b-Sandbox-Id: i0000000000000000000\r\nE2b-Sandbox-Port: %s\r\nContent-Length: %d\r\n\r\n", port, len(body))
	resp, err := http.ReadResponse(br, nil)
	if err != nil {
		t.Fatalf("no response before the request body was sent: %v", err)
	}
	if resp.Close {
		t.Errorf("the response closes the connection")
	}
	ready := make([]byte, len("ready\n"))
	if _, err := io.ReadFull(resp.Body, ready); err != nil || string(ready) != "ready\n" {
		t.Fatalf("stream start: %q %v", ready, err)
	}
	io.WriteString(c, body)
	rest, err := io.ReadAll(resp.Body)
	if want := fmt.Sprintf("got %d bytes %q err <nil>", len(body), body); err != nil || string(rest) != want {
		t.Fatalf("stream end: %q %v, want %q", rest, err, want)
	}

	// The same connection carries the next exchange.
	fmt.Fprintf(c, "GET /unary HTTP/1.1\r\nHost: x\r\nE2b-Sandbox-Id: i0000000000000000000\r\nE2b-Sandbox-Port: %s\r\n\r\n", port)
	resp, err = http.ReadResponse(br, nil)
	if err != nil {
		t.Fatalf("second exchange on the connection: %v", err)
	}
	b, err := io.ReadAll(resp.Body)
	if err != nil || string(b) != "unary" {
		t.Fatalf("second exchange: %q %v", b, err)
	}
}

// Many exchanges of the SDK's shapes (a server stream answering a POST
// with a Content-Length body, uploads larger than the server's 256 KiB
// drain limit, unary calls) share one client connection: none is refused,
// cut or made to close it.
func TestStreamsAndUploadsReuseOneConnection(t *testing.T) {
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		n, _ := io.Copy(io.Discard, r.Body)
		if r.URL.Path == "/stream" {
			for i := range 5 {
				fmt.Fprintf(w, "event %d of %d bytes\n", i, n)
				http.NewResponseController(w).Flush()
			}
			return
		}
		fmt.Fprintf(w, "%d", n)
	}))
	defer up.Close()
	_, port, _ := net.SplitHostPort(up.Listener.Addr().String())
	front := httptest.NewServer(proxy.New(loopback{}, isKey, nil))
	defer front.Close()

	var dials atomic.Int32
	client := &http.Client{Transport: &http.Transport{MaxConnsPerHost: 1,
		DialContext: func(ctx context.Context, network, addr string) (net.Conn, error) {
			dials.Add(1)
			return (&net.Dialer{}).DialContext(ctx, network, addr)
		}}}
	defer client.CloseIdleConnections()
	big := strings.Repeat("x", 300<<10)
	do := func(method, path, body, want string) {
		t.Helper()
		var rd io.Reader
		if body != "" {
			rd = strings.NewReader(body)
		}
		req, _ := http.NewRequest(method, front.URL+path, rd)
		req.Header.Set("E2b-Sandbox-Id", "i0000000000000000000")
		req.Header.Set("E2b-Sandbox-Port", port)
		resp, err := client.Do(req)
		if err != nil {
			t.Fatalf("%s %s: %v", method, path, err)
		}
		b, err := io.ReadAll(resp.Body)
		resp.Body.Close()
		if err != nil || string(b) != want {
			t.Fatalf("%s %s: %q %v, want %q", method, path, b, err, want)
		}
		if resp.Close {
			t.Fatalf("%s %s: the response closes the connection", method, path)
		}
	}
	stream := ""
	for i := range 5 {
		stream += fmt.Sprintf("event %d of 16 bytes\n", i)
	}
	for range 50 {
		do("POST", "/stream", `{"cmd":"true"}..`, stream)
		do("POST", "/files", big, fmt.Sprint(len(big)))
		do("GET", "/files", "", "0")
	}
	if n := dials.Load(); n != 1 {
		t.Fatalf("150 exchanges took %d connections, want 1", n)
	}
}

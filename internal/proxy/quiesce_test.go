package proxy_test

import (
	"context"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/spore-run/spore/internal/proxy"
)

// quiesceRig is a node-side proxy in front of a "sandbox" whose answers
// to /hold wait until the test releases them (others answer at once).
type quiesceRig struct {
	px      *proxy.Proxy
	url     string
	port    string
	entered chan struct{}
	release chan struct{}
	stop    chan struct{} // closed at the end: every held answer goes
}

func newQuiesceRig(t *testing.T) *quiesceRig {
	r := &quiesceRig{entered: make(chan struct{}, 8), release: make(chan struct{}), stop: make(chan struct{})}
	app := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
		if req.URL.Path == "/hold" {
			r.entered <- struct{}{}
			select {
			case <-r.release:
			case <-r.stop:
			}
		}
		io.WriteString(w, "answered")
	}))
	t.Cleanup(app.Close)
	_, r.port, _ = net.SplitHostPort(app.Listener.Addr().String())
	r.px = proxy.New(loopback{}, isKey, nil).AsNodeSide()
	srv := httptest.NewServer(r.px)
	t.Cleanup(srv.Close)
	t.Cleanup(func() { close(r.stop) }) // first: the servers' Close waits for held answers
	r.url = srv.URL
	return r
}

// send makes a request to sandbox id through the proxy and returns its
// status, transition header and body; hold: one the sandbox answers only
// when released.
func (r *quiesceRig) send(t *testing.T, id string, hold bool) (int, string, string) {
	path := "/now"
	if hold {
		path = "/hold"
	}
	req, _ := http.NewRequest(http.MethodPost, r.url+path, strings.NewReader("{}"))
	req.Header.Set("E2b-Sandbox-Id", id)
	req.Header.Set("E2b-Sandbox-Port", r.port)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Error(err)
		return 0, "", ""
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, resp.Header.Get(proxy.TransitionHeader), string(b)
}

// A drain's Quiesce waits for the request in flight to the sandbox to
// answer (it is not cut), while a new request to that sandbox gets the
// transition 503 (never forwarded: the replica sends it again) and one
// to another sandbox goes through; after Unquiesce requests pass again.
func TestQuiesceWaitsForRequestsInFlight(t *testing.T) {
	r := newQuiesceRig(t)
	const id, other = "iquiesce000000000001", "iquiesce000000000002"
	first := make(chan string, 1)
	go func() {
		code, _, body := r.send(t, id, true)
		first <- body
		if code != http.StatusOK {
			t.Errorf("the request in flight: %d %q", code, body)
		}
	}()
	<-r.entered
	left := make(chan int, 1)
	go func() { left <- r.px.Quiesce(context.Background(), id, time.Minute) }()

	// Until the mark is set a new request may still pass (it is then
	// answered, and the next tried).
	deadline := time.Now().Add(10 * time.Second)
	for {
		type answer struct {
			code     int
			tr, body string
		}
		got := make(chan answer, 1)
		go func() {
			code, tr, body := r.send(t, id, false)
			got <- answer{code, tr, body}
		}()
		a := <-got
		if a.code == http.StatusOK && time.Now().Before(deadline) {
			continue // forwarded: before the mark
		}
		if a.code != http.StatusServiceUnavailable || a.tr != "1" || !strings.Contains(a.body, "being hibernated") {
			t.Fatalf("a new request while quiesced: %d transition %q %q", a.code, a.tr, a.body)
		}
		break
	}
	select {
	case n := <-left:
		t.Fatalf("Quiesce returned %d with a request in flight", n)
	default:
	}
	if code, _, body := r.send(t, other, false); code != http.StatusOK {
		t.Fatalf("another sandbox's request: %d %q", code, body)
	}
	r.release <- struct{}{}
	if body := <-first; body != "answered" {
		t.Fatalf("the request in flight got %q", body)
	}
	if n := <-left; n != 0 {
		t.Fatalf("Quiesce: %d still in flight, want 0", n)
	}
	r.px.Unquiesce(id)
	if code, _, body := r.send(t, id, false); code != http.StatusOK {
		t.Fatalf("after Unquiesce: %d %q", code, body)
	}
}

// A request still open when the grace ends (a background command's
// stream) is counted, not waited for longer; ctx ends the wait too.
func TestQuiesceGraceBoundsTheWait(t *testing.T) {
	r := newQuiesceRig(t)
	const id = "iquiesce000000000003"
	done := make(chan struct{})
	go func() {
		r.send(t, id, true)
		close(done)
	}()
	<-r.entered
	if n := r.px.Quiesce(context.Background(), id, 200*time.Millisecond); n != 1 {
		t.Fatalf("Quiesce after its grace: %d in flight, want 1", n)
	}
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if n := r.px.Quiesce(ctx, id, time.Hour); n != 1 {
		t.Fatalf("Quiesce with its ctx ended: %d in flight, want 1", n)
	}
	close(r.release)
	<-done
	if n := r.px.Quiesce(context.Background(), id, time.Hour); n != 0 {
		t.Fatalf("Quiesce with nothing in flight: %d", n)
	}
}

package proxy_test

import (
	"context"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"net/url"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/spore-run/spore/internal/errdefs"
	"github.com/spore-run/spore/internal/proxy"
)

const movingID = "imoving0000000000001"

// moving is a replica's view of one sandbox (a Hopper and Waker): running
// behind the node proxy at via until hibernated; a wake (autoResume)
// resumes it behind next. Like control's LookupVia, a hibernated or
// killed sandbox is not found.
type moving struct {
	mu               sync.Mutex
	via, next        string
	hibernated, dead bool
	autoResume       bool
	wakes            int
	// gone, when set, is the instance's gone channel (closed when the
	// row says it went); otherwise each lookup gets one never closed.
	gone chan struct{}
}

func (m *moving) LookupVia(string) (string, netip.Addr, bool, bool, <-chan struct{}) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.hibernated || m.dead {
		return "", netip.Addr{}, false, false, nil
	}
	if m.gone != nil {
		return m.via, netip.MustParseAddr("127.0.0.1"), true, true, m.gone
	}
	return m.via, netip.MustParseAddr("127.0.0.1"), true, true, make(chan struct{})
}

func (m *moving) Lookup(id string) (netip.Addr, bool, bool, <-chan struct{}) {
	_, a, r, f, g := m.LookupVia(id)
	return a, r, f, g
}

func (m *moving) Wake(context.Context, string) (bool, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if !m.hibernated || !m.autoResume {
		return false, nil
	}
	m.hibernated, m.via = false, m.next
	m.wakes++
	return true, nil
}

func (*moving) SignedBy(context.Context, url.Values, string) (string, error) {
	return "", errdefs.ErrNotFound
}
func (*moving) TrafficAllowed(context.Context, string, string) (string, bool) { return "", false }

func (m *moving) set(f func(m *moving)) {
	m.mu.Lock()
	defer m.mu.Unlock()
	f(m)
}

// pausedHere is a node's resolver for a sandbox it holds paused: its
// proxy answers that the sandbox is in transition. Each lookup calls
// onLookup with how many there were.
type pausedHere struct {
	loopback
	n        atomic.Int32
	onLookup func(n int)
	notHere  bool // the node no longer holds the sandbox at all
}

func (p *pausedHere) Lookup(string) (netip.Addr, bool, bool, <-chan struct{}) {
	if n := int(p.n.Add(1)); p.onLookup != nil {
		p.onLookup(n)
	}
	return netip.MustParseAddr("127.0.0.1"), false, !p.notHere, nil
}

// replayRig is a replica's proxy in front of two nodes' proxies: on node
// A the sandbox is being hibernated (paused there), on node B it runs
// (the sandbox is a local server that echoes the body, counting requests).
type replayRig struct {
	sb       *moving
	nodeA    *pausedHere
	replica  *httptest.Server
	port     string // the sandbox's
	requests atomic.Int32
	answer   func(w http.ResponseWriter) // the sandbox's own answer, when set
}

func newReplayRig(t *testing.T, answer func(w http.ResponseWriter)) *replayRig {
	return newReplayRigWith(t, answer, &pausedHere{}, nil)
}

// newReplayRigWith is newReplayRig with node A's resolver, and wrap (when
// set) around node A's proxy.
func newReplayRigWith(t *testing.T, answer func(w http.ResponseWriter), nodeA *pausedHere, wrap func(http.Handler) http.Handler) *replayRig {
	rig := &replayRig{nodeA: nodeA, answer: answer}
	app := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		rig.requests.Add(1)
		if rig.answer != nil {
			rig.answer(w)
			return
		}
		b, _ := io.ReadAll(r.Body)
		w.Write(append([]byte("got "), b...))
	}))
	t.Cleanup(app.Close)
	_, rig.port, _ = net.SplitHostPort(app.Listener.Addr().String())
	var nodeAProxy http.Handler = proxy.New(rig.nodeA, isKey, nil).AsNodeSide()
	if wrap != nil {
		nodeAProxy = wrap(nodeAProxy)
	}
	a := httptest.NewServer(nodeAProxy)
	t.Cleanup(a.Close)
	b := httptest.NewServer(proxy.New(loopback{}, isKey, nil).AsNodeSide())
	t.Cleanup(b.Close)
	host := func(s *httptest.Server) string { return strings.TrimPrefix(s.URL, "http://") }
	rig.sb = &moving{via: host(a), next: host(b), autoResume: true}
	hop := func(string) http.RoundTripper { return http.DefaultTransport }
	rig.replica = httptest.NewServer(proxy.New(rig.sb, isKey, nil).WithHop(hop, "http"))
	t.Cleanup(rig.replica.Close)
	return rig
}

func (rig *replayRig) post(t *testing.T, body string) (int, http.Header, string) {
	t.Helper()
	req, _ := http.NewRequest(http.MethodPost, rig.replica.URL+"/process.Process/Start", strings.NewReader(body))
	req.Header.Set("E2b-Sandbox-Id", movingID)
	req.Header.Set("E2b-Sandbox-Port", rig.port)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, resp.Header, string(b)
}

// A request a replica forwards to a sandbox that its node is hibernating
// (a drain: the node's proxy answers 503, in transition) is sent again
// once the hibernation is recorded, to the node the sandbox (autoResume)
// wakes on: the client gets the sandbox's answer, and the sandbox got the
// request once, body and all. Before, the client got the 503, which the
// stock SDK reports on a command's start as "Sandbox is probably not
// running anymore" (TestRollingUpgrade).
func TestReplicaSendsAgainOnceTheSandboxMoved(t *testing.T) {
	rig := newReplayRig(t, nil)
	rig.nodeA.onLookup = func(n int) {
		if n == 2 { // the hibernation is recorded after two tries reached node A
			rig.sb.set(func(m *moving) { m.hibernated = true })
		}
	}
	code, _, body := rig.post(t, "echo op-1 >> /home/user/ops")
	if code != http.StatusOK || body != "got echo op-1 >> /home/user/ops" {
		t.Fatalf("through a hibernation: %d %q, want 200 and the sandbox's answer", code, body)
	}
	var wakes int
	rig.sb.set(func(m *moving) { wakes = m.wakes })
	if n, got := rig.nodeA.n.Load(), rig.requests.Load(); n != 2 || got != 1 || wakes != 1 {
		t.Fatalf("node A looked up %d times (want 2), the sandbox got %d requests (want 1), %d wakes (want 1)", n, got, wakes)
	}
}

// A request that reaches node A after its hibernation ended there but
// before the replica's row says so: node A no longer holds the sandbox.
// Its proxy answers as for a transition (the request was not forwarded),
// and the replica sends it again where the sandbox woke. Before, node A
// answered 502 "not found", which the client got (TestRollingUpgrade:
// "Sandbox is probably not running anymore" during a drain).
func TestReplicaSendsAgainWhenTheNodeNoLongerHoldsTheSandbox(t *testing.T) {
	rig := newReplayRigWith(t, nil, &pausedHere{notHere: true}, nil)
	rig.nodeA.onLookup = func(n int) {
		if n == 2 {
			rig.sb.set(func(m *moving) { m.hibernated = true })
		}
	}
	code, _, body := rig.post(t, "echo op-4")
	if code != http.StatusOK || body != "got echo op-4" || rig.requests.Load() != 1 {
		t.Fatalf("%d %q, %d requests: want 200 and the sandbox's answer, once", code, body, rig.requests.Load())
	}
}

// The replica's row says the sandbox's instance went (the drain recorded
// its hibernation) while a request waits for node A's answer: the replica
// lets node A answer (it is in transition there: the request never
// entered the sandbox) and sends the request again where the sandbox
// woke. Before, the replica ended the exchange when the row changed and
// the client got a 502 "went away" for a request that never ran
// (TestRollingUpgrade, op-4 during node-1's drain).
func TestReplicaLetsTheNodeAnswerWhenTheInstanceGoes(t *testing.T) {
	var once sync.Once
	var rig *replayRig
	wrap := func(next http.Handler) http.Handler {
		return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			once.Do(func() {
				// The row changes while node A holds the first try; the
				// old replica cut the exchange at once (its hop
				// request's context ends here).
				rig.sb.set(func(m *moving) { m.hibernated = true; close(m.gone) })
				select {
				case <-r.Context().Done():
				case <-time.After(500 * time.Millisecond):
				}
			})
			next.ServeHTTP(w, r)
		})
	}
	rig = newReplayRigWith(t, nil, &pausedHere{}, wrap)
	rig.sb.set(func(m *moving) { m.gone = make(chan struct{}) })
	code, _, body := rig.post(t, "echo op-4")
	if code != http.StatusOK || body != "got echo op-4" || rig.requests.Load() != 1 {
		t.Fatalf("%d %q, %d requests: want 200 and the sandbox's answer, once", code, body, rig.requests.Load())
	}
}

// A node that does not answer once the instance went (lost with its
// sandboxes): the replica ends the exchange itself after the grace, with
// the 502 that says the sandbox went away.
func TestReplicaEndsAnExchangeTheNodeNeverAnswers(t *testing.T) {
	var rig *replayRig
	hold := make(chan struct{})
	wrap := func(http.Handler) http.Handler {
		return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			rig.sb.set(func(m *moving) { m.dead = true; close(m.gone) })
			select {
			case <-r.Context().Done():
			case <-hold:
			}
		})
	}
	rig = newReplayRigWith(t, nil, &pausedHere{}, wrap)
	t.Cleanup(func() { close(hold) }) // before the servers close: they wait for their handlers
	rig.sb.set(func(m *moving) { m.gone = make(chan struct{}) })
	proxy.SetViaGoneGrace(rig.replica.Config.Handler.(*proxy.Proxy), 100*time.Millisecond)
	if code, _, body := rig.post(t, "x"); code != http.StatusBadGateway || !strings.Contains(body, "went away") {
		t.Fatalf("%d %q: want 502 saying the sandbox went away", code, body)
	}
}

// What a replica does not send again: a sandbox's own 503, even one that
// names a transition (its node's proxy removes that header: only the
// node's proxy says so); a body over the bound; a sandbox still in
// transition when the bound passes (the client gets the 503 with
// Retry-After); a sandbox killed meanwhile (502).
func TestReplicaSendsAgainOnlyWhatNeverReachedTheSandbox(t *testing.T) {
	t.Run("sandbox's own 503", func(t *testing.T) {
		rig := newReplayRig(t, func(w http.ResponseWriter) {
			w.Header().Set(proxy.TransitionHeader, "1")
			w.WriteHeader(http.StatusServiceUnavailable)
		})
		rig.sb.set(func(m *moving) { m.via = m.next })
		code, h, _ := rig.post(t, "x")
		if code != http.StatusServiceUnavailable || h.Get(proxy.TransitionHeader) != "" || rig.requests.Load() != 1 {
			t.Fatalf("%d, header %q, %d requests: want the sandbox's 503 once, the header removed", code, h.Get(proxy.TransitionHeader), rig.requests.Load())
		}
	})
	t.Run("body over the bound", func(t *testing.T) {
		rig := newReplayRig(t, nil)
		rig.nodeA.onLookup = func(int) { rig.sb.set(func(m *moving) { m.hibernated = true }) }
		code, h, _ := rig.post(t, strings.Repeat("x", 64<<10+1))
		if code != http.StatusServiceUnavailable || h.Get("Retry-After") == "" || rig.nodeA.n.Load() != 1 || rig.requests.Load() != 0 {
			t.Fatalf("%d (Retry-After %q), node A %d, sandbox %d: want node A's 503 at once", code, h.Get("Retry-After"), rig.nodeA.n.Load(), rig.requests.Load())
		}
	})
	t.Run("still in transition", func(t *testing.T) {
		rig := newReplayRig(t, nil)
		proxy.SetReplayFor(rig.replica.Config.Handler.(*proxy.Proxy), 300*time.Millisecond)
		code, h, _ := rig.post(t, "x")
		if code != http.StatusServiceUnavailable || h.Get("Retry-After") == "" || rig.nodeA.n.Load() < 2 || rig.requests.Load() != 0 {
			t.Fatalf("%d (Retry-After %q), node A %d: want 503 after trying again", code, h.Get("Retry-After"), rig.nodeA.n.Load())
		}
	})
	t.Run("killed meanwhile", func(t *testing.T) {
		rig := newReplayRig(t, nil)
		rig.nodeA.onLookup = func(int) { rig.sb.set(func(m *moving) { m.dead = true }) }
		if code, _, body := rig.post(t, "x"); code != http.StatusBadGateway || !strings.Contains(body, "not found") || rig.requests.Load() != 0 {
			t.Fatalf("%d %s: want 502 not found", code, body)
		}
	})
}

// goneLater is a loopback Resolver whose sandbox instance goes away when
// gone is closed.
type goneLater struct {
	loopback
	gone chan struct{}
}

func (g goneLater) Lookup(string) (netip.Addr, bool, bool, <-chan struct{}) {
	return netip.MustParseAddr("127.0.0.1"), true, true, g.gone
}

// A sandbox whose instance goes away (a drain hibernates it) while a
// request waits for its answer: the client gets a 502 that says so, not
// a 503 (the request may have run there). Before, the proxy wrote
// nothing and the client got an empty 200, which the stock SDK reported
// as "unsupported content type null" (TestRollingUpgrade).
func TestInstanceGoneBeforeItAnsweredIs502(t *testing.T) {
	entered, release := make(chan struct{}), make(chan struct{})
	app := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		close(entered)
		<-release
	}))
	t.Cleanup(app.Close)
	t.Cleanup(func() { close(release) })
	_, port, _ := net.SplitHostPort(app.Listener.Addr().String())
	res := goneLater{gone: make(chan struct{})}
	srv := httptest.NewServer(proxy.New(res, isKey, nil))
	t.Cleanup(srv.Close)
	go func() {
		<-entered
		close(res.gone)
	}()
	req, _ := http.NewRequest(http.MethodPost, srv.URL+"/process.Process/Start", strings.NewReader("{}"))
	req.Header.Set("E2b-Sandbox-Id", movingID)
	req.Header.Set("E2b-Sandbox-Port", port)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != http.StatusBadGateway || !strings.Contains(string(b), "went away") {
		t.Fatalf("%d %q, want 502 saying the sandbox went away", resp.StatusCode, b)
	}
}

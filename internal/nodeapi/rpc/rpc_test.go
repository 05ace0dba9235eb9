package rpc

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"testing"
	"time"

	"connectrpc.com/connect"

	"github.com/spore-run/spore/internal/errdefs"
	"github.com/spore-run/spore/internal/nodeapi"
)

// client serves n (h2c on loopback) and returns a client of it.
func client(t testing.TB, n nodeapi.Node) (*Client, *httptest.Server) {
	t.Helper()
	token := newToken()
	path, h, err := NewHandler(n, token)
	if err != nil {
		t.Fatal(err)
	}
	mux := http.NewServeMux()
	mux.Handle(path, h)
	srv := serve(t, mux)
	hc := HTTPClient(nil)
	t.Cleanup(hc.CloseIdleConnections)
	c, err := NewClient(srv.URL, token, hc)
	if err != nil {
		t.Fatal(err)
	}
	return c, srv
}

var kinds = []error{errdefs.ErrInvalidArgument, errdefs.ErrNotFound, errdefs.ErrAlreadyExists, errdefs.ErrConflict,
	errdefs.ErrResourceLimit, errdefs.ErrUnavailable, errdefs.ErrInternal}

// TestErrorKindsSurviveTheHop: each errdefs kind a node answers comes back
// as that kind and no other, with the node's message unchanged (the ID in
// it, nothing added); the same for a fork child's error; context errors
// stay context errors; an error of no kind reads as ErrUnavailable.
func TestErrorKindsSurviveTheHop(t *testing.T) {
	ctx := ctxFor(t)
	for _, kind := range kinds {
		nodeErr := fmt.Errorf("sandbox i0123456789abcdefghij: %w", kind)
		c, _ := client(t, &stubNode{err: nodeErr})
		_, err := c.Get(ctx, "i0123456789abcdefghij")
		for _, k := range kinds {
			if errors.Is(err, k) != (k == kind) {
				t.Errorf("node error %q: client error %v: errors.Is(%v) = %v", nodeErr, err, k, errors.Is(err, k))
			}
		}
		if err == nil || err.Error() != nodeErr.Error() {
			t.Errorf("message %q, want the node's %q", err, nodeErr)
		}
		// A fork child's own error.
		fc, _ := client(t, &forkNode{childErr: nodeErr})
		res, err := fc.Fork(ctx, "i0123456789abcdefghij", nodeapi.ForkRequest{Children: []nodeapi.ForkChildSpec{{SandboxID: "c", AccessToken: "t"}, {SandboxID: "d", AccessToken: "t"}}})
		if err != nil {
			t.Fatal(err)
		}
		if len(res.Children) != 2 || !errors.Is(res.Children[0].Err, kind) || res.Children[0].Err.Error() != nodeErr.Error() || res.Children[1].Err != nil || res.Children[1].Sandbox.ID != "d" {
			t.Errorf("fork children %+v, want [%v, sandbox d]", res.Children, nodeErr)
		}
	}
	for _, cerr := range []error{context.DeadlineExceeded, context.Canceled} {
		c, _ := client(t, &stubNode{err: fmt.Errorf("sandbox x: waiting: %w", cerr)})
		if _, err := c.Get(ctx, "x"); !errors.Is(err, cerr) {
			t.Errorf("node error %v: client error %v", cerr, err)
		}
	}
	c, _ := client(t, &stubNode{err: errors.New("no kind")})
	if _, err := c.Get(ctx, "x"); !errdefs.IsUnavailable(err) {
		t.Errorf("error of no kind: client error %v, want unavailable (outcome unknown: retry)", err)
	}
}

// The mapping table is one to one in both directions.
func TestCodesRoundTrip(t *testing.T) {
	seen := map[connect.Code]bool{}
	for _, kind := range kinds {
		code := codeOf(fmt.Errorf("x: %w", kind))
		if seen[code] {
			t.Errorf("two kinds map to %v", code)
		}
		seen[code] = true
		if back := kindOf(code); back != kind {
			t.Errorf("%v -> %v -> %v", kind, code, back)
		}
	}
	if kindOf(connect.CodeAborted) != errdefs.ErrConflict {
		t.Error("Aborted does not read as a conflict")
	}
	if kindOf(connect.CodeUnauthenticated) != errdefs.ErrInternal {
		t.Error("Unauthenticated does not read as internal (a misconfigured fleet)")
	}
}

// A node that cannot be reached is ErrUnavailable: the caller retries its
// idempotent call.
func TestUnreachableNodeIsUnavailable(t *testing.T) {
	c, srv := client(t, &stubNode{})
	srv.CloseClientConnections()
	srv.Close()
	_, err := c.Get(ctxFor(t), "x")
	if !errdefs.IsUnavailable(err) {
		t.Fatalf("call to a stopped node: %v, want unavailable", err)
	}
}

// slowNode blocks Get until its context ends and reports the deadline it
// had.
type slowNode struct {
	stubNode
	deadline chan time.Time
}

func (s *slowNode) Get(ctx context.Context, id string) (nodeapi.Sandbox, error) {
	d, _ := ctx.Deadline()
	s.deadline <- d
	<-ctx.Done()
	return nodeapi.Sandbox{}, fmt.Errorf("sandbox %s: %w", id, ctx.Err())
}

// TestDeadlinePropagates: the caller's deadline reaches the node's
// context (Connect's timeout header), the node's work ends with it, and
// the caller sees context.DeadlineExceeded as in process.
func TestDeadlinePropagates(t *testing.T) {
	n := &slowNode{deadline: make(chan time.Time, 1)}
	c, _ := client(t, n)
	ctx, cancel := context.WithTimeout(context.Background(), 500*time.Millisecond)
	defer cancel()
	want, _ := ctx.Deadline()
	_, err := c.Get(ctx, "x")
	if !errors.Is(err, context.DeadlineExceeded) {
		t.Errorf("call past its deadline: %v, want context.DeadlineExceeded", err)
	}
	select {
	case got := <-n.deadline:
		if got.IsZero() || got.After(want.Add(time.Second)) {
			t.Errorf("node's deadline %v, want about the caller's %v", got, want)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("the call never reached the node")
	}
}

// forkNode answers a fork with its first child failed.
type forkNode struct {
	stubNode
	childErr error
}

func (f *forkNode) Fork(ctx context.Context, id string, req nodeapi.ForkRequest) (nodeapi.ForkResult, error) {
	res := nodeapi.ForkResult{Children: make([]nodeapi.ForkChild, len(req.Children))}
	for i, c := range req.Children {
		if i == 0 {
			res.Children[i].Err = f.childErr
		} else {
			res.Children[i].Sandbox = nodeapi.Sandbox{ID: c.SandboxID, AccessToken: c.AccessToken, State: nodeapi.StateRunning}
		}
	}
	return res, nil
}

// eventNode streams what is sent on its channel.
type eventNode struct {
	stubNode
	ch chan nodeapi.Event
}

func (e *eventNode) Events(ctx context.Context) (<-chan nodeapi.Event, error) { return e.ch, nil }

// TestEventsStream: events arrive in order with their fields; the
// client's channel closes when the node's stream ends and when the
// caller's context ends.
func TestEventsStream(t *testing.T) {
	n := &eventNode{ch: make(chan nodeapi.Event, 4)}
	c, _ := client(t, n)
	ctx, cancel := context.WithCancel(ctxFor(t))
	defer cancel()
	events, err := c.Events(ctx)
	if err != nil {
		t.Fatal(err)
	}
	at := time.Date(2026, 1, 2, 3, 4, 5, 6, time.UTC)
	sent := []nodeapi.Event{
		{Kind: nodeapi.EventDied, SandboxID: "a", Reason: "oom", Detail: "memory limit", At: at},
		{Kind: nodeapi.EventOpDone, SandboxID: "b", Op: "create", Err: "resource exhausted: memory", At: at},
	}
	for _, ev := range sent {
		n.ch <- ev
	}
	for i, want := range sent {
		select {
		case got := <-events:
			if got != want {
				t.Errorf("event %d = %+v, want %+v", i, got, want)
			}
		case <-time.After(30 * time.Second):
			t.Fatalf("event %d never arrived", i)
		}
	}
	close(n.ch) // the node's stream ends
	select {
	case _, open := <-events:
		if open {
			t.Fatal("an event after the node's stream ended")
		}
	case <-time.After(30 * time.Second):
		t.Fatal("the client's channel stayed open after the node's stream ended")
	}
	// Refused subscriptions are errors of their kind.
	bad, _ := client(t, &stubNode{err: errdefs.ErrUnavailable})
	if _, err := bad.Events(ctx); !errdefs.IsUnavailable(err) {
		t.Errorf("refused subscription: %v, want unavailable", err)
	}
}

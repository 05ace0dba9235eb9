package rpc

import (
	"context"
	"net/http"
	"net/http/httptest"
	"testing"
	"time"

	"connectrpc.com/connect"
	"google.golang.org/protobuf/types/known/emptypb"

	"github.com/spore-run/spore/internal/errdefs"
	"github.com/spore-run/spore/internal/ids"
	nodev1 "github.com/spore-run/spore/proto/gen/node/v1"
)

func newToken() string { return ids.New('k') + ids.New('k') }

// serve starts an h2c server for h on loopback.
func serve(t testing.TB, h http.Handler) *httptest.Server {
	t.Helper()
	srv := httptest.NewUnstartedServer(nil)
	srv.Config = Server(h, nil)
	srv.Start()
	t.Cleanup(func() {
		srv.CloseClientConnections()
		srv.Close()
	})
	return srv
}

func ctxFor(t testing.TB) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	t.Cleanup(cancel)
	return ctx
}

type setHeader string

func (h setHeader) WrapUnary(next connect.UnaryFunc) connect.UnaryFunc {
	return func(ctx context.Context, req connect.AnyRequest) (connect.AnyResponse, error) {
		if h != "" {
			req.Header().Set("Authorization", string(h))
		}
		return next(ctx, req)
	}
}

func (h setHeader) WrapStreamingClient(next connect.StreamingClientFunc) connect.StreamingClientFunc {
	return func(ctx context.Context, spec connect.Spec) connect.StreamingClientConn {
		conn := next(ctx, spec)
		if h != "" {
			conn.RequestHeader().Set("Authorization", string(h))
		}
		return conn
	}
}

func (h setHeader) WrapStreamingHandler(next connect.StreamingHandlerFunc) connect.StreamingHandlerFunc {
	return next
}

// callRaw calls one procedure with an empty request (every request
// message decodes from no bytes) and the given Authorization header, and
// returns the code it ended with.
func callRaw(ctx context.Context, hc *http.Client, base, procedure string, stream bool, auth string, opts ...connect.ClientOption) connect.Code {
	opts = append(opts, connect.WithInterceptors(setHeader(auth)))
	c := connect.NewClient[emptypb.Empty, emptypb.Empty](hc, base+procedure, opts...)
	if !stream {
		_, err := c.CallUnary(ctx, connect.NewRequest(&emptypb.Empty{}))
		return connect.CodeOf(err)
	}
	st, err := c.CallServerStream(ctx, connect.NewRequest(&emptypb.Empty{}))
	if err != nil {
		return connect.CodeOf(err)
	}
	defer st.Close()
	for st.Receive() {
	}
	return connect.CodeOf(st.Err())
}

// TestEveryProcedureNeedsTheToken: each procedure of the service (taken
// from the generated descriptor, so a new rpc cannot escape), unary and
// streaming, over the Connect and gRPC protocols, refuses a caller without
// the cluster token with Unauthenticated, and the node never sees the
// call; with the token the call reaches the node. Both layers are checked
// on their own: the whole handler, and the interceptor alone.
func TestEveryProcedureNeedsTheToken(t *testing.T) {
	token := newToken()
	methods := nodev1.File_node_v1_node_proto.Services().ByName("Node").Methods()
	if methods.Len() < 18 {
		t.Fatalf("the descriptor lists %d methods, want the contract's 18", methods.Len())
	}
	layers := map[string]func(*stubNode) http.Handler{
		"handler": func(n *stubNode) http.Handler {
			path, h, err := NewHandler(n, token)
			if err != nil {
				t.Fatal(err)
			}
			mux := http.NewServeMux()
			mux.Handle(path, h)
			return mux
		},
		"interceptor": func(n *stubNode) http.Handler {
			h, err := newHandler(n, token)
			if err != nil {
				t.Fatal(err)
			}
			return h
		},
	}
	wrong := map[string]string{
		"none":          "",
		"wrong token":   "Bearer " + newToken(),
		"other scheme":  "Basic " + token,
		"bare token":    token,
		"token plus":    "Bearer " + token + "x",
		"token prefix":  "Bearer " + token[:len(token)-1],
		"empty bearer":  "Bearer ",
		"other's token": "Bearer " + ids.New('k'),
	}
	protocols := map[string][]connect.ClientOption{"connect": nil, "grpc": {connect.WithGRPC()}}
	ctx := ctxFor(t)
	hc := HTTPClient(nil)
	t.Cleanup(hc.CloseIdleConnections)
	for layer, build := range layers {
		n := &stubNode{err: errdefs.NotFoundf("stub")}
		srv := serve(t, build(n))
		for proto, opts := range protocols {
			for i := range methods.Len() {
				m := methods.Get(i)
				procedure := "/" + string(m.Parent().FullName()) + "/" + string(m.Name())
				stream := m.IsStreamingServer()
				for name, auth := range wrong {
					if code := callRaw(ctx, hc, srv.URL, procedure, stream, auth, opts...); code != connect.CodeUnauthenticated {
						t.Errorf("%s, %s, %s with %s: code %v, want unauthenticated", layer, proto, procedure, name, code)
					}
				}
				if got := n.calls.Load(); got != 0 {
					t.Fatalf("%s, %s, %s: %d unauthenticated calls reached the node", layer, proto, procedure, got)
				}
				// With the token: the node's answer (or, for an empty
				// SetPolicy, the handler's refusal of a missing policy).
				code := callRaw(ctx, hc, srv.URL, procedure, stream, "Bearer "+token, opts...)
				if code != connect.CodeNotFound && !(m.Name() == "SetPolicy" && code == connect.CodeInvalidArgument) {
					t.Errorf("%s, %s, %s with the token: code %v, want the node's not found", layer, proto, procedure, code)
				}
				n.calls.Store(0)
			}
		}
	}
}

// Nothing under the handler's path answers without the token, not even an
// unknown procedure or a plain GET.
func TestUnknownPathsNeedTheToken(t *testing.T) {
	token := newToken()
	path, h, err := NewHandler(&stubNode{}, token)
	if err != nil {
		t.Fatal(err)
	}
	srv := serve(t, h)
	hc := HTTPClient(nil)
	t.Cleanup(hc.CloseIdleConnections)
	ctx := ctxFor(t)
	if code := callRaw(ctx, hc, srv.URL, path+"NoSuchRPC", false, ""); code != connect.CodeUnauthenticated {
		t.Errorf("unknown procedure without token: %v, want unauthenticated", code)
	}
	if code := callRaw(ctx, hc, srv.URL, path+"NoSuchRPC", false, "Bearer "+token); code != connect.CodeNotFound && code != connect.CodeUnimplemented {
		t.Errorf("unknown procedure with the token: %v, want not found or unimplemented", code)
	}
	req, _ := http.NewRequestWithContext(ctx, "GET", srv.URL+path+"Info", nil)
	resp, err := hc.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusUnauthorized {
		t.Errorf("plain GET without token: %d, want 401", resp.StatusCode)
	}
}

// A handler is never built without a usable token, nor a client.
func TestConstructionRefusesNoToken(t *testing.T) {
	for _, tok := range []string{"", "short", "has a space in it!!"} {
		if _, _, err := NewHandler(&stubNode{}, tok); !errdefs.IsInvalidArgument(err) {
			t.Errorf("NewHandler with token %q: %v, want invalid argument", tok, err)
		}
	}
	if _, _, err := NewHandler(nil, newToken()); !errdefs.IsInvalidArgument(err) {
		t.Errorf("NewHandler without a node: %v, want invalid argument", err)
	}
	if _, err := NewClient("http://127.0.0.1:1", "", nil); !errdefs.IsInvalidArgument(err) {
		t.Errorf("NewClient without a token: %v, want invalid argument", err)
	}
	for _, u := range []string{"", "127.0.0.1:1", "ftp://x", "http://"} {
		if _, err := NewClient(u, newToken(), nil); !errdefs.IsInvalidArgument(err) {
			t.Errorf("NewClient(%q): %v, want invalid argument", u, err)
		}
	}
}

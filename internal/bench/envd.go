package bench

import (
	"context"
	"net"
	"net/http"
	"net/netip"
	"strconv"

	"connectrpc.com/connect"

	"github.com/spore-run/spore/proto/gen/process/processpbconnect"
)

// envdPort is envd's port in every sandbox (envd.Port; not imported, to
// keep the daemon's packages out of the CLI's bench).
const envdPort = 49983

// envdDirect is a process client of a sandbox's envd at addr, bypassing
// the API server and its proxy: the baseline of commands.run. Its
// transport is set up like the API client's, so only the route differs.
func envdDirect(addr netip.Addr, token string) processpbconnect.ProcessClient {
	return envdAt("http://"+net.JoinHostPort(addr.String(), strconv.Itoa(envdPort)), token)
}

// envdAt is a process client of the envd at base.
func envdAt(base, token string) processpbconnect.ProcessClient {
	hc := &http.Client{Transport: &http.Transport{
		MaxIdleConnsPerHost: 16, ReadBufferSize: 1 << 20, WriteBufferSize: 1 << 20, DisableCompression: true,
	}}
	return processpbconnect.NewProcessClient(hc, base, connect.WithInterceptors(accessToken(token)))
}

// accessToken sends envd's X-Access-Token, as the SDK does.
type accessToken string

func (t accessToken) set(h http.Header) {
	if t != "" {
		h.Set("X-Access-Token", string(t))
	}
}

func (t accessToken) WrapUnary(next connect.UnaryFunc) connect.UnaryFunc {
	return func(ctx context.Context, req connect.AnyRequest) (connect.AnyResponse, error) {
		t.set(req.Header())
		return next(ctx, req)
	}
}

func (t accessToken) WrapStreamingClient(next connect.StreamingClientFunc) connect.StreamingClientFunc {
	return func(ctx context.Context, spec connect.Spec) connect.StreamingClientConn {
		conn := next(ctx, spec)
		t.set(conn.RequestHeader())
		return conn
	}
}

func (t accessToken) WrapStreamingHandler(next connect.StreamingHandlerFunc) connect.StreamingHandlerFunc {
	return next
}

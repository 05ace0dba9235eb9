package envd

import (
	"context"
	"errors"
	"net/http"

	"connectrpc.com/connect"

	"github.com/spore-run/spore/internal/envd/identity"
)

// userInterceptor checks the access token and resolves the request's user
// (Authorization: Basic) for every RPC, unary or streaming.
func (s *Server) userInterceptor() connect.Interceptor { return authInterceptor{s} }

type authInterceptor struct{ s *Server }

func (a authInterceptor) authorize(ctx context.Context, h http.Header) (context.Context, error) {
	if !a.s.tokenOK(&http.Request{Header: h}) {
		return nil, connect.NewError(connect.CodeUnauthenticated, errors.New("missing or wrong access token"))
	}
	name, err := identity.UserFromAuthorization(h.Get("Authorization"))
	if err != nil {
		return nil, connect.NewError(connect.CodeInvalidArgument, err)
	}
	u, err := a.s.resolveUser(name)
	if err != nil {
		return nil, connect.NewError(connect.CodeInvalidArgument, err)
	}
	return identity.WithUser(ctx, u), nil
}

func (a authInterceptor) WrapUnary(next connect.UnaryFunc) connect.UnaryFunc {
	return func(ctx context.Context, req connect.AnyRequest) (connect.AnyResponse, error) {
		ctx, err := a.authorize(ctx, req.Header())
		if err != nil {
			return nil, err
		}
		return next(ctx, req)
	}
}

func (a authInterceptor) WrapStreamingClient(next connect.StreamingClientFunc) connect.StreamingClientFunc {
	return next
}

func (a authInterceptor) WrapStreamingHandler(next connect.StreamingHandlerFunc) connect.StreamingHandlerFunc {
	return func(ctx context.Context, conn connect.StreamingHandlerConn) error {
		ctx, err := a.authorize(ctx, conn.RequestHeader())
		if err != nil {
			return err
		}
		return next(ctx, conn)
	}
}

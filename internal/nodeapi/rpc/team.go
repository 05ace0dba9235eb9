package rpc

import (
	"context"

	"connectrpc.com/connect"

	"github.com/spore-run/spore/internal/tenant"
)

// The team a call acts for (tenant.With on the caller's context) crosses
// the hop as a request header; the node's handler puts it back in its
// context, where the engine's launch gate reads it. It orders the node's
// work between teams and grants nothing: only the control plane, which
// has confined the call to that team, can call a node at all.

const teamHeader = "Spore-Team"

// maxTeamHeader bounds what a node keeps of the header (team IDs are far
// shorter): a longer one is dropped, and the call queues as no team's.
const maxTeamHeader = 64

// clientTeam sends the team of a unary call's context.
var clientTeam = connect.UnaryInterceptorFunc(func(next connect.UnaryFunc) connect.UnaryFunc {
	return func(ctx context.Context, req connect.AnyRequest) (connect.AnyResponse, error) {
		if t := tenant.Of(ctx); t != "" {
			req.Header().Set(teamHeader, t)
		}
		return next(ctx, req)
	}
})

// serverTeam puts a unary call's team into the handler's context.
var serverTeam = connect.UnaryInterceptorFunc(func(next connect.UnaryFunc) connect.UnaryFunc {
	return func(ctx context.Context, req connect.AnyRequest) (connect.AnyResponse, error) {
		if t := req.Header().Get(teamHeader); t != "" && len(t) <= maxTeamHeader {
			ctx = tenant.With(ctx, t)
		}
		return next(ctx, req)
	}
})

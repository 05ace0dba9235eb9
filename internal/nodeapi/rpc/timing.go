package rpc

import (
	"context"
	"maps"
	"slices"
	"time"

	"connectrpc.com/connect"

	"github.com/spore-run/spore/internal/timing"
)

// Phases cross the hop: the node's handler records the phases of each call
// (restore, checkpoint, ...) and returns them in a Server-Timing response
// header; the client adds them to the caller's recorder, with the whole
// call as "node-rpc". A replica's Server-Timing then shows the node's work
// as `spore up` does, and what the hop itself costs (node-rpc minus the
// node's phases).

const timingHeader = "Server-Timing"

// serverTiming gives each unary call a recorder and returns its phases.
type serverTiming struct{}

func (serverTiming) WrapUnary(next connect.UnaryFunc) connect.UnaryFunc {
	return func(ctx context.Context, req connect.AnyRequest) (connect.AnyResponse, error) {
		ctx, rec := timing.With(ctx)
		resp, err := next(ctx, req)
		if resp != nil {
			if v := rec.Header(); v != "" {
				resp.Header().Set(timingHeader, v)
			}
		}
		return resp, err
	}
}

func (serverTiming) WrapStreamingClient(next connect.StreamingClientFunc) connect.StreamingClientFunc {
	return next
}

func (serverTiming) WrapStreamingHandler(next connect.StreamingHandlerFunc) connect.StreamingHandlerFunc {
	return next
}

// clientTiming adds a unary call's node phases, and the call itself as
// "node-rpc", to the caller's recorder (when it has one).
type clientTiming struct{}

func (clientTiming) WrapUnary(next connect.UnaryFunc) connect.UnaryFunc {
	return func(ctx context.Context, req connect.AnyRequest) (connect.AnyResponse, error) {
		rec := timing.FromContext(ctx)
		if rec == nil {
			return next(ctx, req)
		}
		t0 := time.Now()
		resp, err := next(ctx, req)
		rec.Add("node-rpc", time.Since(t0))
		if resp != nil {
			phases := timing.Parse(resp.Header().Get(timingHeader))
			for _, name := range slices.Sorted(maps.Keys(phases)) {
				rec.Add(name, time.Duration(phases[name]*float64(time.Millisecond)))
			}
		}
		return resp, err
	}
}

func (clientTiming) WrapStreamingClient(next connect.StreamingClientFunc) connect.StreamingClientFunc {
	return next
}

func (clientTiming) WrapStreamingHandler(next connect.StreamingHandlerFunc) connect.StreamingHandlerFunc {
	return next
}

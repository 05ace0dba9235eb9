// Package tenant carries the team a call acts for through a context, from
// the control plane across the node contract (the node RPC sends it as
// the Spore-Team header) to the engine, which queues launches per team
// (internal/engine's launch gate). It is a scheduling hint, never an
// authorization: the control plane has already confined the call to the
// team, and a node trusts only the control plane (fleet mTLS or token).
package tenant

import "context"

type key struct{}

// With returns ctx acting for team ("" : no team, such as a pool fill or
// a template build).
func With(ctx context.Context, team string) context.Context {
	return context.WithValue(ctx, key{}, team)
}

// Of is the team ctx acts for, "" when none was set.
func Of(ctx context.Context) string {
	t, _ := ctx.Value(key{}).(string)
	return t
}

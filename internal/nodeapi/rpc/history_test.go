package rpc

import (
	"net/http"
	"testing"
	"time"

	"github.com/spore-run/spore/internal/errdefs"
	"github.com/spore-run/spore/proto/gen/node/v1/nodev1connect"
)

// A node of a release before resource histories answers StatsHistory
// Unimplemented: the client says ErrUnavailable, naming it, so the
// control plane reads a sample now instead of failing getMetrics while
// a fleet is upgraded.
func TestStatsHistoryOfAnOlderNode(t *testing.T) {
	path, h := nodev1connect.NewNodeHandler(nodev1connect.UnimplementedNodeHandler{})
	mux := http.NewServeMux()
	mux.Handle(path, h)
	srv := serve(t, mux)
	c, err := NewClient(srv.URL, newToken(), nil)
	if err != nil {
		t.Fatal(err)
	}
	_, err = c.StatsHistory(ctxFor(t), "isandbox", time.Time{}, time.Time{})
	if !errdefs.IsUnavailable(err) {
		t.Fatalf("StatsHistory of a node without it: %v, want unavailable", err)
	}
	if _, err := c.Stats(ctxFor(t), "isandbox"); errdefs.IsUnavailable(err) || err == nil {
		t.Fatalf("another unimplemented call: %v, want the usual internal error", err)
	}
}

package rpc

import (
	"context"
	"net/http"
	"strings"
	"testing"

	"github.com/spore-run/spore/internal/nodeapi"
	"github.com/spore-run/spore/internal/tenant"
)

// teamNode records the team each call acted for, as the engine reads it.
type teamNode struct {
	stubNode
	seen []string
}

func (n *teamNode) Create(ctx context.Context, _ nodeapi.CreateRequest) (nodeapi.Sandbox, error) {
	n.seen = append(n.seen, tenant.Of(ctx))
	return nodeapi.Sandbox{}, nil
}

func (n *teamNode) Info(context.Context) (nodeapi.NodeInfo, error) {
	return nodeapi.NodeInfo{LaunchesQueued: 7}, nil
}

// TestTeamCrossesTheHop: the team a call acts for reaches the node's
// context; a call of no team arrives as none; a header past the bound is
// dropped; a caller without the node's token cannot set one at all (it is
// refused first); the node's launch queue comes back in Info.
func TestTeamCrossesTheHop(t *testing.T) {
	n := &teamNode{}
	c, srv := client(t, n)
	ctx := ctxFor(t)
	for _, team := range []string{"t1", "", "t2"} {
		if _, err := c.Create(tenant.With(ctx, team), nodeapi.CreateRequest{SandboxID: "i1", AccessToken: "x"}); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := c.Create(tenant.With(ctx, strings.Repeat("t", maxTeamHeader+1)), nodeapi.CreateRequest{}); err != nil {
		t.Fatal(err)
	}
	if want := []string{"t1", "", "t2", ""}; strings.Join(n.seen, ",") != strings.Join(want, ",") {
		t.Fatalf("teams seen by the node %q, want %q", n.seen, want)
	}
	req, _ := http.NewRequestWithContext(ctx, http.MethodPost, srv.URL+"/spore.node.v1.Node/Create", strings.NewReader("{}"))
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set(teamHeader, "t3")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusUnauthorized || len(n.seen) != 4 {
		t.Fatalf("a call without the token: %d, node saw %d calls", resp.StatusCode, len(n.seen))
	}
	info, err := c.Info(ctx)
	if err != nil || info.LaunchesQueued != 7 {
		t.Fatalf("info %+v, %v: want 7 launches queued", info, err)
	}
}

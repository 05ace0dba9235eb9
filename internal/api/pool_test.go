package api_test

import (
	"context"
	"encoding/json"
	"strings"
	"testing"
	"time"

	"github.com/spore-run/spore/internal/control"
	"github.com/spore-run/spore/internal/node"
)

// A create served from the warm pool is the sandbox it asked for: its
// environment and egress policy, its own token; the pool refills.
func TestWarmPool(t *testing.T) {
	h := newHarness(t)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		h.ctl.RunPool(ctx, control.PoolConfig{Templates: []string{node.TemplateBase}, Size: 1})
	}()
	defer func() { cancel(); <-done }()
	waitPool := func(want int) {
		deadline := time.Now().Add(time.Minute)
		for len(h.n.Engine.List(context.Background()))-h.count() < want {
			if time.Now().After(deadline) {
				t.Fatal("pool did not fill")
			}
			time.Sleep(50 * time.Millisecond)
		}
	}
	waitPool(1)
	sb := h.create(`{"templateID":"base","envVars":{"POOLED":"yes"},"allow_internet_access":false,"metadata":{"m":"1"}}`)
	es, err := h.n.Engine.Get(context.Background(), sb.SandboxID)
	if err != nil {
		t.Fatal(err)
	}
	if es.Policy.Internet || !strings.Contains(strings.Join(es.Run.Env, " "), "POOLED=yes") {
		t.Fatalf("pooled sandbox not reconfigured: %+v %v", es.Policy, es.Run.Env)
	}
	code, b, _ := h.do("GET", "/envs", "", "E2b-Sandbox-Id", sb.SandboxID, "X-Access-Token", sb.EnvdAccessToken)
	var env map[string]string
	json.Unmarshal(b, &env)
	if code != 200 || env["POOLED"] != "yes" {
		t.Fatalf("daemon env of a pooled sandbox: %d %s", code, b)
	}
	if code, _, _ := h.do("GET", "/sandboxes/"+sb.SandboxID, ""); code != 200 {
		t.Fatalf("pooled sandbox not in the store: %d", code)
	}
	waitPool(1) // refilled
	cancel()
	<-done
	// Stopping the pool kills its idle sandboxes; the created one stays.
	if n := len(h.n.Engine.List(context.Background())); n != 1 {
		t.Fatalf("%d sandboxes on the node after the pool stopped, want 1", n)
	}
}

package api_test

import (
	"context"
	"encoding/json"
	"strings"
	"testing"
	"time"

	"github.com/spore-run/spore/internal/control"
	"github.com/spore-run/spore/internal/node"
	"github.com/spore-run/spore/internal/store"
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
	// The pool is filled when its row says pooled: the engine lists a
	// sandbox from the start of its restore, which stopping the filler
	// then abandons.
	pooledRows := func() int {
		rows, _, err := h.st.ListSandboxes(context.Background(), store.SandboxFilter{States: []string{store.StatePooled}})
		if err != nil {
			t.Fatal(err)
		}
		return len(rows)
	}
	waitPool := func(want int) {
		deadline := time.Now().Add(time.Minute)
		for pooledRows() < want {
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
	// Stopping the filler leaves the pool to the next lease holder: the
	// pooled sandbox has a row of its own (state pooled) that no list or
	// GET shows.
	if n := len(h.n.Engine.List(context.Background())); n != 2 {
		t.Fatalf("%d sandboxes on the node after the pool stopped, want 2", n)
	}
	pooled, _, err := h.st.ListSandboxes(context.Background(), store.SandboxFilter{States: []string{store.StatePooled}})
	if err != nil || len(pooled) != 1 {
		t.Fatalf("pooled rows: %v %v", pooled, err)
	}
	if h.count() != 1 {
		t.Fatalf("%d sandboxes listed, want 1 (the pooled one is nobody's)", h.count())
	}
	if code, _, _ := h.do("GET", "/sandboxes/"+pooled[0].ID, ""); code != 404 {
		t.Fatalf("GET of a pooled sandbox: %d, want 404", code)
	}
}

package control_test

import (
	"bytes"
	"context"
	"strings"
	"testing"
	"time"

	"github.com/spore-run/spore/internal/control"
	"github.com/spore-run/spore/internal/control/controltest"
	"github.com/spore-run/spore/internal/egress"
	"github.com/spore-run/spore/internal/errdefs"
	"github.com/spore-run/spore/internal/netns"
	"github.com/spore-run/spore/internal/secrets"
	"github.com/spore-run/spore/internal/store"
)

func TestParseRules(t *testing.T) {
	got, err := control.ParseRules(map[string][]store.NetworkRule{
		"API.Example.com": {{Headers: map[string]string{"Authorization": "Bearer ${e2b.secrets.Key}"}}},
		"*.example.com":   {{}, {Headers: map[string]string{"X-A": "plain"}}},
	})
	if err != nil || len(got) != 2 || got["api.example.com"][0].Headers["Authorization"] != "Bearer ${e2b.secrets.Key}" || len(got["*.example.com"]) != 2 {
		t.Fatalf("parsed %+v, %v", got, err)
	}
	h := func(k, v string) map[string][]store.NetworkRule {
		return map[string][]store.NetworkRule{"api.test": {{Headers: map[string]string{k: v}}}}
	}
	for name, bad := range map[string]map[string][]store.NetworkRule{
		"bare *":            {"*": {{}}},
		"an address":        {"1.2.3.4": {{}}},
		"twice by case":     {"a.test": {{}}, "A.test": {{}}},
		"Host":              h("Host", "x"),
		"Content-Length":    h("content-length", "1"),
		"bad name":          h("X Y", "v"),
		"CRLF value":        h("X-A", "a\r\nX-Injected: 1"),
		"identity token":    h("Authorization", "${e2b.identity.tokens.aws}"),
		"unknown kind":      h("X-A", "${e2b.other.x}"),
		"unclosed":          h("X-A", "${e2b.secrets.abc"),
		"bad secret name":   h("X-A", "${e2b.secrets.}"),
		"too many rules":    {"a.test": make([]store.NetworkRule, control.MaxRulesPerDomain+1)},
		"reserved sec_ ref": h("X-A", "${e2b.secrets.sec_abc}"),
	} {
		if _, err := control.ParseRules(bad); !errdefs.IsInvalidArgument(err) {
			t.Errorf("%s: %v, want invalid", name, err)
		}
	}
	many := map[string][]store.NetworkRule{}
	for i := range egress.MaxInjections + 1 {
		many[strings.Repeat("a", i+1)+".test"] = nil
	}
	if _, err := control.ParseRules(many); !errdefs.IsInvalidArgument(err) {
		t.Errorf("%d domains: %v", len(many), err)
	}
}

type rulesHarness struct {
	t   *testing.T
	n   *controltest.Node
	st  store.Store
	ctl *control.Service
}

func newRulesHarness(t *testing.T, withKey bool) *rulesHarness {
	c := controltest.ConfigOf(t)
	h := &rulesHarness{t: t, n: controltest.New(t), st: c.Store(t)}
	cfg := control.Config{Store: h.st, Nodes: control.Nodes{controltest.NodeID: c.Node(t, h.n.Local)}}
	if withKey {
		box, err := secrets.NewBox(bytes.Repeat([]byte{3}, secrets.KeySize))
		if err != nil {
			t.Fatal(err)
		}
		cfg.Secrets = box
	}
	h.ctl = control.New(cfg)
	t.Cleanup(h.ctl.Close)
	return h
}

// nodePolicy is the policy the node's network has for a sandbox.
func (h *rulesHarness) nodePolicy(id string) netns.Policy {
	h.t.Helper()
	es, err := h.n.Engine.Get(context.Background(), id)
	if err != nil {
		h.t.Fatal(err)
	}
	p, ok := h.n.Net.Policy(es.Instance)
	if !ok {
		h.t.Fatalf("no network for %s", id)
	}
	return p
}

func injected(p netns.Policy, pattern, header string) string {
	for _, in := range p.Inject {
		if in.Pattern == pattern {
			for _, hd := range in.Headers {
				if strings.EqualFold(hd.Name, header) {
					return hd.Value
				}
			}
		}
	}
	return ""
}

// Network rules through the control plane: the row keeps them as given
// (placeholders) with the sandbox's CA sealed; the node gets the headers
// with the secrets' current values and the CA; an update resolves again
// (a rotated secret) and keeps the CA, an update without rules clears
// them; forks share rules and CA; a rule naming a secret that does not
// exist is refused and changes nothing.
func TestNetworkRulesReachTheNode(t *testing.T) {
	controltest.Each(t, func(t *testing.T, _ controltest.Config) { testNetworkRulesReachTheNode(t) })
}

func testNetworkRulesReachTheNode(t *testing.T) {
	h := newRulesHarness(t, true)
	ctx := ctxFor(t)
	if _, err := h.ctl.CreateSecret(ctx, "", "api-key", "sk-first", nil); err != nil {
		t.Fatal(err)
	}
	rules := map[string][]store.NetworkRule{
		"API.test":    {{Headers: map[string]string{"Authorization": "Bearer ${e2b.secrets.API-KEY}"}}},
		"*.wild.test": {{Headers: map[string]string{"X-A": "1"}}, {Headers: map[string]string{"x-a": "2", "X-B": "3"}}},
	}
	sb, err := h.ctl.Create(ctx, control.CreateRequest{Timeout: time.Minute, Rules: rules})
	if err != nil {
		t.Fatal(err)
	}
	row, _ := h.st.GetSandbox(ctx, sb.ID)
	if row.NetworkRules["api.test"][0].Headers["Authorization"] != "Bearer ${e2b.secrets.API-KEY}" || len(row.EgressCA) == 0 ||
		bytes.Contains(row.EgressCA, []byte("BEGIN")) {
		t.Fatalf("row: rules %+v, CA %d bytes", row.NetworkRules, len(row.EgressCA))
	}
	p := h.nodePolicy(sb.ID)
	if injected(p, "api.test", "Authorization") != "Bearer sk-first" || injected(p, "*.wild.test", "X-A") != "2" || injected(p, "*.wild.test", "X-B") != "3" {
		t.Fatalf("node's injections: %+v", p.Inject)
	}
	if err := p.Validate(); err != nil {
		t.Fatalf("the node's check refuses the policy: %v", err)
	}
	ca := p.CA

	// A rotated secret reaches the sandboxes that use it, at once.
	if _, err := h.ctl.UpdateSecret(ctx, "", "api-key", "sk-rotated", nil); err != nil {
		t.Fatal(err)
	}
	if p := h.nodePolicy(sb.ID); injected(p, "api.test", "Authorization") != "Bearer sk-rotated" || !p.CA.Equal(ca) {
		t.Fatalf("after the rotation: %+v (same CA %v)", p.Inject, p.CA.Equal(ca))
	}
	if err := h.ctl.UpdateNetwork(ctx, sb.ID, nil, nil, nil, rules); err != nil {
		t.Fatal(err)
	}
	if p := h.nodePolicy(sb.ID); injected(p, "api.test", "Authorization") != "Bearer sk-rotated" || !p.CA.Equal(ca) {
		t.Fatalf("after update: %+v (same CA %v)", p.Inject, p.CA.Equal(ca))
	}

	// A node that forgot the rules (its process restarted: they are in
	// its memory only) gets them again at the next reconcile.
	if err := h.n.Engine.SetPolicy(ctx, sb.ID, netns.Policy{Internet: true}); err != nil {
		t.Fatal(err)
	}
	if p := h.nodePolicy(sb.ID); len(p.Inject) != 0 {
		t.Fatal("the node did not forget")
	}
	if err := h.ctl.ReconcileNode(ctx, controltest.NodeID); err != nil {
		t.Fatal(err)
	}
	if p := h.nodePolicy(sb.ID); injected(p, "api.test", "Authorization") != "Bearer sk-rotated" || !p.CA.Equal(ca) {
		t.Fatalf("after the reconcile: %+v", p.Inject)
	}

	// A rule naming a secret that does not exist: refused, nothing changed.
	bad := map[string][]store.NetworkRule{"api.test": {{Headers: map[string]string{"Authorization": "${e2b.secrets.nope}"}}}}
	if err := h.ctl.UpdateNetwork(ctx, sb.ID, nil, nil, nil, bad); !errdefs.IsInvalidArgument(err) || !strings.Contains(err.Error(), `"nope"`) {
		t.Fatalf("unknown secret: %v", err)
	}
	if p := h.nodePolicy(sb.ID); injected(p, "api.test", "Authorization") != "Bearer sk-rotated" {
		t.Fatalf("a refused update changed the node: %+v", p.Inject)
	}
	n0, _, _ := h.st.ListSandboxes(ctx, store.SandboxFilter{})
	if _, err := h.ctl.Create(ctx, control.CreateRequest{Timeout: time.Minute, Rules: bad}); !errdefs.IsInvalidArgument(err) {
		t.Fatalf("create with an unknown secret: %v", err)
	}
	if n1, _, _ := h.st.ListSandboxes(ctx, store.SandboxFilter{}); len(n1) != len(n0) {
		t.Fatalf("a refused create left a row: %d -> %d", len(n0), len(n1))
	}

	// Forks share the rules and the CA.
	kids, err := h.ctl.Fork(ctx, sb.ID, 1, time.Minute)
	if err != nil || kids[0].Err != nil {
		t.Fatalf("fork: %v %+v", err, kids)
	}
	kid := kids[0].Sandbox
	if kp := h.nodePolicy(kid.ID); injected(kp, "api.test", "Authorization") != "Bearer sk-rotated" || !kp.CA.Equal(ca) {
		t.Fatalf("child's policy: %+v (same CA %v)", kp.Inject, kp.CA.Equal(ca))
	}
	if krow, _ := h.st.GetSandbox(ctx, kid.ID); !bytes.Equal(krow.EgressCA, row.EgressCA) || len(krow.NetworkRules) != 2 {
		t.Fatalf("child's row: %+v", krow.NetworkRules)
	}

	// A deleted secret stops going anywhere: the headers naming it are
	// dropped, the others stay.
	if err := h.ctl.DeleteSecret(ctx, "", "api-key"); err != nil {
		t.Fatal(err)
	}
	if p := h.nodePolicy(sb.ID); injected(p, "api.test", "Authorization") != "" || injected(p, "*.wild.test", "X-A") != "2" {
		t.Fatalf("after the secret's deletion: %+v", p.Inject)
	}
	if _, err := h.ctl.CreateSecret(ctx, "", "api-key", "sk-again", nil); err != nil {
		t.Fatal(err)
	}

	// An update without rules clears them (the row keeps the CA).
	if err := h.ctl.UpdateNetwork(ctx, sb.ID, nil, nil, nil, nil); err != nil {
		t.Fatal(err)
	}
	if p := h.nodePolicy(sb.ID); len(p.Inject) != 0 {
		t.Fatalf("cleared rules still injected: %+v", p.Inject)
	}
	if r, _ := h.st.GetSandbox(ctx, sb.ID); len(r.NetworkRules) != 0 || !bytes.Equal(r.EgressCA, row.EgressCA) {
		t.Fatalf("row after clearing: %+v", r.NetworkRules)
	}
	// First rules for a paused sandbox: a conflict (its daemon installs
	// the CA), nothing changed.
	paused, err := h.ctl.Create(ctx, control.CreateRequest{Timeout: time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	if err := h.ctl.Pause(ctx, paused.ID); err != nil {
		t.Fatal(err)
	}
	if err := h.ctl.UpdateNetwork(ctx, paused.ID, nil, nil, nil, rules); !errdefs.IsConflict(err) {
		t.Fatalf("first rules for a paused sandbox: %v", err)
	}
	if r, _ := h.st.GetSandbox(ctx, paused.ID); len(r.NetworkRules) != 0 || len(r.EgressCA) != 0 {
		t.Fatalf("a refused update changed the row: %+v", r.NetworkRules)
	}
	// A sandbox created without rules gets its CA with its first ones.
	plain, err := h.ctl.Create(ctx, control.CreateRequest{Timeout: time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	if r, _ := h.st.GetSandbox(ctx, plain.ID); len(r.EgressCA) != 0 {
		t.Fatal("a sandbox without rules has a CA")
	}
	if err := h.ctl.UpdateNetwork(ctx, plain.ID, nil, nil, nil, rules); err != nil {
		t.Fatal(err)
	}
	if p := h.nodePolicy(plain.ID); p.CA == nil || p.CA.Equal(ca) || injected(p, "api.test", "Authorization") != "Bearer sk-again" {
		t.Fatalf("first rules at run time: %+v", p.Inject)
	}
}

// Without a secrets key there is no CA to sign with: rules are refused as
// unavailable, a sandbox without them is created as before.
func TestNetworkRulesNeedTheSecretsKey(t *testing.T) {
	h := newRulesHarness(t, false)
	ctx := ctxFor(t)
	rules := map[string][]store.NetworkRule{"api.test": {{Headers: map[string]string{"X-A": "plain"}}}}
	if _, err := h.ctl.Create(ctx, control.CreateRequest{Timeout: time.Minute, Rules: rules}); !errdefs.IsUnavailable(err) {
		t.Fatalf("create with rules: %v", err)
	}
	if _, err := h.ctl.Create(ctx, control.CreateRequest{Timeout: time.Minute}); err != nil {
		t.Fatal(err)
	}
}

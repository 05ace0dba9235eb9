// Package nodetest is the conformance suite of the node contract
// (nodeapi.Node): what every implementation must do, checked the same way
// against the in-process node (nodeapi/local) and against the remote
// client over Connect-RPC (nodeapi/rpc), over the fake runtime (fast
// tier) and over real gVisor sandboxes (real tier). See
// nodetest_test.go for the four runs.
package nodetest

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	goruntime "runtime"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/spore-run/spore/internal/errdefs"
	"github.com/spore-run/spore/internal/ids"
	"github.com/spore-run/spore/internal/nodeapi"
)

// Target is a node under test.
type Target struct {
	Node nodeapi.Node
	// Template names a template the node holds.
	Template string
	// Die makes a sandbox's instance end by itself, as a crash or the
	// kernel's OOM killer would (not through the contract).
	Die func(ctx context.Context, sandboxID string) error
	// Peer, when set, is a second node sharing Node's blob store (both
	// Durable): what one uploads the other restores and adopts. Without a
	// blob store the suite checks Upload, Adopt and CollectGarbage
	// answer Conflict.
	Peer nodeapi.Node
	// Images, when set, lets the suite build templates from images (see
	// Images); without it the suite checks BuildImage refuses malformed
	// requests and answers Conflict to the rest.
	Images *Images
	// Sample takes a sample of every running sandbox's resource use now,
	// as the node's own sampler does every few seconds (the history
	// StatsHistory lists).
	Sample func(ctx context.Context)
}

// Timeout bounds each check (real sandboxes restore in about a second;
// the host may be busy).
const Timeout = 3 * time.Minute

// Run runs the suite. newTarget is called once per subtest; it may hand
// out the same node every time (the suite kills what it creates), but the
// node must hold no sandbox the suite did not make while a subtest runs.
func Run(t *testing.T, newTarget func(t *testing.T) Target) {
	for _, c := range []struct {
		name string
		fn   func(*testing.T, *suite)
	}{
		{"Info", testInfo},
		{"CreateIdempotent", testCreateIdempotent},
		{"ConcurrentCreateReplays", testConcurrentCreates},
		{"GetAndList", testGetAndList},
		{"PauseResumeHibernate", testLifecycle},
		{"SnapshotIdempotent", testSnapshot},
		{"ForkIdempotentPerChild", testFork},
		{"Rollback", testRollback},
		{"PolicyAndReconfigure", testPolicy},
		{"Stats", testStats},
		{"KillThenNotFound", testKill},
		{"UnknownIDs", testUnknownIDs},
		{"BadInput", testBadInput},
		{"EventsDied", testEventsDied},
		{"BlobStore", testBlobStore},
		{"BuildImage", testBuildImage},
		{"Export", testExport},
		{"Files", testFiles},
	} {
		t.Run(c.name, func(t *testing.T) {
			ctx, cancel := context.WithTimeout(context.Background(), Timeout)
			defer cancel()
			tg := newTarget(t)
			s := &suite{t: t, ctx: ctx, Target: tg, n: tg.Node}
			t.Cleanup(s.cleanup)
			c.fn(t, s)
		})
	}
}

type suite struct {
	t   *testing.T
	ctx context.Context
	Target
	n nodeapi.Node

	mu    sync.Mutex
	made  []string // sandboxes to kill at the end
	snaps []string // snapshots to delete at the end
}

// cleanup kills every sandbox and deletes every snapshot the subtest made
// (gone already is fine).
func (s *suite) cleanup() {
	ctx, cancel := context.WithTimeout(context.Background(), Timeout)
	defer cancel()
	s.mu.Lock()
	made, snaps := s.made, s.snaps
	s.mu.Unlock()
	for _, id := range made {
		if err := s.n.Kill(ctx, id); err != nil && !errdefs.IsNotFound(err) {
			s.t.Errorf("cleanup: kill %s: %v", id, err)
		}
	}
	for _, id := range snaps {
		if err := s.n.DeleteSnapshot(ctx, id); err != nil && !errdefs.IsNotFound(err) {
			s.t.Errorf("cleanup: delete snapshot %s: %v", id, err)
		}
	}
}

func (s *suite) track(id string) {
	s.mu.Lock()
	s.made = append(s.made, id)
	s.mu.Unlock()
}

func (s *suite) trackSnap(id string) {
	s.mu.Lock()
	s.snaps = append(s.snaps, id)
	s.mu.Unlock()
}

// mint is what the control plane does before it calls: an ID and a token.
func mint() (id, token string) { return ids.New('i'), ids.New('t') }

func (s *suite) create(req nodeapi.CreateRequest) nodeapi.Sandbox {
	s.t.Helper()
	if req.SandboxID == "" {
		req.SandboxID, req.AccessToken = mint()
	}
	if req.Template == "" {
		req.Template = s.Template
	}
	s.track(req.SandboxID)
	sb, err := s.n.Create(s.ctx, req)
	if err != nil {
		s.t.Fatalf("create %s from %s: %v", req.SandboxID, req.Template, err)
	}
	if sb.ID != req.SandboxID || sb.AccessToken != req.AccessToken || sb.State != nodeapi.StateRunning {
		s.t.Fatalf("create gave %s (token %q, %s), want %s (token %q, running)", sb.ID, sb.AccessToken, sb.State, req.SandboxID, req.AccessToken)
	}
	return sb
}

func (s *suite) snapshot(id string) nodeapi.SnapshotInfo {
	s.t.Helper()
	snapID := ids.New('s')
	s.trackSnap(snapID)
	info, err := s.n.Snapshot(s.ctx, id, nodeapi.SnapshotRequest{SnapshotID: snapID})
	if err != nil {
		s.t.Fatalf("snapshot %s: %v", id, err)
	}
	if info.ID != snapID || info.Origin != id || info.Kind != nodeapi.KindSnapshot {
		s.t.Fatalf("snapshot of %s = %+v, want ID %s, origin %s, kind snapshot", id, info, snapID, id)
	}
	return info
}

func (s *suite) state(id string) string {
	s.t.Helper()
	sb, err := s.n.Get(s.ctx, id)
	if err != nil {
		s.t.Fatalf("get %s: %v", id, err)
	}
	return sb.State
}

// wantKind fails unless err is of kind (an errdefs sentinel or a context
// error).
func wantKind(t *testing.T, what string, err, kind error) {
	t.Helper()
	if !errors.Is(err, kind) {
		t.Errorf("%s = %v, want %v", what, err, kind)
	}
}

// sameSandbox reports whether two answers describe the one sandbox
// (a replay must not make a second: same ID, token, creation time).
func sameSandbox(a, b nodeapi.Sandbox) bool {
	return a.ID == b.ID && a.AccessToken == b.AccessToken && a.CreatedAt.Equal(b.CreatedAt) && a.Parent == b.Parent
}

func (s *suite) count(id string) int {
	s.t.Helper()
	list, err := s.n.List(s.ctx)
	if err != nil {
		s.t.Fatalf("list: %v", err)
	}
	n := 0
	for _, sb := range list {
		if sb.ID == id {
			n++
		}
	}
	return n
}

func testInfo(t *testing.T, s *suite) {
	info, err := s.n.Info(s.ctx)
	if err != nil {
		t.Fatal(err)
	}
	if info.ID == "" || info.RunscBuild == "" {
		t.Errorf("info without ID or runtime build: %+v", info)
	}
	if info.Capacity.MemoryMB <= 0 || info.Capacity.VCPUs <= 0 || info.Capacity.Sandboxes <= 0 {
		t.Errorf("info without capacity: %+v", info.Capacity)
	}
	// The nodes under test run on this host: their capacity is its real
	// CPUs (the overcommit is a ratio of its own, and crosses the wire).
	if info.Capacity.VCPUs > float64(goruntime.NumCPU()) {
		t.Errorf("capacity %g vCPUs on a host of %d CPUs: overcommit folded into the figure", info.Capacity.VCPUs, goruntime.NumCPU())
	}
	if info.Overcommit.Memory < 1 || info.Overcommit.VCPUs < 1 {
		t.Errorf("info without overcommit ratios: %+v", info.Overcommit)
	}
	if !slices.Contains(info.Templates, s.Template) {
		t.Errorf("info templates %v lack %s", info.Templates, s.Template)
	}
}

func testCreateIdempotent(t *testing.T, s *suite) {
	id, token := mint()
	req := nodeapi.CreateRequest{SandboxID: id, AccessToken: token, Template: s.Template, Env: []string{"NODETEST=1"}}
	first := s.create(req)
	if first.Addr == "" || first.CreatedAt.IsZero() || first.Template == "" {
		t.Errorf("created sandbox without address, creation time or template: %+v", first)
	}
	if !slices.Contains(first.Env, "NODETEST=1") {
		t.Errorf("env %v lacks the requested NODETEST=1", first.Env)
	}
	again, err := s.n.Create(s.ctx, req)
	if err != nil {
		t.Fatalf("replayed create: %v", err)
	}
	if !sameSandbox(first, again) {
		t.Fatalf("replayed create gave %+v, want the first sandbox %+v", again, first)
	}
	if n := s.count(id); n != 1 {
		t.Fatalf("%d sandboxes %s listed after a replayed create, want 1", n, id)
	}
	// The ID reused for something else is not a replay.
	snap := s.snapshot(id)
	_, err = s.n.Create(s.ctx, nodeapi.CreateRequest{SandboxID: id, AccessToken: token, Template: snap.ID})
	wantKind(t, "create under a taken ID from another source", err, errdefs.ErrAlreadyExists)
	if got := s.state(id); got != nodeapi.StateRunning {
		t.Errorf("the sandbox whose ID was reused is %s, want running", got)
	}
	// A create from a snapshot: the snapshot is the child's parent.
	child := s.create(nodeapi.CreateRequest{Template: snap.ID})
	if child.Parent != snap.ID {
		t.Errorf("sandbox made from snapshot %s has parent %q", snap.ID, child.Parent)
	}
}

func testConcurrentCreates(t *testing.T, s *suite) {
	id, token := mint()
	s.track(id)
	const n = 4
	got := make([]nodeapi.Sandbox, n)
	errs := make([]error, n)
	var wg sync.WaitGroup
	for i := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			got[i], errs[i] = s.n.Create(s.ctx, nodeapi.CreateRequest{SandboxID: id, AccessToken: token, Template: s.Template})
		}()
	}
	wg.Wait()
	for i := range n {
		if errs[i] != nil {
			t.Fatalf("create %d of %d with one ID: %v", i, n, errs[i])
		}
		if !sameSandbox(got[0], got[i]) {
			t.Fatalf("concurrent creates with one ID gave two sandboxes: %+v and %+v", got[0], got[i])
		}
	}
	if c := s.count(id); c != 1 {
		t.Fatalf("%d sandboxes %s listed, want 1", c, id)
	}
}

func testGetAndList(t *testing.T, s *suite) {
	a := s.create(nodeapi.CreateRequest{})
	b := s.create(nodeapi.CreateRequest{})
	got, err := s.n.Get(s.ctx, a.ID)
	if err != nil {
		t.Fatal(err)
	}
	if !sameSandbox(got, a) || got.State != nodeapi.StateRunning || got.Addr != a.Addr || got.Limits != a.Limits {
		t.Errorf("get %s = %+v, want %+v", a.ID, got, a)
	}
	list, err := s.n.List(s.ctx)
	if err != nil {
		t.Fatal(err)
	}
	var seen []string
	for _, sb := range list {
		if sb.ID == a.ID || sb.ID == b.ID {
			seen = append(seen, sb.ID)
		}
	}
	// Oldest first.
	if !slices.Equal(seen, []string{a.ID, b.ID}) {
		t.Errorf("list holds %v of ours, want [%s %s] in creation order", seen, a.ID, b.ID)
	}
}

func testLifecycle(t *testing.T, s *suite) {
	sb := s.create(nodeapi.CreateRequest{})
	step := func(what string, fn func(context.Context, string) error, want string) {
		t.Helper()
		if err := fn(s.ctx, sb.ID); err != nil {
			t.Fatalf("%s %s: %v", what, sb.ID, err)
		}
		if got := s.state(sb.ID); got != want {
			t.Fatalf("after %s: state %s, want %s", what, got, want)
		}
	}
	// resume: Resume answers the sandbox as Get then does.
	resume := func(ctx context.Context, id string) error {
		got, err := s.n.Resume(ctx, id)
		if err != nil {
			return err
		}
		if now, err := s.n.Get(ctx, id); err != nil || got.State != nodeapi.StateRunning || got.Addr != now.Addr ||
			got.AccessToken != now.AccessToken || got.ID != id {
			return fmt.Errorf("resume answered %+v; get then says %+v, %v", got, now, err)
		}
		return nil
	}
	step("pause", s.n.Pause, nodeapi.StatePaused)
	wantKind(t, "pause of a paused sandbox", s.n.Pause(s.ctx, sb.ID), errdefs.ErrConflict)
	step("resume", resume, nodeapi.StateRunning)
	_, err := s.n.Resume(s.ctx, sb.ID)
	wantKind(t, "resume of a running sandbox", err, errdefs.ErrConflict)
	// A drain's quiesce, then its hibernation: with nothing in flight the
	// wait ends at once, and the sandbox stays running until hibernated.
	if n, err := s.n.Quiesce(s.ctx, sb.ID, 30*time.Second); err != nil || n != 0 {
		t.Errorf("quiesce of an idle sandbox: %d in flight, %v; want 0, nil", n, err)
	}
	if got, err := s.n.Get(s.ctx, sb.ID); err != nil || got.State != nodeapi.StateRunning {
		t.Errorf("after quiesce: %+v %v, want running", got, err)
	}
	_, err = s.n.Quiesce(s.ctx, "inosuchsandbox000001", time.Second)
	wantKind(t, "quiesce of an unknown sandbox", err, errdefs.ErrNotFound)
	step("hibernate", s.n.Hibernate, nodeapi.StateHibernated)
	got, _ := s.n.Get(s.ctx, sb.ID)
	if got.Addr != "" {
		t.Errorf("hibernated sandbox has address %q", got.Addr)
	}
	wantKind(t, "hibernate of a hibernated sandbox", s.n.Hibernate(s.ctx, sb.ID), errdefs.ErrConflict)
	wantKind(t, "pause of a hibernated sandbox", s.n.Pause(s.ctx, sb.ID), errdefs.ErrConflict)
	// The node lists the hibernation it holds.
	snaps, err := s.n.Snapshots(s.ctx)
	if err != nil {
		t.Fatal(err)
	}
	if !slices.ContainsFunc(snaps, func(m nodeapi.SnapshotInfo) bool {
		return m.Kind == nodeapi.KindHibernation && m.Origin == sb.ID
	}) {
		t.Errorf("snapshots hold no hibernation of %s", sb.ID)
	}
	step("resume from hibernation", resume, nodeapi.StateRunning)
	got, _ = s.n.Get(s.ctx, sb.ID)
	if got.Addr == "" || got.AccessToken != sb.AccessToken {
		t.Errorf("resumed sandbox: address %q, token %q (want an address and %q)", got.Addr, got.AccessToken, sb.AccessToken)
	}
	step("pause", s.n.Pause, nodeapi.StatePaused)
	step("hibernate from paused", s.n.Hibernate, nodeapi.StateHibernated)
	step("resume", resume, nodeapi.StateRunning)
}

func testSnapshot(t *testing.T, s *suite) {
	sb := s.create(nodeapi.CreateRequest{})
	other := s.create(nodeapi.CreateRequest{})
	snapID := ids.New('s')
	s.trackSnap(snapID)
	req := nodeapi.SnapshotRequest{SnapshotID: snapID, Names: []string{"nodetest-" + snapID}}
	first, err := s.n.Snapshot(s.ctx, sb.ID, req)
	if err != nil {
		t.Fatal(err)
	}
	if first.ID != snapID || first.Origin != sb.ID || !slices.Contains(first.Names, req.Names[0]) || first.CreatedAt.IsZero() {
		t.Fatalf("snapshot = %+v, want ID %s of %s named %s", first, snapID, sb.ID, req.Names[0])
	}
	again, err := s.n.Snapshot(s.ctx, sb.ID, req)
	if err != nil {
		t.Fatalf("replayed snapshot: %v", err)
	}
	if again.ID != first.ID || !again.CreatedAt.Equal(first.CreatedAt) {
		t.Fatalf("replayed snapshot = %+v, want the first %+v", again, first)
	}
	snaps, err := s.n.Snapshots(s.ctx)
	if err != nil {
		t.Fatal(err)
	}
	n := 0
	for _, m := range snaps {
		if m.ID == snapID {
			n++
		}
	}
	if n != 1 {
		t.Fatalf("%d snapshots %s listed after a replay, want 1", n, snapID)
	}
	for _, ref := range []string{snapID, req.Names[0]} {
		if got, err := s.n.GetSnapshot(s.ctx, ref); err != nil || got.ID != snapID {
			t.Errorf("get snapshot %s = %+v, %v", ref, got, err)
		}
	}
	_, err = s.n.Snapshot(s.ctx, other.ID, nodeapi.SnapshotRequest{SnapshotID: snapID})
	wantKind(t, "another sandbox's snapshot under a taken snapshot ID", err, errdefs.ErrAlreadyExists)
	if err := s.n.DeleteSnapshot(s.ctx, snapID); err != nil {
		t.Fatal(err)
	}
	_, err = s.n.GetSnapshot(s.ctx, snapID)
	wantKind(t, "get of a deleted snapshot", err, errdefs.ErrNotFound)
	wantKind(t, "delete of a deleted snapshot", s.n.DeleteSnapshot(s.ctx, snapID), errdefs.ErrNotFound)
}

func testFork(t *testing.T, s *suite) {
	src := s.create(nodeapi.CreateRequest{})
	spec := func() nodeapi.ForkChildSpec {
		id, token := mint()
		s.track(id)
		return nodeapi.ForkChildSpec{SandboxID: id, AccessToken: token}
	}
	c1, c2 := spec(), spec()
	req := nodeapi.ForkRequest{Children: []nodeapi.ForkChildSpec{c1, c2}}
	first, err := s.n.Fork(s.ctx, src.ID, req)
	if err != nil {
		t.Fatal(err)
	}
	if len(first.Children) != 2 {
		t.Fatalf("fork gave %d children, want 2", len(first.Children))
	}
	for i, c := range first.Children {
		if c.Err != nil {
			t.Fatalf("child %d: %v", i, c.Err)
		}
		want := req.Children[i]
		if c.Sandbox.ID != want.SandboxID || c.Sandbox.AccessToken != want.AccessToken || c.Sandbox.State != nodeapi.StateRunning || c.Sandbox.Addr == "" {
			t.Fatalf("child %d = %+v, want %s with token %s, running", i, c.Sandbox, want.SandboxID, want.AccessToken)
		}
	}
	if got := s.state(src.ID); got != nodeapi.StateRunning {
		t.Errorf("fork source is %s after the fork, want running", got)
	}
	// A replay returns the same children; a third child named beside them
	// is made, the two are returned as they are.
	c3 := spec()
	again, err := s.n.Fork(s.ctx, src.ID, nodeapi.ForkRequest{Children: []nodeapi.ForkChildSpec{c1, c2, c3}})
	if err != nil {
		t.Fatalf("replayed fork: %v", err)
	}
	if len(again.Children) != 3 {
		t.Fatalf("replayed fork gave %d children, want 3", len(again.Children))
	}
	for i, c := range again.Children {
		if c.Err != nil {
			t.Fatalf("replayed fork, child %d: %v", i, c.Err)
		}
		if i < 2 && !sameSandbox(c.Sandbox, first.Children[i].Sandbox) {
			t.Errorf("replayed fork, child %d = %+v, want the first %+v", i, c.Sandbox, first.Children[i].Sandbox)
		}
	}
	if again.Children[2].Sandbox.ID != c3.SandboxID {
		t.Errorf("third child = %s, want %s", again.Children[2].Sandbox.ID, c3.SandboxID)
	}
	for _, c := range []nodeapi.ForkChildSpec{c1, c2, c3} {
		if n := s.count(c.SandboxID); n != 1 {
			t.Errorf("%d sandboxes %s listed, want 1", n, c.SandboxID)
		}
	}
	// A child ID that names a sandbox that is not this source's child
	// fails that child only.
	stranger := s.create(nodeapi.CreateRequest{})
	c4 := spec()
	res, err := s.n.Fork(s.ctx, src.ID, nodeapi.ForkRequest{Children: []nodeapi.ForkChildSpec{
		{SandboxID: stranger.ID, AccessToken: stranger.AccessToken}, c4}})
	if err != nil {
		t.Fatal(err)
	}
	if len(res.Children) != 2 {
		t.Fatalf("fork gave %d children, want 2", len(res.Children))
	}
	wantKind(t, "fork child under a stranger's ID", res.Children[0].Err, errdefs.ErrAlreadyExists)
	if res.Children[1].Err != nil || res.Children[1].Sandbox.ID != c4.SandboxID {
		t.Errorf("fork child beside the stranger = %+v, %v", res.Children[1].Sandbox, res.Children[1].Err)
	}
	if got, err := s.n.Get(s.ctx, stranger.ID); err != nil || !sameSandbox(got, stranger) {
		t.Errorf("the stranger after the fork: %+v, %v", got, err)
	}
	_, err = s.n.Fork(s.ctx, src.ID, nodeapi.ForkRequest{})
	wantKind(t, "fork with no children", err, errdefs.ErrInvalidArgument)
}

func testRollback(t *testing.T, s *suite) {
	sb := s.create(nodeapi.CreateRequest{})
	snap := s.snapshot(sb.ID)
	got, err := s.n.Rollback(s.ctx, sb.ID, snap.ID)
	if err != nil {
		t.Fatal(err)
	}
	if got.ID != sb.ID || got.AccessToken != sb.AccessToken || got.Parent != snap.ID || got.State != nodeapi.StateRunning || got.Addr == "" {
		t.Fatalf("rollback gave %+v, want %s with token %s, parent %s, running", got, sb.ID, sb.AccessToken, snap.ID)
	}
	if n := s.count(sb.ID); n != 1 {
		t.Errorf("%d sandboxes %s after the rollback, want 1", n, sb.ID)
	}
	_, err = s.n.Rollback(s.ctx, sb.ID, ids.New('s'))
	wantKind(t, "rollback to an unknown snapshot", err, errdefs.ErrNotFound)
	if got := s.state(sb.ID); got != nodeapi.StateRunning {
		t.Errorf("after a failed rollback: %s, want running", got)
	}
}

func testPolicy(t *testing.T, s *suite) {
	deny := netip.MustParsePrefix("203.0.113.0/24")
	sb := s.create(nodeapi.CreateRequest{Policy: &nodeapi.Policy{Internet: true, Deny: []netip.Prefix{deny}}})
	if !sb.Policy.Internet || !slices.Equal(sb.Policy.Deny, []netip.Prefix{deny}) {
		t.Errorf("created with policy %+v, want internet and deny %s", sb.Policy, deny)
	}
	allow := netip.MustParsePrefix("198.51.100.0/24")
	p := nodeapi.Policy{Internet: false, Allow: []netip.Prefix{allow}}
	if err := s.n.SetPolicy(s.ctx, sb.ID, p); err != nil {
		t.Fatal(err)
	}
	got, err := s.n.Get(s.ctx, sb.ID)
	if err != nil {
		t.Fatal(err)
	}
	if got.Policy.Internet || !slices.Equal(got.Policy.Allow, p.Allow) || len(got.Policy.Deny) != 0 {
		t.Errorf("policy after SetPolicy = %+v, want %+v", got.Policy, p)
	}
	back := nodeapi.Policy{Internet: true}
	got, err = s.n.Reconfigure(s.ctx, sb.ID, []string{"RECONF=2"}, &back)
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Contains(got.Env, "RECONF=2") || !got.Policy.Internet || len(got.Policy.Allow) != 0 {
		t.Errorf("after reconfigure: env %v policy %+v", got.Env, got.Policy)
	}
	// No policy: the policy is kept.
	got, err = s.n.Reconfigure(s.ctx, sb.ID, nil, nil)
	if err != nil || !got.Policy.Internet {
		t.Errorf("reconfigure without policy: %+v, %v", got.Policy, err)
	}
}

func testStats(t *testing.T, s *suite) {
	sb := s.create(nodeapi.CreateRequest{})
	st, err := s.n.Stats(s.ctx, sb.ID)
	if err != nil {
		t.Fatal(err)
	}
	if st.At.IsZero() || st.MemoryBytes <= 0 {
		t.Errorf("stats of a running sandbox: %+v", st)
	}
	// Its history: the samples taken since it runs (the first sample of
	// an instance only reads its CPU time), in the bounds asked.
	t0 := time.Now()
	s.Sample(s.ctx)
	time.Sleep(10 * time.Millisecond)
	s.Sample(s.ctx)
	h, err := s.n.StatsHistory(s.ctx, sb.ID, time.Time{}, time.Time{})
	if err != nil {
		t.Fatal(err)
	}
	if len(h) == 0 {
		t.Fatal("no history after two samples")
	}
	last := h[len(h)-1]
	if last.At.Before(t0) || last.MemoryBytes <= 0 || last.VCPUs <= 0 || last.CPUPct < 0 || last.CPUPct > 100 {
		t.Errorf("the last sample of the history: %+v", last)
	}
	for i := 1; i < len(h); i++ {
		if h[i].At.Before(h[i-1].At) {
			t.Errorf("history out of order: %v before %v", h[i].At, h[i-1].At)
		}
	}
	if later, err := s.n.StatsHistory(s.ctx, sb.ID, last.At.Add(time.Millisecond), time.Time{}); err != nil || len(later) != 0 {
		t.Errorf("history after its last sample: %+v %v", later, err)
	}
	if upTo, err := s.n.StatsHistory(s.ctx, sb.ID, time.Time{}, last.At); err != nil || len(upTo) != len(h) {
		t.Errorf("history up to its last sample: %d samples (%v), want %d", len(upTo), err, len(h))
	}
	if err := s.n.Hibernate(s.ctx, sb.ID); err != nil {
		t.Fatal(err)
	}
	_, err = s.n.Stats(s.ctx, sb.ID)
	wantKind(t, "stats of a hibernated sandbox", err, errdefs.ErrConflict)
}

func testKill(t *testing.T, s *suite) {
	sb := s.create(nodeapi.CreateRequest{})
	if err := s.n.Kill(s.ctx, sb.ID); err != nil {
		t.Fatal(err)
	}
	_, err := s.n.Get(s.ctx, sb.ID)
	wantKind(t, "get after kill", err, errdefs.ErrNotFound)
	wantKind(t, "kill after kill", s.n.Kill(s.ctx, sb.ID), errdefs.ErrNotFound)
	if n := s.count(sb.ID); n != 0 {
		t.Errorf("killed sandbox still listed")
	}
	// A hibernated sandbox's kill frees its hibernation too.
	h := s.create(nodeapi.CreateRequest{})
	if err := s.n.Hibernate(s.ctx, h.ID); err != nil {
		t.Fatal(err)
	}
	if err := s.n.Kill(s.ctx, h.ID); err != nil {
		t.Fatal(err)
	}
	snaps, err := s.n.Snapshots(s.ctx)
	if err != nil {
		t.Fatal(err)
	}
	for _, m := range snaps {
		if m.Kind == nodeapi.KindHibernation && m.Origin == h.ID {
			t.Errorf("hibernation %s of killed sandbox %s still held", m.ID, h.ID)
		}
	}
}

// Every operation on a sandbox the node does not have is ErrNotFound; on
// a malformed ID, ErrInvalidArgument (it never reaches a path).
func testUnknownIDs(t *testing.T, s *suite) {
	ctx := s.ctx
	n := s.n
	ops := map[string]func(id string) error{
		"get":       func(id string) error { _, err := n.Get(ctx, id); return err },
		"kill":      func(id string) error { return n.Kill(ctx, id) },
		"pause":     func(id string) error { return n.Pause(ctx, id) },
		"resume":    func(id string) error { _, err := n.Resume(ctx, id); return err },
		"hibernate": func(id string) error { return n.Hibernate(ctx, id) },
		"stats":     func(id string) error { _, err := n.Stats(ctx, id); return err },
		"history": func(id string) error {
			_, err := n.StatsHistory(ctx, id, time.Time{}, time.Time{})
			return err
		},
		"set policy":  func(id string) error { return n.SetPolicy(ctx, id, nodeapi.Policy{Internet: true}) },
		"reconfigure": func(id string) error { _, err := n.Reconfigure(ctx, id, []string{"A=1"}, nil); return err },
		"snapshot": func(id string) error {
			_, err := n.Snapshot(ctx, id, nodeapi.SnapshotRequest{SnapshotID: ids.New('s')})
			return err
		},
		"fork": func(id string) error {
			cid, tok := mint()
			_, err := n.Fork(ctx, id, nodeapi.ForkRequest{Children: []nodeapi.ForkChildSpec{{SandboxID: cid, AccessToken: tok}}})
			return err
		},
		"rollback": func(id string) error { _, err := n.Rollback(ctx, id, s.Template); return err },
	}
	for name, op := range ops {
		wantKind(t, name+" of an unknown sandbox", op(ids.New('i')), errdefs.ErrNotFound)
		wantKind(t, name+" of a malformed ID", op("../etc"), errdefs.ErrInvalidArgument)
	}
	_, err := n.GetSnapshot(ctx, ids.New('s'))
	wantKind(t, "get of an unknown snapshot", err, errdefs.ErrNotFound)
	wantKind(t, "delete of an unknown snapshot", n.DeleteSnapshot(ctx, ids.New('s')), errdefs.ErrNotFound)
	id, tok := mint()
	_, err = n.Create(ctx, nodeapi.CreateRequest{SandboxID: id, AccessToken: tok, Template: "no-such-template"})
	wantKind(t, "create from an unknown template", err, errdefs.ErrNotFound)
	if _, err := n.Get(ctx, id); !errdefs.IsNotFound(err) {
		t.Errorf("a failed create left sandbox %s: %v", id, err)
	}
}

func testBadInput(t *testing.T, s *suite) {
	ctx := s.ctx
	id, tok := mint()
	for name, req := range map[string]nodeapi.CreateRequest{
		"no ID":           {AccessToken: tok, Template: s.Template},
		"no token":        {SandboxID: id, Template: s.Template},
		"malformed ID":    {SandboxID: "Bad/ID", AccessToken: tok, Template: s.Template},
		"no template":     {SandboxID: id, AccessToken: tok},
		"negative memory": {SandboxID: id, AccessToken: tok, Template: s.Template, MemoryMB: -1},
	} {
		_, err := s.n.Create(ctx, req)
		wantKind(t, "create with "+name, err, errdefs.ErrInvalidArgument)
	}
	if _, err := s.n.Get(ctx, id); !errdefs.IsNotFound(err) {
		t.Errorf("a refused create left sandbox %s: %v", id, err)
	}
	sb := s.create(nodeapi.CreateRequest{})
	_, err := s.n.Snapshot(ctx, sb.ID, nodeapi.SnapshotRequest{})
	wantKind(t, "snapshot without an ID", err, errdefs.ErrInvalidArgument)
	_, err = s.n.Snapshot(ctx, sb.ID, nodeapi.SnapshotRequest{SnapshotID: "../x"})
	wantKind(t, "snapshot with a malformed ID", err, errdefs.ErrInvalidArgument)
	cid, _ := mint()
	_, err = s.n.Fork(ctx, sb.ID, nodeapi.ForkRequest{Children: []nodeapi.ForkChildSpec{{SandboxID: cid}}})
	wantKind(t, "fork child without a token", err, errdefs.ErrInvalidArgument)
	_, err = s.n.Fork(ctx, sb.ID, nodeapi.ForkRequest{Children: []nodeapi.ForkChildSpec{{SandboxID: "x/../y", AccessToken: "t"}}})
	wantKind(t, "fork child with a malformed ID", err, errdefs.ErrInvalidArgument)
	many := make([]nodeapi.ForkChildSpec, nodeapi.MaxFork+1)
	for i := range many {
		many[i].SandboxID, many[i].AccessToken = mint()
	}
	_, err = s.n.Fork(ctx, sb.ID, nodeapi.ForkRequest{Children: many})
	wantKind(t, "fork of more than MaxFork", err, errdefs.ErrInvalidArgument)
	if got := s.state(sb.ID); got != nodeapi.StateRunning {
		t.Errorf("after refused calls the sandbox is %s, want running", got)
	}
}

// A sandbox whose instance dies by itself: an event says so, Get shows it
// dead with a reason, and Kill still frees it.
func testEventsDied(t *testing.T, s *suite) {
	if s.Die == nil {
		t.Fatal("the target has no Die hook: the died event cannot be checked")
	}
	ctx, cancel := context.WithCancel(s.ctx)
	defer cancel()
	events, err := s.n.Events(ctx)
	if err != nil {
		t.Fatal(err)
	}
	sb := s.create(nodeapi.CreateRequest{})
	wait := func(what string, match func(nodeapi.Event) bool) nodeapi.Event {
		t.Helper()
		deadline := time.After(time.Minute)
		for {
			select {
			case ev, open := <-events:
				if !open {
					t.Fatalf("event stream closed while waiting for %s", what)
				}
				if match(ev) {
					return ev
				}
			case <-deadline:
				t.Fatalf("no %s event within a minute", what)
			}
		}
	}
	done := wait("op-done create", func(ev nodeapi.Event) bool {
		return ev.Kind == nodeapi.EventOpDone && ev.SandboxID == sb.ID && ev.Op == "create"
	})
	if done.Err != "" || done.At.IsZero() {
		t.Errorf("create's op-done event: %+v", done)
	}
	if err := s.Die(s.ctx, sb.ID); err != nil {
		t.Fatal(err)
	}
	died := wait("died", func(ev nodeapi.Event) bool { return ev.Kind == nodeapi.EventDied && ev.SandboxID == sb.ID })
	if died.Reason == "" || died.At.IsZero() {
		t.Errorf("died event without reason or time: %+v", died)
	}
	got, err := s.n.Get(s.ctx, sb.ID)
	if err != nil {
		t.Fatal(err)
	}
	if got.State != nodeapi.StateDead || got.Death == nil || got.Death.Reason != died.Reason {
		t.Errorf("after the death: state %s, death %+v (event reason %s)", got.State, got.Death, died.Reason)
	}
	if err := s.n.Kill(s.ctx, sb.ID); err != nil {
		t.Fatalf("kill of a dead sandbox: %v", err)
	}
	_, err = s.n.Get(s.ctx, sb.ID)
	wantKind(t, "get after kill", err, errdefs.ErrNotFound)
	// The stream ends with its context.
	cancel()
	deadline := time.After(time.Minute)
	for {
		select {
		case _, open := <-events:
			if !open {
				return
			}
		case <-deadline:
			t.Fatal("event stream still open a minute after its context ended")
		}
	}
}

package control_test

import (
	"bytes"
	"context"
	"fmt"
	"log/slog"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/spore-run/spore/internal/blob"
	"github.com/spore-run/spore/internal/blob/local"
	"github.com/spore-run/spore/internal/chunk"
	"github.com/spore-run/spore/internal/control"
	"github.com/spore-run/spore/internal/control/controltest"
	"github.com/spore-run/spore/internal/errdefs"
	"github.com/spore-run/spore/internal/nodeapi"
	lnode "github.com/spore-run/spore/internal/nodeapi/local"
	"github.com/spore-run/spore/internal/runtime"
	"github.com/spore-run/spore/internal/snapsync"
	"github.com/spore-run/spore/internal/store"
)

// durableFleet is two fake nodes sharing a blob store (a directory).
type durableFleet struct {
	*fleet
	blobs blob.Store
}

func newDurableFleet(t *testing.T, c controltest.Config) *durableFleet {
	return newDurableFleetOf(t, c, nodeapi.Resources{})
}

// wrapNode, when set, wraps each node of the next durable fleet (tests
// that make a node misbehave).
var wrapNode func(id string, n nodeapi.Node) nodeapi.Node

// newDurableFleetOf is newDurableFleet with nodes of this capacity (and
// no overcommit), when given.
func newDurableFleetOf(t *testing.T, c controltest.Config, capacity nodeapi.Resources) *durableFleet {
	t.Helper()
	return newDurableFleetWith(t, c, capacity, false)
}

// newDurableFleetWith is newDurableFleetOf whose nodes, with volumes,
// keep volume images and carry a snapshot's volume copies through the
// blob store as the real node does (and publish the fake root
// filesystem as an empty one).
func newDurableFleetWith(t *testing.T, c controltest.Config, capacity nodeapi.Resources, volumes bool) *durableFleet {
	t.Helper()
	st := c.Store(t)
	blobs, err := local.Open(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	a, b := controltest.New(t), controltest.New(t)
	mk := func(id string, n *controltest.Node) *lnode.Node {
		cache, err := chunk.OpenCache(filepath.Join(n.Dir, "chunk-cache"), 64<<20)
		if err != nil {
			t.Fatal(err)
		}
		sc := snapsync.Config{Repo: n.Engine.Snapshots(), Store: blobs, Cache: cache, Runtime: n.Engine.Runtime().Name(), Log: slog.New(slog.DiscardHandler)}
		if volumes {
			sc.Deps = n.Volumes.Deps()
		}
		sy, err := snapsync.New(sc)
		if err != nil {
			t.Fatal(err)
		}
		cfg := lnode.Config{ID: id, Sync: sy}
		if volumes {
			cfg.Images = n.Volumes
		}
		if capacity != (nodeapi.Resources{}) {
			cfg.Capacity, cfg.Overcommit = capacity, nodeapi.Overcommit{Memory: 1, VCPUs: 1}
		}
		return lnode.New(n.Engine, cfg)
	}
	wrap := func(id string, n nodeapi.Node) nodeapi.Node {
		if wrapNode != nil {
			return wrapNode(id, n)
		}
		return n
	}
	h := &harness{t: t, n: a, st: st, clk: &clock{t: time.Now().UTC()}}
	h.nodes = control.Nodes{"na": c.Node(t, wrap("na", mk("na", a))), "nb": c.Node(t, wrap("nb", mk("nb", b)))}
	h.ctl = control.New(control.Config{Store: st, Nodes: h.nodes, Now: h.clk.Now})
	t.Cleanup(h.ctl.Close)
	if err := h.ctl.RegisterNodes(ctxFor(t)); err != nil {
		t.Fatal(err)
	}
	return &durableFleet{fleet: &fleet{harness: h, a: a, b: b}, blobs: blobs}
}

// hibernateDurable hibernates sandbox id and waits for its image to be
// durable.
func (f *durableFleet) hibernateDurable(id string) {
	f.t.Helper()
	if err := f.ctl.Hibernate(ctxFor(f.t), id); err != nil {
		f.t.Fatal(err)
	}
	deadline := time.Now().Add(30 * time.Second)
	for !f.row(id).HibernationDurable {
		if time.Now().After(deadline) {
			f.t.Fatalf("hibernation never durable: %+v", f.row(id))
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// loseNodeA makes na lost: both nodes beat, the clock passes LostAfter,
// only nb beats again, and the control plane checks its nodes.
func (f *durableFleet) loseNodeA() {
	f.t.Helper()
	f.beat("na")
	f.beat("nb")
	f.clk.Add(control.LostAfter + time.Second)
	f.beat("nb")
	if err := f.ctl.CheckNodes(ctxFor(f.t)); err != nil {
		f.t.Fatal(err)
	}
}

// waitStorage waits for a snapshot row's storage state.
func (f *durableFleet) waitStorage(id, want string) store.Snapshot {
	f.t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for {
		sn, err := f.st.GetSnapshot(ctxFor(f.t), id)
		if err != nil {
			f.t.Fatal(err)
		}
		if sn.Storage == want {
			return sn
		}
		if time.Now().After(deadline) {
			f.t.Fatalf("snapshot %s is %q, want %q", id, sn.Storage, want)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// blobKeys lists the store's keys under prefix.
func (f *durableFleet) blobKeys(prefix string) []string {
	var out []string
	if err := f.blobs.List(ctxFor(f.t), prefix, func(i blob.Info) error { out = append(out, i.Key); return nil }); err != nil {
		f.t.Fatal(err)
	}
	return out
}

// A snapshot taken on one node becomes durable in the background (row
// local → uploading → durable, with the bytes it stored); a create from it
// (by ID or name) lands on the other node when the first is drained, which
// fetches it; deleting it removes the origin's copy, the fetched copy and
// the durable one. Before, the snapshot was pinned to its node: the create
// could only go there.
func TestSnapshotDurableAndRestoredElsewhere(t *testing.T) {
	controltest.Each(t, testSnapshotDurableAndRestoredElsewhere)
}

func testSnapshotDurableAndRestoredElsewhere(t *testing.T, c controltest.Config) {
	f := newDurableFleet(t, c)
	ctx := ctxFor(t)
	src := f.onNode("na")
	sn, err := f.ctl.Snapshot(ctx, src.ID, "keep-me", false)
	if err != nil {
		t.Fatal(err)
	}
	// Written with its upload's intent: a crash before the upload begins
	// leaves a row RetryUploads takes (it was written local, and stayed
	// local for good: test/sdk TestUploadSurvivesSIGKILL, once).
	if sn.Storage != store.StorageUploading {
		t.Fatalf("the row as written: %q, want %q", sn.Storage, store.StorageUploading)
	}
	got := f.waitStorage(sn.ID, store.StorageDurable)
	if got.StoredBytes <= 0 || got.NodeID != "na" {
		t.Fatalf("durable row: %+v", got)
	}
	if keys := f.blobKeys("manifests/"); len(keys) != 1 || !strings.Contains(keys[0], sn.ID) {
		t.Fatalf("manifests in the store: %v", keys)
	}
	// A second snapshot (kept to the end) shares chunks with the first.
	sn2, err := f.ctl.Snapshot(ctx, src.ID, "", false)
	if err != nil {
		t.Fatal(err)
	}
	f.waitStorage(sn2.ID, store.StorageDurable)
	if _, err := f.ctl.Drain(ctx, "na"); err != nil {
		t.Fatal(err)
	}
	for _, ref := range []string{sn.ID, "keep-me"} {
		sb := f.create(control.CreateRequest{TemplateID: ref})
		if sb.NodeID != "nb" {
			t.Fatalf("create from %s landed on %s, want nb (na is drained)", ref, sb.NodeID)
		}
		if sb.TemplateID != ref {
			t.Fatalf("the row's template is %q, want what the client named (%q)", sb.TemplateID, ref)
		}
	}
	copyInfo, err := f.b.Local.GetSnapshot(ctx, sn.ID)
	if err != nil || !copyInfo.Copy {
		t.Fatalf("nb's copy: %+v %v", copyInfo, err)
	}
	// Reconcile catalogs no copy as a snapshot of nb.
	if err := f.ctl.ReconcileNode(ctx, "nb"); err != nil {
		t.Fatal(err)
	}
	if row, err := f.st.GetSnapshot(ctx, sn.ID); err != nil || row.NodeID != "na" {
		t.Fatalf("after nb's reconcile the row is %+v, %v", row, err)
	}
	// The drain's hibernation of src becomes durable in the background:
	// its chunks must be in before they are counted (counted while its
	// upload ran, one more chunk appeared after: a CI failure).
	for deadline := time.Now().Add(20 * time.Second); ; time.Sleep(20 * time.Millisecond) {
		row, err := f.st.GetSandbox(ctx, src.ID)
		if err == nil && row.HibernationDurable {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("src's hibernation never became durable: %+v %v", row, err)
		}
	}
	chunksBefore := len(f.blobKeys("chunks/"))
	if err := f.ctl.DeleteSnapshot(ctx, sn.ID); err != nil {
		t.Fatal(err)
	}
	for name, n := range map[string]*controltest.Node{"na": f.a, "nb": f.b} {
		if _, err := n.Local.GetSnapshot(ctx, sn.ID); !errdefs.IsNotFound(err) {
			t.Fatalf("%s still holds the deleted snapshot: %v", name, err)
		}
	}
	// Left: the kept snapshot's manifest, and the hibernation of src (the
	// drain hibernated it, and its image became durable too).
	for _, k := range f.blobKeys("manifests/") {
		if strings.Contains(k, sn.ID) || !(strings.Contains(k, sn2.ID) || strings.HasPrefix(k, "manifests/h")) {
			t.Fatalf("manifest %s after the delete", k)
		}
	}
	if _, err := f.st.GetSnapshot(ctx, sn.ID); !errdefs.IsNotFound(err) {
		t.Fatalf("row after the delete: %v", err)
	}
	// GC frees exactly the chunks only the deleted snapshot used: the
	// other's manifest names every chunk left, and it still restores.
	time.Sleep(1200 * time.Millisecond) // past the grace period below
	_, rep, err := f.ctl.CollectGarbage(ctx, nodeapi.GCRequest{Grace: time.Second})
	if err != nil {
		t.Fatal(err)
	}
	named := map[string]bool{}
	for _, k := range f.blobKeys("manifests/") {
		m, err := chunk.ReadManifest(ctx, f.blobs, strings.TrimSuffix(strings.TrimPrefix(k, "manifests/"), ".json"))
		if err != nil {
			t.Fatal(err)
		}
		for id := range m.ChunkIDs() {
			named[id.Key()] = true
		}
	}
	left := f.blobKeys("chunks/")
	if len(left) != len(named) || int(rep.DeletedChunks) != chunksBefore-len(left) || rep.DeletedChunks == 0 {
		t.Fatalf("gc: %+v; %d chunks before, %d left, the manifests left name %d", rep, chunksBefore, len(left), len(named))
	}
	for k := range named {
		if !slices.Contains(left, k) {
			t.Fatalf("gc deleted chunk %s of a snapshot kept", k)
		}
	}
	if sb := f.create(control.CreateRequest{TemplateID: sn2.ID}); sb.NodeID != "nb" {
		t.Fatalf("create from the kept snapshot landed on %s", sb.NodeID)
	}
	t.Logf("gc: %+v", rep)
}

// A node without a blob store keeps its snapshots local: the row goes back
// to local and placement keeps creates from it on that node.
func TestSnapshotWithoutBlobStoreStaysLocal(t *testing.T) {
	controltest.Each(t, testSnapshotWithoutBlobStoreStaysLocal)
}

func testSnapshotWithoutBlobStoreStaysLocal(t *testing.T, _ controltest.Config) {
	f := newFleet(t)
	ctx := ctxFor(t)
	src := f.onNode("nb")
	sn, err := f.ctl.Snapshot(ctx, src.ID, "", false)
	if err != nil {
		t.Fatal(err)
	}
	if sn.Storage != store.StorageLocal {
		t.Fatalf("the row of a node without a blob store, as written: %q", sn.Storage)
	}
	// The upload runs in the background and finds no blob store.
	deadline := time.Now().Add(10 * time.Second)
	for {
		row, err := f.st.GetSnapshot(ctx, sn.ID)
		if err != nil {
			t.Fatal(err)
		}
		if row.Storage == store.StorageLocal && f.ctl.UploadsIdle() {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("row is %q", row.Storage)
		}
		time.Sleep(10 * time.Millisecond)
	}
	for range 3 {
		if sb := f.create(control.CreateRequest{TemplateID: sn.ID}); sb.NodeID != "nb" {
			t.Fatalf("a create from a local snapshot of nb landed on %s", sb.NodeID)
		}
	}
	// An operator cannot send it to another node either.
	if _, err := f.ctl.Create(ctx, control.CreateRequest{TemplateID: sn.ID, NodeID: "na", Timeout: time.Minute}); !errdefs.IsConflict(err) {
		t.Fatalf("a local snapshot of nb sent to na: %v, want a conflict", err)
	}
}

// A hibernated sandbox whose node is lost resumes on another node once
// its image is durable: the other node adopts it (fetching the image),
// the row names that node, the sandbox runs and is routed there; when the
// lost node comes back its stale copy is killed at its reconcile, and the
// durable image is gone (consumed). Before, it could only wait for its
// node.
func TestHibernatedSandboxResumesElsewhere(t *testing.T) {
	controltest.Each(t, testHibernatedSandboxResumesElsewhere)
}

func testHibernatedSandboxResumesElsewhere(t *testing.T, c controltest.Config) {
	f := newDurableFleet(t, c)
	ctx := ctxFor(t)
	sb := f.onNode("na")
	f.hibernateDurable(sb.ID)
	hib := f.row(sb.ID).Hibernation
	f.loseNodeA()
	if s := f.nodeRow("na").State; s != store.NodeLost {
		t.Fatalf("na is %s", s)
	}
	got, resumed, err := f.ctl.Connect(ctx, sb.ID, time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	if !resumed || got.NodeID != "nb" || got.State != store.StateRunning || got.Hibernation != "" {
		t.Fatalf("after connect: resumed %v, %+v", resumed, got.Sandbox)
	}
	if es, err := f.b.Engine.Get(ctx, sb.ID); err != nil || es.State != "running" || es.Run.AccessToken != sb.EnvdAccessToken {
		t.Fatalf("on nb: %+v %v", es, err)
	}
	if _, running, _, _ := f.ctl.Lookup(sb.ID); !running {
		t.Fatal("the moved sandbox is not routed")
	}
	// The consumed hibernation's durable copy goes, after the answer.
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(5 * time.Millisecond) {
		left := slices.ContainsFunc(f.blobKeys("manifests/"), func(k string) bool { return strings.Contains(k, hib) })
		if !left {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the consumed hibernation %s is still durable 10 s after the resume", hib)
		}
	}
	// na comes back: its copy goes.
	if _, err := f.a.Engine.Get(ctx, sb.ID); err != nil {
		t.Fatalf("na's copy before its return: %v", err)
	}
	f.beat("na")
	if _, err := f.a.Engine.Get(ctx, sb.ID); !errdefs.IsNotFound(err) {
		t.Fatalf("na's stale copy after its reconcile: %v", err)
	}
	if r := f.row(sb.ID); r.NodeID != "nb" || r.State != store.StateRunning {
		t.Fatalf("row after na's return: %+v", r)
	}
}

// A fork bigger than its parent's node spills: the children that do not
// fit there are made on the other node from a durable snapshot of the
// parent taken for them (served by the parent's node as a peer), each
// with the parent's memory; the snapshot is gone afterwards (no catalog
// row, no copy on either node, no manifest). Before, every child had to
// fit on the parent's node.
func TestForkSpillsToAnotherNode(t *testing.T) {
	controltest.Each(t, testForkSpillsToAnotherNode)
}

func testForkSpillsToAnotherNode(t *testing.T, c controltest.Config) {
	// Room for 3 default sandboxes (1 GiB, 2 vCPUs) per node.
	f := newDurableFleetOf(t, c, nodeapi.Resources{MemoryMB: 3 * 1024, VCPUs: 6, Sandboxes: 100})
	ctx := ctxFor(t)
	parent := f.onNode("na")
	exec := func(n *controltest.Node, id string, args ...string) string {
		var out bytes.Buffer
		if code, err := n.Engine.Exec(ctx, id, runtime.ExecSpec{Args: args, Stdout: &out}); err != nil || code != 0 {
			t.Fatalf("exec %v in %s: %d %v", args, id, code, err)
		}
		return strings.TrimSpace(out.String())
	}
	exec(f.a, parent.ID, "set", "k", "the-parent's")
	kids, err := f.ctl.Fork(ctx, parent.ID, 4, time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	on := map[string]int{}
	for i, k := range kids {
		if k.Err != nil {
			t.Fatalf("child %d: %v", i, k.Err)
		}
		on[k.Sandbox.NodeID]++
		n := map[string]*controltest.Node{"na": f.a, "nb": f.b}[k.Sandbox.NodeID]
		es, err := n.Engine.Get(ctx, k.Sandbox.ID)
		if err != nil || es.State != "running" || es.Run.AccessToken != k.Sandbox.EnvdAccessToken {
			t.Fatalf("child %d on %s: %+v %v", i, k.Sandbox.NodeID, es, err)
		}
		if v := exec(n, k.Sandbox.ID, "get", "k"); v != "the-parent's" {
			t.Fatalf("child %d on %s: memory %q", i, k.Sandbox.NodeID, v)
		}
	}
	if on["na"] != 2 || on["nb"] != 2 {
		t.Fatalf("children per node: %v, want 2 on the parent's node (its room) and 2 spilled", on)
	}
	// The snapshot the spill was made from is gone everywhere.
	page, _, err := f.st.ListSnapshots(ctx, store.SnapshotFilter{Limit: 100})
	if err != nil || len(page) != 0 {
		t.Fatalf("snapshot rows left: %v %v", page, err)
	}
	for name, n := range map[string]*controltest.Node{"na": f.a, "nb": f.b} {
		for _, m := range n.Engine.Snapshots().List() {
			if m.Kind == "snapshot" {
				t.Fatalf("%s holds snapshot %s after the fork", name, m.ID)
			}
		}
	}
	if keys := f.blobKeys("manifests/"); len(keys) != 0 {
		t.Fatalf("manifests left: %v", keys)
	}
}

// An operator's node choice (sporeNodeID) places a create there; an
// unknown node is NotFound; a durable snapshot goes to the node chosen
// (one only on another node's disk cannot: TestSnapshotWithoutBlobStoreStaysLocal).
func TestCreateOnChosenNode(t *testing.T) { controltest.Each(t, testCreateOnChosenNode) }

func testCreateOnChosenNode(t *testing.T, c controltest.Config) {
	f := newDurableFleet(t, c)
	ctx := ctxFor(t)
	for _, want := range []string{"na", "nb", "na"} {
		if sb := f.create(control.CreateRequest{NodeID: want}); sb.NodeID != want {
			t.Fatalf("created on %s, asked for %s", sb.NodeID, want)
		}
	}
	if _, err := f.ctl.Create(ctx, control.CreateRequest{NodeID: "nx", Timeout: time.Minute}); !errdefs.IsNotFound(err) {
		t.Fatalf("unknown node: %v", err)
	}
	src := f.create(control.CreateRequest{NodeID: "na"})
	sn, err := f.ctl.Snapshot(ctx, src.ID, "", false)
	if err != nil {
		t.Fatal(err)
	}
	f.waitStorage(sn.ID, store.StorageDurable)
	if sb := f.create(control.CreateRequest{TemplateID: sn.ID, NodeID: "nb"}); sb.NodeID != "nb" {
		t.Fatalf("durable snapshot on nb: landed on %s", sb.NodeID)
	}
}

// A template made from a sandbox on one node becomes durable and every
// node can create from it by name (fetching it; the row records the
// copy); replacing it removes the old one from every node and the store;
// deleting it leaves nothing. Before, a create from it on another node
// failed: only the node that made it held it.
func TestTemplateOnEveryNode(t *testing.T) { controltest.Each(t, testTemplateOnEveryNode) }

func testTemplateOnEveryNode(t *testing.T, c controltest.Config) {
	f := newDurableFleet(t, c)
	ctx := ctxFor(t)
	src := f.create(control.CreateRequest{NodeID: "na"})
	first, err := f.ctl.Snapshot(ctx, src.ID, "agent-tpl", true)
	if err != nil {
		t.Fatal(err)
	}
	waitTemplate := func(id string) {
		deadline := time.Now().Add(30 * time.Second)
		for {
			tp, err := f.st.GetTemplate(ctx, "agent-tpl")
			if err == nil && tp.SnapshotID == id && tp.Storage == store.StorageDurable {
				return
			}
			if time.Now().After(deadline) {
				t.Fatalf("template not durable: %+v %v", tp, err)
			}
			time.Sleep(10 * time.Millisecond)
		}
	}
	waitTemplate(first.ID)
	sb := f.create(control.CreateRequest{TemplateID: "agent-tpl", NodeID: "nb"})
	if sb.NodeID != "nb" || sb.TemplateID != "agent-tpl" {
		t.Fatalf("create from the template on nb: %+v", sb.Sandbox)
	}
	if tp, _ := f.st.GetTemplate(ctx, "agent-tpl"); !slices.Contains(tp.NodeIDs, "nb") {
		t.Fatalf("the template row does not record nb's copy: %+v", tp)
	}
	// Replaced: the old one goes from both nodes and the store; what the
	// row's spec says (published, ...) stays.
	if _, err := f.st.UpdateTemplate(ctx, "agent-tpl", func(tp *store.Template) error {
		tp.Spec = []byte(`{"public":true}`)
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	second, err := f.ctl.Snapshot(ctx, src.ID, "agent-tpl", true)
	if tp, _ := f.st.GetTemplate(ctx, "agent-tpl"); string(tp.Spec) != `{"public":true}` {
		t.Fatalf("a rebuilt template lost its spec: %q", tp.Spec)
	}
	if err != nil {
		t.Fatal(err)
	}
	waitTemplate(second.ID)
	deadline := time.Now().Add(10 * time.Second)
	for {
		_, ea := f.a.Engine.Snapshots().Get(first.ID)
		_, eb := f.b.Engine.Snapshots().Get(first.ID)
		gone := errdefs.IsNotFound(ea) && errdefs.IsNotFound(eb)
		for _, k := range f.blobKeys("manifests/") {
			gone = gone && !strings.Contains(k, first.ID)
		}
		if gone {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the replaced template is left: na %v, nb %v, manifests %v", ea, eb, f.blobKeys("manifests/"))
		}
		time.Sleep(10 * time.Millisecond)
	}
	if sb := f.create(control.CreateRequest{TemplateID: "agent-tpl", NodeID: "nb"}); sb.NodeID != "nb" {
		t.Fatalf("create from the new template on nb: %+v", sb.Sandbox)
	}
	if err := f.ctl.DeleteSnapshot(ctx, "agent-tpl"); err != nil {
		t.Fatal(err)
	}
	for name, n := range map[string]*controltest.Node{"na": f.a, "nb": f.b} {
		if _, err := n.Engine.Snapshots().Get(second.ID); !errdefs.IsNotFound(err) {
			t.Fatalf("%s still holds the deleted template: %v", name, err)
		}
	}
	for _, k := range f.blobKeys("manifests/") {
		if strings.Contains(k, second.ID) {
			t.Fatalf("the deleted template is still durable: %s", k)
		}
	}
	if _, err := f.st.GetTemplate(ctx, "agent-tpl"); !errdefs.IsNotFound(err) {
		t.Fatalf("template row after the delete: %v", err)
	}
}

// fullNode refuses every resume for lack of room, as a full node's
// admission does.
type fullNode struct{ nodeapi.Node }

func (fullNode) Resume(context.Context, string) (nodeapi.Sandbox, error) {
	return nodeapi.Sandbox{}, fmt.Errorf("%w: node full (test)", errdefs.ErrResourceLimit)
}

// A hibernated sandbox whose node is full (its resume refused for lack of
// room) resumes on another node once its image is durable; the full node
// is avoided, the row names the new node, the sandbox runs there.
func TestHibernatedSandboxMovesOffAFullNode(t *testing.T) {
	controltest.Each(t, testHibernatedSandboxMovesOffAFullNode)
}

func testHibernatedSandboxMovesOffAFullNode(t *testing.T, c controltest.Config) {
	wrapNode = func(id string, n nodeapi.Node) nodeapi.Node {
		if id == "na" {
			return fullNode{n}
		}
		return n
	}
	f := newDurableFleet(t, c)
	wrapNode = nil
	ctx := ctxFor(t)
	sb := f.create(control.CreateRequest{NodeID: "na"})
	f.hibernateDurable(sb.ID)
	got, resumed, err := f.ctl.Connect(ctx, sb.ID, time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	if !resumed || got.NodeID != "nb" || got.State != store.StateRunning {
		t.Fatalf("after connect: resumed %v, %+v", resumed, got.Sandbox)
	}
	if es, err := f.b.Engine.Get(ctx, sb.ID); err != nil || es.State != "running" {
		t.Fatalf("on nb: %+v %v", es, err)
	}
}

// An upload of a snapshot deleted before it began (queued behind other
// uploads) has nothing to do: no error, so no warning in the log, and no
// row brought back.
func TestUploadOfADeletedSnapshotIsNothing(t *testing.T) {
	f := newFleet(t)
	ctx := ctxFor(t)
	if err := f.ctl.Upload(ctx, "s0000000000000000000"); err != nil {
		t.Fatalf("upload of a snapshot that is not there: %v", err)
	}
	if _, err := f.st.GetSnapshot(ctx, "s0000000000000000000"); !errdefs.IsNotFound(err) {
		t.Fatalf("row after the upload: %v", err)
	}
}

// reconcilingNode runs hook after each Adopt it passes on succeeds: a
// periodic reconcile of the node landing between the adoption and the
// row's move to it.
type reconcilingNode struct {
	nodeapi.Node
	hook func()
}

func (n reconcilingNode) Adopt(ctx context.Context, req nodeapi.AdoptRequest) (nodeapi.Sandbox, error) {
	sb, err := n.Node.Adopt(ctx, req)
	if err == nil && n.hook != nil {
		n.hook()
	}
	return sb, err
}

// A reconcile of the node a hibernated sandbox is moving to, run after
// that node adopted it but before the row names it, leaves the adopted
// copy alone (the row still names the old node, with the same
// hibernation): the connect that moved it resumes it there. Before, the
// reconcile killed the copy as one "that moved to another node" and the
// connect failed.
func TestReconcileDuringAMoveKeepsTheAdoptedCopy(t *testing.T) {
	controltest.Each(t, testReconcileDuringAMoveKeepsTheAdoptedCopy)
}

func testReconcileDuringAMoveKeepsTheAdoptedCopy(t *testing.T, c controltest.Config) {
	var f *durableFleet
	reconciled := 0
	wrapNode = func(id string, n nodeapi.Node) nodeapi.Node {
		if id != "nb" {
			return n
		}
		return reconcilingNode{Node: n, hook: func() {
			if err := f.ctl.ReconcileNode(ctxFor(t), "nb"); err != nil {
				t.Errorf("reconcile nb mid-move: %v", err)
			}
			reconciled++
		}}
	}
	f = newDurableFleet(t, c)
	wrapNode = nil
	ctx := ctxFor(t)
	sb := f.onNode("na")
	f.hibernateDurable(sb.ID)
	f.loseNodeA()
	got, resumed, err := f.ctl.Connect(ctx, sb.ID, time.Minute)
	if err != nil {
		t.Fatalf("connect (moves the sandbox to nb): %v", err)
	}
	if reconciled != 1 {
		t.Fatalf("nb reconciled %d times mid-move, want 1", reconciled)
	}
	if !resumed || got.NodeID != "nb" || got.State != store.StateRunning {
		t.Fatalf("after connect: resumed %v, %+v", resumed, got.Sandbox)
	}
	if es, err := f.b.Engine.Get(ctx, sb.ID); err != nil || es.State != "running" {
		t.Fatalf("on nb: %+v %v", es, err)
	}
}

// listingNode runs hook once, when armed, right after a Snapshots call
// it passes on: what happens on the node between a reconcile's listing of
// its snapshots and its reading of the catalog.
type listingNode struct {
	nodeapi.Node
	hook *func()
}

func (n listingNode) Snapshots(ctx context.Context) ([]nodeapi.SnapshotInfo, error) {
	list, err := n.Node.Snapshots(ctx)
	if h := *n.hook; err == nil && h != nil {
		*n.hook = nil
		h()
	}
	return list, err
}

// A snapshot taken while a reconcile of its node runs, after the node's
// snapshots were listed and before the catalog was read, keeps its row,
// its upload and its node's copy, and deletes like any other. Before,
// the reconcile dropped its row as one the node no longer held, and the
// upload, finding no row when it ended, deleted the node's copy: the
// user's delete of the snapshot it had just taken answered 404
// (test/sdk TestLoad, once in CI).
func TestSnapshotTakenDuringAReconcileKeepsItsRow(t *testing.T) {
	controltest.Each(t, testSnapshotTakenDuringAReconcileKeepsItsRow)
}

func testSnapshotTakenDuringAReconcileKeepsItsRow(t *testing.T, c controltest.Config) {
	var hook func()
	wrapNode = func(id string, n nodeapi.Node) nodeapi.Node {
		if id != "na" {
			return n
		}
		return listingNode{Node: n, hook: &hook}
	}
	f := newDurableFleet(t, c)
	wrapNode = nil
	ctx := ctxFor(t)
	src := f.onNode("na")
	var sn store.Snapshot
	hook = func() {
		var err error
		if sn, err = f.ctl.Snapshot(ctx, src.ID, "", false); err != nil {
			t.Errorf("snapshot mid-reconcile: %v", err)
		}
	}
	if err := f.ctl.ReconcileNode(ctx, "na"); err != nil {
		t.Fatal(err)
	}
	if sn.ID == "" {
		t.Fatal("the reconcile never listed na's snapshots")
	}
	row, err := f.st.GetSnapshot(ctx, sn.ID)
	if err != nil {
		t.Fatalf("the row after the reconcile: %v", err)
	}
	if row.NodeID != "na" {
		t.Fatalf("the row after the reconcile: %+v", row)
	}
	f.waitStorage(sn.ID, store.StorageDurable)
	for !f.ctl.UploadsIdle() {
		time.Sleep(10 * time.Millisecond)
	}
	if _, err := f.a.Local.GetSnapshot(ctx, sn.ID); err != nil {
		t.Fatalf("na's copy after the upload: %v", err)
	}
	// Another pass, with nothing racing it, keeps it too.
	if err := f.ctl.ReconcileNode(ctx, "na"); err != nil {
		t.Fatal(err)
	}
	if err := f.ctl.DeleteSnapshot(ctx, sn.ID); err != nil {
		t.Fatalf("delete: %v", err)
	}
	if _, err := f.st.GetSnapshot(ctx, sn.ID); !errdefs.IsNotFound(err) {
		t.Fatalf("the row after the delete: %v", err)
	}
	if keys := f.blobKeys("manifests/"); len(keys) != 0 {
		t.Fatalf("manifests left in the store: %v", keys)
	}
}

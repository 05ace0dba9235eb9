package control_test

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"strings"
	"sync"
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
	"github.com/spore-run/spore/internal/snapsync"
	"github.com/spore-run/spore/internal/store"
	"github.com/spore-run/spore/internal/store/postgres"
	"github.com/spore-run/spore/internal/store/sqlite"
	"github.com/spore-run/spore/internal/testenv"
)

// A draining node takes nothing new, whichever replica places: these
// tests drain node na through replica A and place through replica B,
// whose placement view was read before the drain and is kept so (its
// background refresh held: a replica whose refresh has not come round
// yet, up to 5 s in production). Each fails on the code before the fix,
// unless its comment says it records a decision.

// opKey marks a test's operation contexts; a frozen drainStore holds the
// other ListNodes calls (the placement view's background refresh).
type opKey struct{}

func opCtx(t *testing.T) context.Context { return context.WithValue(ctxFor(t), opKey{}, true) }

// drainStore is one replica's store handle. Frozen, its background view
// refreshes wait. listed is closed when a listing of listedNode's rows
// returns (a drain's pass).
type drainStore struct {
	store.Store
	mu         sync.Mutex
	frozen     chan struct{}
	passing    int // background ListNodes under way that began unfrozen
	listedNode string
	listed     chan struct{}
}

func (d *drainStore) ListNodes(ctx context.Context) ([]store.Node, error) {
	if ctx.Value(opKey{}) == nil {
		d.mu.Lock()
		gate := d.frozen
		if gate == nil {
			d.passing++
		}
		d.mu.Unlock()
		if gate != nil {
			select {
			case <-gate:
			case <-ctx.Done():
				return nil, ctx.Err()
			}
		} else {
			defer func() { d.mu.Lock(); d.passing--; d.mu.Unlock() }()
		}
	}
	return d.Store.ListNodes(ctx)
}

func (d *drainStore) ListSandboxes(ctx context.Context, f store.SandboxFilter) ([]store.Sandbox, string, error) {
	page, next, err := d.Store.ListSandboxes(ctx, f)
	d.mu.Lock()
	if d.listed != nil && f.NodeID == d.listedNode {
		close(d.listed)
		d.listed = nil
	}
	d.mu.Unlock()
	return page, next, err
}

// freeze holds the background refreshes from now on, once those already
// reading the nodes are through (they read before the drain to come).
func (d *drainStore) freeze(t *testing.T) {
	d.mu.Lock()
	d.frozen = make(chan struct{})
	d.mu.Unlock()
	t.Cleanup(func() { close(d.frozen) })
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(time.Millisecond) {
		d.mu.Lock()
		n := d.passing
		d.mu.Unlock()
		if n == 0 {
			return
		}
		if time.Now().After(deadline) {
			t.Fatal("a background refresh never finished")
		}
	}
}

// onListing returns a channel closed when the next listing of node's
// rows returns.
func (d *drainStore) onListing(node string) <-chan struct{} {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.listedNode, d.listed = node, make(chan struct{})
	return d.listed
}

// drainNode is a node as both replicas reach it: its uploads held while
// uploads is open, its next create held when asked, its image builds
// counted.
type drainNode struct {
	nodeapi.Node
	mu      sync.Mutex
	uploads chan struct{}
	create  *heldCall
	builds  int
}

type heldCall struct{ entered, release chan struct{} }

func (n *drainNode) Upload(ctx context.Context, ref string) (nodeapi.UploadInfo, error) {
	n.mu.Lock()
	gate := n.uploads
	n.mu.Unlock()
	if gate != nil {
		select {
		case <-gate:
		case <-ctx.Done():
			return nodeapi.UploadInfo{}, ctx.Err()
		}
	}
	return n.Node.Upload(ctx, ref)
}

func (n *drainNode) Create(ctx context.Context, req nodeapi.CreateRequest) (nodeapi.Sandbox, error) {
	n.mu.Lock()
	h := n.create
	n.create = nil
	n.mu.Unlock()
	if h != nil {
		close(h.entered)
		select {
		case <-h.release:
		case <-ctx.Done():
			return nodeapi.Sandbox{}, ctx.Err()
		}
	}
	return n.Node.Create(ctx, req)
}

func (n *drainNode) BuildImage(ctx context.Context, req nodeapi.ImageBuildRequest) (nodeapi.SnapshotInfo, error) {
	n.mu.Lock()
	n.builds++
	n.mu.Unlock()
	return n.Node.BuildImage(ctx, req)
}

func (n *drainNode) buildCount() int {
	n.mu.Lock()
	defer n.mu.Unlock()
	return n.builds
}

// fleetStorage is how a drainFleet's nodes keep snapshots.
type fleetStorage int

const (
	diskOnly   fleetStorage = iota // no blob store: snapshots stay on their node
	blobsPeers                     // a shared blob store, and each node serves its chunks and snapshot manifests to the other at its address
	blobsOnly                      // a shared blob store; the nodes have no address to fetch from each other
)

// drainFleet is nodes na and nb and replicas A and B on one store.
type drainFleet struct {
	t      *testing.T
	a, b   *control.Service
	sa, sb *drainStore
	node   map[string]*drainNode
	fake   map[string]*controltest.Node
	local  map[string]*lnode.Node
	blobs  blob.Store
}

func newDrainFleet(t *testing.T, c controltest.Config, storage fleetStorage) *drainFleet {
	t.Helper()
	st1, st2 := twoHandles(t, c)
	f := &drainFleet{t: t, sa: &drainStore{Store: st1}, sb: &drainStore{Store: st2},
		node: map[string]*drainNode{}, fake: map[string]*controltest.Node{}, local: map[string]*lnode.Node{}}
	blobs := storage != diskOnly
	if blobs {
		var err error
		if f.blobs, err = local.Open(t.TempDir()); err != nil {
			t.Fatal(err)
		}
	}
	discard := slog.New(slog.DiscardHandler)
	reg := control.Nodes{}
	for _, id := range []string{"na", "nb"} {
		fn := controltest.New(t)
		cfg := lnode.Config{ID: id}
		if blobs {
			cache, err := chunk.OpenCache(filepath.Join(fn.Dir, "chunk-cache"), 64<<20)
			if err != nil {
				t.Fatal(err)
			}
			sy, err := snapsync.New(snapsync.Config{Repo: fn.Engine.Snapshots(), Store: f.blobs, Cache: cache, PeerClient: &http.Client{},
				Runtime: fn.Engine.Runtime().Name(), Log: discard})
			if err != nil {
				t.Fatal(err)
			}
			peer, err := chunk.NewHandler(cache, discard)
			if err != nil {
				t.Fatal(err)
			}
			mux := http.NewServeMux()
			mux.Handle(chunk.PeerPath, peer)
			mux.Handle(snapsync.ManifestPath, sy.ManifestHandler())
			srv := httptest.NewServer(mux)
			t.Cleanup(srv.Close)
			cfg.Sync = sy
			if storage == blobsPeers {
				cfg.Addr = srv.Listener.Addr().String()
			}
		}
		f.fake[id], f.local[id] = fn, lnode.New(fn.Engine, cfg)
		f.node[id] = &drainNode{Node: c.Node(t, f.local[id])}
		reg[id] = f.node[id]
	}
	clk := &replClock{t: time.Date(2030, 1, 1, 0, 0, 0, 0, time.UTC)}
	f.a = control.New(control.Config{Store: f.sa, Nodes: reg, Now: clk.Now, Holder: "A"})
	f.b = control.New(control.Config{Store: f.sb, Nodes: reg, Now: clk.Now, Holder: "B"})
	t.Cleanup(f.a.Close)
	t.Cleanup(f.b.Close)
	if err := f.a.RegisterNodes(opCtx(t)); err != nil {
		t.Fatal(err)
	}
	return f
}

// twoHandles opens two handles on one new database of c's kind.
func twoHandles(t *testing.T, c controltest.Config) (store.Store, store.Store) {
	t.Helper()
	ctx := context.Background()
	var st1, st2 store.Store
	var err error
	if c.Postgres {
		dsn := testenv.Postgres(t)
		if st1, err = postgres.Open(ctx, dsn); err == nil {
			st2, err = postgres.Open(ctx, dsn)
		}
	} else {
		path := filepath.Join(t.TempDir(), "spore.db")
		if st1, err = sqlite.Open(ctx, path); err == nil {
			st2, err = sqlite.Open(ctx, path)
		}
	}
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { st1.Close(); st2.Close() })
	return st1, st2
}

// on creates a sandbox on node through A.
func (f *drainFleet) on(node string) control.Sandbox {
	f.t.Helper()
	sb, err := f.a.Create(opCtx(f.t), control.CreateRequest{NodeID: node, Timeout: time.Hour})
	if err != nil {
		f.t.Fatal(err)
	}
	return sb
}

// staleB gives B a placement view in which nb holds a sandbox and na
// none (so na ranks first), and keeps it: B's background refresh waits.
func (f *drainFleet) staleB() {
	f.t.Helper()
	if _, err := f.b.Create(opCtx(f.t), control.CreateRequest{NodeID: "nb", Timeout: time.Hour}); err != nil {
		f.t.Fatal(err)
	}
	f.sb.freeze(f.t)
}

// drain drains na through A.
func (f *drainFleet) drain() int {
	f.t.Helper()
	n, err := f.a.Drain(opCtx(f.t), "na")
	if err != nil {
		f.t.Fatalf("drain na: %v", err)
	}
	return n
}

// commitDrain sets na's drain flag in the store: a drain through A whose
// hibernation pass has not reached na's sandboxes yet.
func (f *drainFleet) commitDrain() {
	f.t.Helper()
	if _, err := f.sa.UpdateNode(opCtx(f.t), "na", func(n *store.Node) error { n.Draining = true; return nil }); err != nil {
		f.t.Fatal(err)
	}
}

// holdUploads holds the nodes' uploads until the test ends: na's, and
// nb's too (a copy nb fetched as a peer is made durable from nb once it
// has it, which would put the image in the blob store while na's upload
// is held).
func (f *drainFleet) holdUploads() {
	gate := make(chan struct{})
	for _, n := range f.node {
		n.mu.Lock()
		n.uploads = gate
		n.mu.Unlock()
	}
	f.t.Cleanup(func() { close(gate) })
}

func (f *drainFleet) row(id string) store.Sandbox {
	f.t.Helper()
	rec, err := f.sa.GetSandbox(opCtx(f.t), id)
	if err != nil {
		f.t.Fatal(err)
	}
	return rec
}

// running says whether node runs sandbox id.
func (f *drainFleet) running(node, id string) bool {
	es, err := f.fake[node].Engine.Get(context.Background(), id)
	return err == nil && es.State == "running"
}

// sandboxesOn counts the sandboxes node's engine holds.
func (f *drainFleet) sandboxesOn(node string) int {
	return len(f.fake[node].Engine.List(context.Background()))
}

// rowsIn lists the store's rows in state.
func (f *drainFleet) rowsIn(state string) []store.Sandbox {
	f.t.Helper()
	rows, _, err := f.sa.ListSandboxes(opCtx(f.t), store.SandboxFilter{States: []string{state}})
	if err != nil {
		f.t.Fatal(err)
	}
	return rows
}

// durableManifest says whether the blob store holds snapshot id.
func (f *drainFleet) durableManifest(id string) bool {
	found := false
	err := f.blobs.List(context.Background(), "manifests/", func(i blob.Info) error {
		found = found || strings.Contains(i.Key, id)
		return nil
	})
	if err != nil {
		f.t.Fatal(err)
	}
	return found
}

// wantDrainRefusal checks an error is a placement refusal (429 with
// Retry-After at the API) whose message names the drain and what.
func wantDrainRefusal(t *testing.T, err error, what string) {
	t.Helper()
	if !errors.Is(err, errdefs.ErrResourceLimit) || !strings.Contains(err.Error(), "draining") || !strings.Contains(err.Error(), what) {
		t.Fatalf("got %v, want a refusal (resource limit) naming the drain and %s", err, what)
	}
}

// Creates from a template through B after A drained na: every one on nb,
// none on na, though B's view (read before the drain) ranks na first; an
// operator's choice of na is refused naming the drain; an image build
// goes to nb. Before, B placed them on na until its view was refreshed.
func TestDrainObeyedByTheOtherReplicasCreates(t *testing.T) {
	controltest.Each(t, func(t *testing.T, c controltest.Config) {
		f := newDrainFleet(t, c, diskOnly)
		f.staleB()
		f.drain()
		for i := range 3 {
			sb, err := f.b.Create(opCtx(t), control.CreateRequest{Timeout: time.Hour})
			if err != nil {
				t.Fatal(err)
			}
			if sb.NodeID != "nb" || !f.running("nb", sb.ID) {
				t.Fatalf("create %d through B landed on %s, after na was drained through A", i, sb.NodeID)
			}
		}
		if n := f.sandboxesOn("na"); n != 0 {
			t.Fatalf("na holds %d sandboxes", n)
		}
		_, err := f.b.Create(opCtx(t), control.CreateRequest{NodeID: "na", Timeout: time.Hour})
		wantDrainRefusal(t, err, "na")
		if rows := f.rowsIn(store.StateCreating); len(rows) != 0 {
			t.Fatalf("rows left creating: %+v", rows)
		}
		// An image build (fake nodes build none: refused by the node asked).
		if _, err := f.b.BuildImage(opCtx(t), nodeapi.ImageBuildRequest{Name: "img", Ref: "registry.example/img:1"}); err == nil {
			t.Fatal("a fake node built an image")
		}
		if a, b := f.node["na"].buildCount(), f.node["nb"].buildCount(); a != 0 || b != 1 {
			t.Fatalf("image builds asked of na %d, nb %d; want 0, 1", a, b)
		}
	})
}

// A create through B from a snapshot taken on drained na: one still
// uploading goes to nb, which fetches it from na as a peer (the blob
// store has no copy yet); a durable one goes to nb; one that only na can
// serve (no blob store there, or no address to fetch from while its
// upload runs) is refused naming the drain, and nothing is made. Before,
// each was placed on na (2 of 3 tries in a real fleet, through the other
// replica).
func TestCreateFromASnapshotOfADrainedNode(t *testing.T) {
	for _, tc := range []struct {
		name, storage string
		fleet         fleetStorage
	}{
		{"uploading", store.StorageUploading, blobsPeers},
		{"durable", store.StorageDurable, blobsPeers},
		{"uploading-no-peer", store.StorageUploading, blobsOnly},
		{"local", store.StorageLocal, diskOnly},
	} {
		storage, refused := tc.storage, tc.name == "local" || tc.name == "uploading-no-peer"
		t.Run(tc.name, func(t *testing.T) {
			controltest.Each(t, func(t *testing.T, c controltest.Config) {
				f := newDrainFleet(t, c, tc.fleet)
				if storage == store.StorageUploading {
					f.holdUploads()
				}
				src := f.on("na")
				sn, err := f.a.Snapshot(opCtx(t), src.ID, "", false)
				if err != nil {
					t.Fatal(err)
				}
				for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(10 * time.Millisecond) {
					row, err := f.sa.GetSnapshot(opCtx(t), sn.ID)
					if err != nil {
						t.Fatal(err)
					}
					if row.Storage == storage {
						break
					}
					if time.Now().After(deadline) {
						t.Fatalf("snapshot %s is %s, want %s", sn.ID, row.Storage, storage)
					}
				}
				f.staleB()
				if n := f.drain(); n != 1 {
					t.Fatalf("drain hibernated %d, want 1", n)
				}
				sb, err := f.b.Create(opCtx(t), control.CreateRequest{TemplateID: sn.ID, Timeout: time.Hour})
				if refused {
					wantDrainRefusal(t, err, sn.ID)
					if n := f.sandboxesOn("na") + f.sandboxesOn("nb"); n != 2 || len(f.rowsIn(store.StateCreating)) != 0 {
						t.Fatalf("after the refusal: %d sandboxes on the nodes (want the drained source and B's first), %d rows creating",
							n, len(f.rowsIn(store.StateCreating)))
					}
					return
				}
				if err != nil {
					t.Fatal(err)
				}
				if sb.NodeID != "nb" || !f.running("nb", sb.ID) {
					t.Fatalf("create from %s snapshot %s landed on %s, after na was drained", storage, sn.ID, sb.NodeID)
				}
				if m, err := f.local["nb"].GetSnapshot(opCtx(t), sn.ID); err != nil || !m.Copy {
					t.Fatalf("nb's copy of %s: %+v %v", sn.ID, m, err)
				}
				if storage == store.StorageUploading && f.durableManifest(sn.ID) {
					t.Fatal("the upload was held, yet the blob store has the snapshot: not a peer fetch")
				}
			})
		})
	}
}

// A fork through B of a sandbox still running on na once na's drain has
// committed: with a blob store, the children are made on nb (from a
// snapshot of the parent, spilled); without one they could go nowhere
// but na, and the fork is refused naming the drain, no child row left.
// Before, the children were made on na (origin first).
func TestForkOfASandboxOnADrainingNode(t *testing.T) {
	for _, blobs := range []bool{true, false} {
		t.Run(fmt.Sprintf("blobs=%v", blobs), func(t *testing.T) {
			controltest.Each(t, func(t *testing.T, c controltest.Config) {
				storage := diskOnly
				if blobs {
					storage = blobsPeers
				}
				f := newDrainFleet(t, c, storage)
				parent := f.on("na")
				f.staleB()
				f.commitDrain()
				kids, err := f.b.Fork(opCtx(t), parent.ID, 2, time.Hour)
				if !blobs {
					wantDrainRefusal(t, err, parent.ID)
					if rows := f.rowsIn(store.StateCreating); len(rows) != 0 || f.sandboxesOn("na") != 1 {
						t.Fatalf("after the refusal: rows creating %+v, %d sandboxes on na", rows, f.sandboxesOn("na"))
					}
					return
				}
				if err != nil {
					t.Fatal(err)
				}
				for i, k := range kids {
					if k.Err != nil {
						t.Fatalf("child %d: %v", i, k.Err)
					}
					if k.Sandbox.NodeID != "nb" || !f.running("nb", k.Sandbox.ID) {
						t.Fatalf("child %d made on %s, whose drain had committed", i, k.Sandbox.NodeID)
					}
				}
				if n := f.sandboxesOn("na"); n != 1 {
					t.Fatalf("na holds %d sandboxes, want the parent only", n)
				}
			})
		})
	}
}

// A connect through B to a sandbox hibernated on drained na: with its
// image durable it resumes on nb; with its upload still running it
// resumes on nb too, the image fetched from na as a peer; with no blob
// store, or no address to fetch from while its upload runs, it is
// refused naming the drain and stays hibernated on na. Before, each
// resumed on na.
func TestResumeOfASandboxHibernatedOnADrainedNode(t *testing.T) {
	for _, tc := range []struct {
		image string
		fleet fleetStorage
	}{{"durable", blobsPeers}, {"uploading", blobsPeers}, {"uploading-no-peer", blobsOnly}, {"local", diskOnly}} {
		image, refused := tc.image, tc.image == "local" || tc.image == "uploading-no-peer"
		t.Run(image, func(t *testing.T) {
			controltest.Each(t, func(t *testing.T, c controltest.Config) {
				f := newDrainFleet(t, c, tc.fleet)
				sb := f.on("na")
				switch image {
				case "durable":
					if err := f.a.Hibernate(opCtx(t), sb.ID); err != nil {
						t.Fatal(err)
					}
					for deadline := time.Now().Add(30 * time.Second); !f.row(sb.ID).HibernationDurable; time.Sleep(10 * time.Millisecond) {
						if time.Now().After(deadline) {
							t.Fatal("hibernation never durable")
						}
					}
				case "uploading", "uploading-no-peer":
					f.holdUploads()
				}
				f.staleB()
				f.drain() // hibernates sb unless it is already
				hib := f.row(sb.ID).Hibernation
				got, resumed, err := f.b.Connect(opCtx(t), sb.ID, time.Hour)
				if refused {
					wantDrainRefusal(t, err, sb.ID)
					if r := f.row(sb.ID); r.State != store.StateHibernated || r.NodeID != "na" || f.running("na", sb.ID) {
						t.Fatalf("after the refusal: %+v, running on na %v", r, f.running("na", sb.ID))
					}
					return
				}
				if err != nil {
					t.Fatal(err)
				}
				if !resumed || got.NodeID != "nb" || !f.running("nb", sb.ID) || f.running("na", sb.ID) {
					t.Fatalf("resumed %v on %s (running on nb %v, on na %v), after na was drained",
						resumed, got.NodeID, f.running("nb", sb.ID), f.running("na", sb.ID))
				}
				if image == "uploading" && f.durableManifest(hib) {
					t.Fatal("the upload was held, yet the blob store has the image: not a peer fetch")
				}
			})
		})
	}
}

// Records decisions (the code before passed too): a paused sandbox on a
// draining node resumes there (its memory is there; the drain hibernates
// it), and a rollback is made in place.
func TestPausedResumeAndRollbackStayOnADrainingNode(t *testing.T) {
	controltest.Each(t, func(t *testing.T, c controltest.Config) {
		f := newDrainFleet(t, c, diskOnly)
		paused, run := f.on("na"), f.on("na")
		if err := f.a.Pause(opCtx(t), paused.ID); err != nil {
			t.Fatal(err)
		}
		sn, err := f.a.Snapshot(opCtx(t), run.ID, "", false)
		if err != nil {
			t.Fatal(err)
		}
		f.staleB()
		f.commitDrain()
		got, resumed, err := f.b.Connect(opCtx(t), paused.ID, time.Hour)
		if err != nil || !resumed || got.NodeID != "na" || !f.running("na", paused.ID) {
			t.Fatalf("paused sandbox: resumed %v on %s, %v; want on na", resumed, got.NodeID, err)
		}
		back, err := f.b.Rollback(opCtx(t), run.ID, sn.ID)
		if err != nil || back.NodeID != "na" || !f.running("na", run.ID) {
			t.Fatalf("rollback: on %s, %v; want in place on na", back.NodeID, err)
		}
	})
}

// The warm pool, filled by B after A drained na: every pooled sandbox on
// nb; a pool kept on na is not filled, its error naming the drain.
// Before, B filled na from its view, and a pool kept on na was filled
// whatever its drain.
func TestWarmPoolSkipsADrainedNode(t *testing.T) {
	controltest.Each(t, func(t *testing.T, c controltest.Config) {
		f := newDrainFleet(t, c, diskOnly)
		f.staleB()
		f.drain()
		cfg := control.PoolConfig{Templates: []string{"base"}, Size: 2}
		if err := f.b.FillPool(opCtx(t), cfg, "base"); err != nil {
			t.Fatal(err)
		}
		pooled := f.rowsIn(store.StatePooled)
		if len(pooled) != 2 {
			t.Fatalf("%d pooled, want 2", len(pooled))
		}
		for _, p := range pooled {
			if p.NodeID != "nb" {
				t.Fatalf("pooled sandbox %s on %s, after na was drained", p.ID, p.NodeID)
			}
		}
		ci := control.PoolConfig{Templates: []string{"code-interpreter-v1"}, Size: 1, NodeID: "na"}
		err := f.b.FillPool(opCtx(t), ci, "code-interpreter-v1")
		if !errors.Is(err, errdefs.ErrUnavailable) || !strings.Contains(err.Error(), "node na is draining") {
			t.Fatalf("fill of a pool kept on drained na: %v", err)
		}
		if n := f.sandboxesOn("na"); n != 0 || len(f.rowsIn(store.StatePooled)) != 2 {
			t.Fatalf("na holds %d sandboxes, %d pooled rows", n, len(f.rowsIn(store.StatePooled)))
		}
	})
}

// A create through B placed on na before its drain committed, whose
// node call is still running when A drains: the drain waits for it and
// hibernates what it made, so na runs nothing when the drain returns.
// Before, the drain skipped the row being created and returned; the
// sandbox then ran on the drained node.
func TestDrainWaitsForACreateUnderWay(t *testing.T) {
	controltest.Each(t, func(t *testing.T, c controltest.Config) {
		f := newDrainFleet(t, c, diskOnly)
		f.staleB() // na ranks first
		held := &heldCall{entered: make(chan struct{}), release: make(chan struct{})}
		n := f.node["na"]
		n.mu.Lock()
		n.create = held
		n.mu.Unlock()
		type result struct {
			sb  control.Sandbox
			err error
		}
		created := make(chan result, 1)
		go func() {
			sb, err := f.b.Create(opCtx(t), control.CreateRequest{Timeout: time.Hour})
			created <- result{sb, err}
		}()
		<-held.entered
		listed := f.sa.onListing("na")
		drained := make(chan error, 1)
		hibernated := 0
		go func() {
			var err error
			hibernated, err = f.a.Drain(opCtx(t), "na")
			drained <- err
		}()
		<-listed // the drain's first pass read na's rows
		close(held.release)
		res := <-created
		if res.err != nil || res.sb.NodeID != "na" {
			t.Fatalf("create under way: on %s, %v", res.sb.NodeID, res.err)
		}
		if err := <-drained; err != nil {
			t.Fatal(err)
		}
		if r := f.row(res.sb.ID); hibernated != 1 || r.State != store.StateHibernated || f.running("na", res.sb.ID) {
			t.Fatalf("drain hibernated %d; the create's sandbox is %s, running on na %v", hibernated, r.State, f.running("na", res.sb.ID))
		}
	})
}

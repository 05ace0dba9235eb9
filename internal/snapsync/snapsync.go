// Package snapsync moves snapshots between a node's repository (package
// snapshot: its local disk) and the blob store every node reaches
// (package chunk over package blob). Upload makes a committed snapshot
// durable; Ensure gives a node a snapshot it does not hold, from its
// chunk cache, its peers, then the store.
//
// A snapshot travels as its whole directory (manifest.json and the
// checkpoint image) packed under a chunk manifest named by the snapshot's
// ID. The chunk manifest's metadata records what a restore needs of the
// node (the runtime build, the root filesystem build, the CPU features);
// Ensure refuses, before fetching anything, a snapshot this node cannot
// restore. The root filesystem tree and runtime build a snapshot needs
// travel beside it, kept by their identity (deps.go): a node that lacks
// them gets them with the snapshot.
package snapsync

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/spore-run/spore/internal/atomicfs"
	"github.com/spore-run/spore/internal/blob"
	"github.com/spore-run/spore/internal/chunk"
	"github.com/spore-run/spore/internal/errdefs"
	"github.com/spore-run/spore/internal/ids"
	"github.com/spore-run/spore/internal/snapshot"
)

// Metadata keys of a snapshot's chunk manifest.
const (
	MetaRuntime  = "spore.runtime"  // runtime build that wrote the image
	MetaRootFS   = "spore.rootfs"   // root filesystem name and build, "name@build"
	MetaCPU      = "spore.cpu"      // CPU features of the node that took it, comma-separated
	MetaKind     = "spore.kind"     // snapshot, template, hibernation
	MetaSnapshot = "spore.snapshot" // the snapshot's ID (the manifest's ID too)
	manifestName = "manifest.json"  // the snapshot repository's manifest file
	fetchDir     = ".fetch"         // under the repository: trees being fetched
	maxDirEntry  = 1 << 20          // bound on a fetched snapshot manifest
)

// Config sets a Syncer up.
type Config struct {
	Repo  *snapshot.Repo
	Store blob.Store
	// Cache is the node's chunk cache (may be nil): packs fill it, so
	// peers can fetch from this node; fetches read and fill it.
	Cache *chunk.Cache
	// PeerClient reaches this node's peers (their chunk and manifest
	// handlers) as a member of the fleet (fleetauth); nil: no peers are
	// asked.
	PeerClient *http.Client
	// Runtime is this node's runtime build; CPUFeatures its CPU's flags.
	Runtime     string
	CPUFeatures []string
	// RootFSBuild returns the build ID of a root filesystem on this node
	// (an error when it has none of that name).
	RootFSBuild func(name string) (string, error)
	// Deps, when set, holds the snapshots' dependencies on this node
	// (deps.go): uploads publish them, fetches install the missing ones,
	// and a snapshot of another root filesystem or runtime build than the
	// node's current ones is fetched with them instead of refused.
	Deps Deps
	// Localize rewrites a fetched snapshot's node-local paths (the
	// in-sandbox daemon's directory) for this node.
	Localize func(*snapshot.Manifest)
	Log      *slog.Logger
}

// Syncer uploads and fetches one node's snapshots.
type Syncer struct {
	cfg Config
	log *slog.Logger

	mu       sync.Mutex
	inflight map[string]*call // fetches and uploads by snapshot ID: one at a time
	totals   FetchTotals      // under mu
}

// FetchTotals are what this node's fetches of snapshots did since it
// started (Totals): how many ended committed or failed, and where the
// committed ones' chunks came from.
type FetchTotals struct {
	Fetched, Failed                      int64
	FromCache, FromPeer, FromStore, Zero int64 // chunks
	PeerBytes, StoreBytes                int64 // stored bytes transferred
	Corrupt                              int64 // copies that failed their hash check
}

// Totals returns the fetch totals now.
func (s *Syncer) Totals() FetchTotals {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.totals
}

// count adds one fetch's outcome to the totals.
func (s *Syncer) count(res FetchResult, err error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	t := &s.totals
	if err != nil {
		t.Failed++
		return
	}
	f := res.From
	t.Fetched++
	t.FromCache += int64(f.FromCache)
	t.FromPeer += int64(f.FromPeer)
	t.FromStore += int64(f.FromStore)
	t.Zero += int64(f.Zero)
	t.PeerBytes += f.PeerBytes
	t.StoreBytes += f.StoreBytes
	t.Corrupt += int64(f.Corrupt)
}

type call struct {
	done chan struct{}
	err  error
}

// New returns a Syncer.
func New(cfg Config) (*Syncer, error) {
	if cfg.Repo == nil || cfg.Store == nil {
		return nil, errdefs.Invalidf("snapsync: a repository and a blob store are needed")
	}
	if cfg.Log == nil {
		cfg.Log = slog.Default()
	}
	if err := os.RemoveAll(filepath.Join(cfg.Repo.Dir(), fetchDir)); err != nil {
		return nil, fmt.Errorf("snapsync: clear fetches of a previous run: %w", err)
	}
	return &Syncer{cfg: cfg, log: cfg.Log, inflight: map[string]*call{}}, nil
}

// Cache is the node's chunk cache (nil when it has none).
func (s *Syncer) Cache() *chunk.Cache { return s.cfg.Cache }

// Store is the blob store.
func (s *Syncer) Store() blob.Store { return s.cfg.Store }

// once runs f for key unless a call for key runs already, in which case
// it waits for that one and returns its outcome.
func (s *Syncer) once(ctx context.Context, key string, f func() error) error {
	s.mu.Lock()
	if c, ok := s.inflight[key]; ok {
		s.mu.Unlock()
		select {
		case <-c.done:
			return c.err
		case <-ctx.Done():
			return ctx.Err()
		}
	}
	c := &call{done: make(chan struct{})}
	s.inflight[key] = c
	s.mu.Unlock()
	c.err = f()
	s.mu.Lock()
	delete(s.inflight, key)
	s.mu.Unlock()
	close(c.done)
	return c.err
}

// Result describes an upload.
type Result struct {
	TotalBytes  int64 // raw bytes of the snapshot
	StoredBytes int64 // compressed bytes this upload added to the store (the rest was there)
	NewChunks   int
	Reused      int
	Took        time.Duration
}

// Upload makes the snapshot ref (ID or name) durable in the store. It is
// idempotent: a snapshot already there uploads nothing, and an upload cut
// short continues where it stopped.
func (s *Syncer) Upload(ctx context.Context, ref string) (Result, error) {
	m, err := s.cfg.Repo.Get(ref)
	if err != nil {
		return Result{}, err
	}
	var res Result
	err = s.once(ctx, "upload/"+m.ID, func() error {
		start := time.Now()
		if cm, err := chunk.ReadManifest(ctx, s.cfg.Store, m.ID); err == nil {
			res = Result{TotalBytes: cm.TotalBytes(), Took: time.Since(start)}
			return nil
		} else if !errdefs.IsNotFound(err) {
			return fmt.Errorf("upload snapshot %s: %w", m.ID, err)
		}
		dir := filepath.Join(s.cfg.Repo.Dir(), m.ID)
		opts := chunk.PackOptions{ID: m.ID, Metadata: s.metadata(m), Cache: s.cfg.Cache, Log: s.log}
		if s.cfg.Deps != nil {
			deps := DepsOf(m)
			for _, d := range deps {
				opts.Refs = append(opts.Refs, d.ManifestID())
			}
			opts.EnsureRefs = func(ctx context.Context) error { return s.PublishDeps(ctx, deps) }
		}
		_, st, err := chunk.Pack(ctx, dir, s.cfg.Store, opts)
		if err != nil {
			return fmt.Errorf("upload snapshot %s: %w", m.ID, err)
		}
		res = Result{TotalBytes: st.TotalBytes, StoredBytes: st.StoredBytes, NewChunks: st.NewChunks, Reused: st.ReusedChunks, Took: time.Since(start)}
		s.log.Info("snapshot uploaded", "snapshot_id", m.ID, "bytes", st.TotalBytes, "stored", st.StoredBytes,
			"new_chunks", st.NewChunks, "reused_chunks", st.ReusedChunks, "took", res.Took)
		return nil
	})
	return res, err
}

func (s *Syncer) metadata(m snapshot.Manifest) map[string]string {
	meta := map[string]string{
		MetaRuntime:  m.Runtime,
		MetaRootFS:   m.RootFS + "@" + m.RootFSID,
		MetaCPU:      strings.Join(s.cfg.CPUFeatures, ","),
		MetaKind:     string(m.Kind),
		MetaSnapshot: m.ID,
	}
	if m.RuntimeBuild != "" {
		meta[MetaRuntimeBuild] = m.RuntimeBuild
	}
	if c := volumeCopies(m); len(c) > 0 {
		meta[MetaVolumes] = strings.Join(c, ",")
	}
	return meta
}

// FetchResult describes a fetch.
type FetchResult struct {
	Fetched bool // false: the node held it already
	Bytes   int64
	From    chunk.FetchStats
	Took    time.Duration
}

// Ensure makes the snapshot id present in the node's repository: held
// already, or fetched (node cache, then peers, then the store) and
// committed, with the root filesystem tree and runtime build it needs if
// the node lacks them (deps.go). A snapshot the store does not have is
// ErrNotFound; one this node cannot restore (a runtime or root filesystem
// build neither the node nor the store holds, or CPU features this node
// lacks) is ErrConflict, before anything is fetched.
func (s *Syncer) Ensure(ctx context.Context, id string, peers []string) (FetchResult, error) {
	if err := ids.Validate("snapshot ID", id); err != nil {
		return FetchResult{}, err
	}
	if _, err := s.cfg.Repo.Get(id); err == nil {
		return FetchResult{}, nil
	}
	var res FetchResult
	err := s.once(ctx, "fetch/"+id, func() error {
		if _, err := s.cfg.Repo.Get(id); err == nil {
			return nil // a concurrent fetch committed it
		}
		r, err := s.fetch(ctx, id, peers)
		res = r
		s.count(r, err)
		return err
	})
	return res, err
}

func (s *Syncer) fetch(ctx context.Context, id string, peers []string) (FetchResult, error) {
	start := time.Now()
	cm, err := chunk.ReadManifest(ctx, s.cfg.Store, id)
	if err != nil && len(peers) > 0 && (errdefs.IsNotFound(err) || errdefs.IsUnavailable(err)) {
		// Not durable yet (its upload runs), or the store is away: the
		// node that took it serves its manifest and chunks.
		var perr error
		if cm, perr = s.peerManifest(ctx, id, peers); perr != nil {
			err = fmt.Errorf("%w; from its peers: %w", err, perr)
		} else {
			err = nil
		}
	}
	if err != nil {
		return FetchResult{}, fmt.Errorf("fetch snapshot %s: %w", id, err)
	}
	if err := s.Compatible(ctx, cm.Metadata); err != nil {
		return FetchResult{}, fmt.Errorf("snapshot %s: %w", id, err)
	}
	if s.cfg.Deps != nil {
		release := s.cfg.Deps.Hold() // until the snapshot that needs them is committed
		defer release()
		if err := s.installDeps(ctx, cm.Metadata); err != nil {
			return FetchResult{}, fmt.Errorf("snapshot %s: %w", id, err)
		}
	}
	parent := filepath.Join(s.cfg.Repo.Dir(), fetchDir)
	if err := os.MkdirAll(parent, 0o700); err != nil {
		return FetchResult{}, err
	}
	tree := filepath.Join(parent, id)
	os.RemoveAll(tree) // a fetch of a previous try that failed
	defer os.RemoveAll(tree)
	src := &chunk.Tiered{Cache: s.cfg.Cache, Store: s.cfg.Store, Log: s.log}
	if len(peers) > 0 && s.cfg.PeerClient != nil {
		src.Peers = &chunk.Peers{URLs: peers, Client: s.cfg.PeerClient}
	}
	st, err := chunk.Unpack(ctx, cm, tree, src, chunk.UnpackOptions{})
	if err != nil {
		return FetchResult{}, fmt.Errorf("fetch snapshot %s: %w", id, err)
	}
	m, err := readSnapshotManifest(filepath.Join(tree, manifestName))
	if err != nil {
		return FetchResult{}, fmt.Errorf("fetch snapshot %s: %w", id, err)
	}
	if m.ID != id {
		return FetchResult{}, fmt.Errorf("fetch snapshot %s: %w: its manifest names %q", id, errdefs.ErrDataLoss, m.ID)
	}
	m.Copy = true
	if s.cfg.Localize != nil {
		s.cfg.Localize(&m)
	}
	stg, err := s.cfg.Repo.Stage(id)
	if err != nil {
		return FetchResult{}, fmt.Errorf("fetch snapshot %s: %w", id, err)
	}
	defer stg.Abort()
	// Stage made an empty image directory: the fetched one takes its place
	// (one file system: a rename).
	if err := os.Remove(stg.ImageDir()); err != nil {
		return FetchResult{}, err
	}
	if err := os.Rename(filepath.Join(tree, "image"), stg.ImageDir()); err != nil {
		return FetchResult{}, fmt.Errorf("fetch snapshot %s: %w", id, err)
	}
	// The names travel with it, but a name held here by another snapshot
	// stays there (names are the control plane's; it asked by ID).
	names := m.Names
	m.Names = nil
	for _, n := range names {
		if _, err := s.cfg.Repo.Get(n); errdefs.IsNotFound(err) {
			m.Names = append(m.Names, n)
		}
	}
	if _, err := stg.Commit(m, snapshot.CommitOptions{}); err != nil {
		return FetchResult{}, fmt.Errorf("fetch snapshot %s: %w", id, err)
	}
	res := FetchResult{Fetched: true, Bytes: st.Bytes, From: st.Fetch, Took: time.Since(start)}
	s.log.Info("snapshot fetched", "snapshot_id", id, "bytes", st.Bytes, "from_cache", st.Fetch.FromCache,
		"from_peer", st.Fetch.FromPeer, "from_store", st.Fetch.FromStore, "took", res.Took)
	return res, nil
}

func readSnapshotManifest(path string) (snapshot.Manifest, error) {
	var m snapshot.Manifest
	fi, err := os.Stat(path)
	if err != nil {
		return m, fmt.Errorf("%w: no snapshot manifest in the fetched tree", errdefs.ErrDataLoss)
	}
	if fi.Size() > maxDirEntry {
		return m, fmt.Errorf("%w: snapshot manifest of %d bytes", errdefs.ErrDataLoss, fi.Size())
	}
	if err := atomicfs.ReadJSON(path, &m); err != nil {
		return m, fmt.Errorf("%w: snapshot manifest: %w", errdefs.ErrDataLoss, err)
	}
	return m, nil
}

// Compatible says whether this node can restore a snapshot whose chunk
// manifest carries meta: every CPU feature the origin had, and the root
// filesystem and runtime builds it was taken with, which with Deps are
// on this node or in the store (they are fetched with it), and without
// are this node's current ones. An image from before runtime builds were
// kept needs the runtime (and version) this node runs.
func (s *Syncer) Compatible(ctx context.Context, meta map[string]string) error {
	if rt := meta[MetaRuntime]; rt != "" && s.cfg.Runtime != "" && rt != s.cfg.Runtime && (s.cfg.Deps == nil || meta[MetaRuntimeBuild] == "") {
		return fmt.Errorf("%w: taken with runtime %s, this node runs %s", errdefs.ErrConflict, rt, s.cfg.Runtime)
	}
	if s.cfg.Deps != nil {
		if err := s.depsAvailable(ctx, meta); err != nil {
			return err
		}
	} else if fsref := meta[MetaRootFS]; fsref != "" && s.cfg.RootFSBuild != nil {
		name, build, _ := strings.Cut(fsref, "@")
		have, err := s.cfg.RootFSBuild(name)
		if err != nil {
			return fmt.Errorf("%w: root filesystem %s: %w", errdefs.ErrConflict, name, err)
		}
		if have != build {
			return fmt.Errorf("%w: taken over root filesystem %s build %s, this node has build %s", errdefs.ErrConflict, name, build, have)
		}
	}
	if need := meta[MetaCPU]; need != "" && len(s.cfg.CPUFeatures) > 0 {
		var missing []string
		for _, f := range strings.Split(need, ",") {
			if f != "" && !slices.Contains(s.cfg.CPUFeatures, f) {
				missing = append(missing, f)
			}
		}
		if len(missing) > 0 {
			return fmt.Errorf("%w: the node that took it had CPU features this node lacks: %s", errdefs.ErrConflict, strings.Join(missing, " "))
		}
	}
	return nil
}

// Delete removes the snapshot's manifest from the store (its chunks go at
// the next GC if no other manifest names them). A missing one is fine.
func (s *Syncer) Delete(ctx context.Context, id string) error {
	err := chunk.DeleteManifest(ctx, s.cfg.Store, id)
	if err != nil && !errdefs.IsNotFound(err) {
		return fmt.Errorf("delete snapshot %s from the store: %w", id, err)
	}
	return nil
}

// Durable says whether the store holds the snapshot's manifest.
func (s *Syncer) Durable(ctx context.Context, id string) (bool, error) {
	_, err := chunk.ReadManifest(ctx, s.cfg.Store, id)
	switch {
	case err == nil:
		return true, nil
	case errdefs.IsNotFound(err):
		return false, nil
	}
	return false, err
}

// ManifestPath is where a node serves, to its peers, the chunk manifest
// of a snapshot it holds: <ManifestPath><id> (cluster token as Bearer).
const ManifestPath = "/internal/snapshot-manifests/"

// Manifest returns the chunk manifest of a snapshot this node holds: the
// store's once it is durable, else one made from the local copy (its
// chunks put in the node cache, so peers can fetch them). Concurrent
// calls for one snapshot index it once.
func (s *Syncer) Manifest(ctx context.Context, id string) (*chunk.Manifest, error) {
	if err := ids.Validate("snapshot ID", id); err != nil {
		return nil, err
	}
	m, err := s.cfg.Repo.Get(id)
	if err != nil {
		return nil, err
	}
	if cm, err := chunk.ReadManifest(ctx, s.cfg.Store, id); err == nil {
		return cm, nil
	}
	if s.cfg.Cache == nil {
		return nil, errdefs.Conflictf("snapshot %s: this node has no chunk cache to serve it from", id)
	}
	var cm *chunk.Manifest
	err = s.once(ctx, "index/"+id, func() error {
		var err error
		cm, err = chunk.Index(ctx, filepath.Join(s.cfg.Repo.Dir(), m.ID), s.cfg.Cache, chunk.IndexOptions{ID: m.ID, Metadata: s.metadata(m)})
		return err
	})
	if err == nil && cm == nil {
		// Indexed by a concurrent call: again, now from the cache.
		cm, err = chunk.Index(ctx, filepath.Join(s.cfg.Repo.Dir(), m.ID), s.cfg.Cache, chunk.IndexOptions{ID: m.ID, Metadata: s.metadata(m)})
	}
	return cm, err
}

// ManifestHandler serves Manifest to peers; it checks no caller: the
// node serves it behind its fleet guard, as the chunk handler.
func (s *Syncer) ManifestHandler() http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method != http.MethodGet {
			http.Error(w, "GET only", http.StatusMethodNotAllowed)
			return
		}
		id := strings.TrimPrefix(r.URL.Path, ManifestPath)
		cm, err := s.Manifest(r.Context(), id)
		switch {
		case errdefs.IsInvalidArgument(err):
			http.Error(w, err.Error(), http.StatusBadRequest)
			return
		case errdefs.IsNotFound(err):
			http.Error(w, "no such snapshot here", http.StatusNotFound)
			return
		case err != nil:
			s.log.Warn("serve a snapshot manifest to a peer", "snapshot_id", id, "err", err)
			http.Error(w, "cannot serve it now", http.StatusServiceUnavailable)
			return
		}
		b, err := chunk.EncodeManifest(cm)
		if err != nil {
			http.Error(w, err.Error(), http.StatusInternalServerError)
			return
		}
		w.Header().Set("Content-Type", "application/json")
		w.Write(b)
	})
}

// peerManifest asks the peers, in turn, for a snapshot's manifest.
func (s *Syncer) peerManifest(ctx context.Context, id string, peers []string) (*chunk.Manifest, error) {
	var errs []error
	for _, base := range peers {
		cm, err := s.peerManifestFrom(ctx, strings.TrimSuffix(base, "/")+ManifestPath+id, id)
		if err == nil {
			return cm, nil
		}
		errs = append(errs, err)
	}
	return nil, errors.Join(errs...)
}

func (s *Syncer) peerManifestFrom(ctx context.Context, url, id string) (*chunk.Manifest, error) {
	ctx, cancel := context.WithTimeout(ctx, 2*time.Minute) // the peer may index the snapshot first
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return nil, err
	}
	if s.cfg.PeerClient == nil {
		return nil, errdefs.Conflictf("no peer client")
	}
	resp, err := s.cfg.PeerClient.Do(req)
	if err != nil {
		return nil, fmt.Errorf("%w: %w", errdefs.ErrUnavailable, err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("%w: %s: %s", errdefs.ErrUnavailable, url, resp.Status)
	}
	b, err := io.ReadAll(io.LimitReader(resp.Body, 64<<20))
	if err != nil {
		return nil, err
	}
	cm, err := chunk.DecodeManifest(b)
	if err != nil {
		return nil, err
	}
	if cm.ID != id {
		return nil, fmt.Errorf("%w: a peer answered manifest %q for %s", errdefs.ErrDataLoss, cm.ID, id)
	}
	return cm, nil
}

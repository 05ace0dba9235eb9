package snapsync_test

import (
	"bytes"
	"context"
	"crypto/rand"
	"os"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/spore-run/spore/internal/blob/local"
	"github.com/spore-run/spore/internal/chunk"
	"github.com/spore-run/spore/internal/errdefs"
	"github.com/spore-run/spore/internal/runtime"
	"github.com/spore-run/spore/internal/snapshot"
	"github.com/spore-run/spore/internal/snapsync"
)

// node is one node's repository, cache and syncer over a shared store.
type node struct {
	repo *snapshot.Repo
	sync *snapsync.Syncer
}

func newNode(t *testing.T, store *local.Store, cfg snapsync.Config) node {
	t.Helper()
	dir := t.TempDir()
	repo, err := snapshot.Open(filepath.Join(dir, "snapshots"))
	if err != nil {
		t.Fatal(err)
	}
	cache, err := chunk.OpenCache(filepath.Join(dir, "cache"), 256<<20)
	if err != nil {
		t.Fatal(err)
	}
	cfg.Repo, cfg.Store, cfg.Cache = repo, store, cache
	if cfg.Runtime == "" {
		cfg.Runtime = "runsc-test"
	}
	if cfg.RootFSBuild == nil {
		cfg.RootFSBuild = func(string) (string, error) { return "b1", nil }
	}
	s, err := snapsync.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	return node{repo: repo, sync: s}
}

func ctx(t *testing.T) context.Context {
	c, cancel := context.WithTimeout(context.Background(), time.Minute)
	t.Cleanup(cancel)
	return c
}

// take commits a snapshot with an image of a few files into n's repo.
func (n node) take(t *testing.T, id string, files map[string][]byte) snapshot.Manifest {
	t.Helper()
	stg, err := n.repo.Stage(id)
	if err != nil {
		t.Fatal(err)
	}
	for name, b := range files {
		if err := os.WriteFile(filepath.Join(stg.ImageDir(), name), b, 0o600); err != nil {
			t.Fatal(err)
		}
	}
	m, err := stg.Commit(snapshot.Manifest{Names: []string{"named-" + id}, Kind: snapshot.KindSnapshot, RootFS: "base", RootFSID: "b1", Runtime: "runsc-test",
		Run: snapshot.RunConfig{Args: []string{"/init"}, Mounts: []runtime.Mount{{Source: "/origin/envd", Destination: "/opt/spore", ReadOnly: true}}}}, snapshot.CommitOptions{})
	if err != nil {
		t.Fatal(err)
	}
	return m
}

func random(n int) []byte {
	b := make([]byte, n)
	rand.Read(b)
	return b
}

// A snapshot uploaded by one node is fetched by another whole: the same
// image bytes, the same manifest (names, run config), node-local paths
// rewritten; a second fetch or upload does nothing; a second snapshot that
// shares most bytes stores only what changed.
func TestUploadThenFetchElsewhere(t *testing.T) {
	store, err := local.Open(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	a := newNode(t, store, snapsync.Config{})
	b := newNode(t, store, snapsync.Config{Localize: func(m *snapshot.Manifest) {
		for i := range m.Run.Mounts {
			if m.Run.Mounts[i].Destination == "/opt/spore" {
				m.Run.Mounts[i].Source = "/b/envd"
			}
		}
	}})
	mem := random(48 << 20) // chunks average ~768 KiB: a 64 KiB change costs one or two
	files := map[string][]byte{"pages.img": mem, "state": random(1000), "empty": nil}
	m := a.take(t, "s1", files)

	if ok, err := a.sync.Durable(ctx(t), "s1"); err != nil || ok {
		t.Fatalf("durable before the upload: %v %v", ok, err)
	}
	res, err := a.sync.Upload(ctx(t), "named-s1")
	if err != nil {
		t.Fatal(err)
	}
	if res.TotalBytes < int64(len(mem)) || res.StoredBytes == 0 {
		t.Fatalf("upload: %+v", res)
	}
	if ok, err := a.sync.Durable(ctx(t), "s1"); err != nil || !ok {
		t.Fatalf("not durable after the upload: %v %v", ok, err)
	}
	again, err := a.sync.Upload(ctx(t), "s1")
	if err != nil || again.StoredBytes != 0 {
		t.Fatalf("second upload: %+v %v", again, err)
	}

	if _, err := b.repo.Get("s1"); !errdefs.IsNotFound(err) {
		t.Fatalf("b holds s1 before fetching: %v", err)
	}
	fr, err := b.sync.Ensure(ctx(t), "s1", nil)
	if err != nil {
		t.Fatal(err)
	}
	if !fr.Fetched || fr.From.FromStore == 0 {
		t.Fatalf("fetch: %+v", fr)
	}
	got, err := b.repo.Get("named-s1")
	if err != nil {
		t.Fatalf("fetched snapshot by name: %v", err)
	}
	if got.ID != m.ID || got.RootFSID != m.RootFSID || got.Run.Args[0] != "/init" || got.Kind != snapshot.KindSnapshot {
		t.Fatalf("fetched manifest %+v, want %+v", got, m)
	}
	if src := got.Run.Mounts[0].Source; src != "/b/envd" {
		t.Fatalf("mount source not localized: %s", src)
	}
	for name, want := range files {
		have, err := os.ReadFile(filepath.Join(b.repo.ImageDir("s1"), name))
		if err != nil || !bytes.Equal(have, want) {
			t.Fatalf("image file %s differs after the fetch (%d vs %d bytes): %v", name, len(have), len(want), err)
		}
	}
	if fr, err := b.sync.Ensure(ctx(t), "s1", nil); err != nil || fr.Fetched {
		t.Fatalf("second ensure: %+v %v", fr, err)
	}
	// The node's totals (its metrics) count the one fetch, from the store.
	if tot := b.sync.Totals(); tot.Fetched != 1 || tot.Failed != 0 || tot.FromStore != int64(fr.From.FromStore) ||
		tot.StoreBytes != fr.From.StoreBytes || tot.StoreBytes == 0 || tot.FromPeer != 0 || tot.PeerBytes != 0 {
		t.Fatalf("fetch totals %+v after one fetch from the store (%+v)", tot, fr.From)
	}
	// Mostly the same memory: the second snapshot stores under 10 %.
	mem2 := bytes.Clone(mem)
	copy(mem2[3<<20:], random(64<<10))
	a.take(t, "s2", map[string][]byte{"pages.img": mem2, "state": random(1000)})
	r2, err := a.sync.Upload(ctx(t), "s2")
	if err != nil {
		t.Fatal(err)
	}
	if r2.StoredBytes*10 > res.StoredBytes {
		t.Fatalf("second snapshot stored %d bytes, the first %d: want under 10 %%", r2.StoredBytes, res.StoredBytes)
	}
	t.Logf("first snapshot %d bytes stored, second %d (%.1f %%)", res.StoredBytes, r2.StoredBytes, 100*float64(r2.StoredBytes)/float64(res.StoredBytes))
	if err := a.sync.Delete(ctx(t), "s1"); err != nil {
		t.Fatal(err)
	}
	if ok, _ := a.sync.Durable(ctx(t), "s1"); ok {
		t.Fatal("still durable after its delete")
	}
}

// A node that cannot restore a snapshot refuses it before fetching: another
// runtime build, another root filesystem build, missing CPU features.
// Nothing is left in its repository; an unknown snapshot is NotFound.
func TestFetchRefusesIncompatible(t *testing.T) {
	store, err := local.Open(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	a := newNode(t, store, snapsync.Config{CPUFeatures: []string{"sse4_2", "avx2", "avx512f"}})
	a.take(t, "s1", map[string][]byte{"pages.img": random(1 << 20)})
	if _, err := a.sync.Upload(ctx(t), "s1"); err != nil {
		t.Fatal(err)
	}
	for name, cfg := range map[string]snapsync.Config{
		"runtime": {Runtime: "runsc-other", CPUFeatures: []string{"sse4_2", "avx2", "avx512f"}},
		"rootfs":  {RootFSBuild: func(string) (string, error) { return "b2", nil }, CPUFeatures: []string{"sse4_2", "avx2", "avx512f"}},
		"cpu":     {CPUFeatures: []string{"sse4_2", "avx2"}},
	} {
		n := newNode(t, store, cfg)
		_, err := n.sync.Ensure(ctx(t), "s1", nil)
		if !errdefs.IsConflict(err) {
			t.Fatalf("%s: fetch of an incompatible snapshot: %v, want a conflict", name, err)
		}
		t.Logf("%s: %v", name, err)
		if len(n.repo.List()) != 0 {
			t.Fatalf("%s: the refused snapshot is in the repository", name)
		}
	}
	ok := newNode(t, store, snapsync.Config{CPUFeatures: []string{"sse4_2", "avx2", "avx512f", "amx"}})
	if _, err := ok.sync.Ensure(ctx(t), "s1", nil); err != nil {
		t.Fatalf("a node with more CPU features: %v", err)
	}
	if _, err := ok.sync.Ensure(ctx(t), "snone", nil); !errdefs.IsNotFound(err) {
		t.Fatalf("unknown snapshot: %v", err)
	}
	if tot := ok.sync.Totals(); tot.Fetched != 1 || tot.Failed != 1 {
		t.Fatalf("fetch totals %+v, want one fetched and one failed", tot)
	}
	if _, err := ok.sync.Ensure(ctx(t), "../x", nil); !errdefs.IsInvalidArgument(err) {
		t.Fatalf("bad ID: %v", err)
	}
}

// Concurrent restores of one snapshot on a node fetch it once.
func TestConcurrentEnsureFetchesOnce(t *testing.T) {
	store, err := local.Open(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	a := newNode(t, store, snapsync.Config{})
	a.take(t, "s1", map[string][]byte{"pages.img": random(4 << 20)})
	if _, err := a.sync.Upload(ctx(t), "s1"); err != nil {
		t.Fatal(err)
	}
	b := newNode(t, store, snapsync.Config{})
	var wg sync.WaitGroup
	var mu sync.Mutex
	fetched := 0
	for range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			fr, err := b.sync.Ensure(ctx(t), "s1", nil)
			if err != nil {
				t.Error(err)
				return
			}
			mu.Lock()
			if fr.Fetched {
				fetched++
			}
			mu.Unlock()
		}()
	}
	wg.Wait()
	if fetched > 1 {
		t.Fatalf("fetched %d times", fetched)
	}
	if _, err := b.repo.Get("s1"); err != nil {
		t.Fatal(err)
	}
}

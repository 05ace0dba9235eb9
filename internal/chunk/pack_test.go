package chunk

import (
	"context"
	"maps"
	"math/rand/v2"
	"os"
	"path/filepath"
	"syscall"
	"testing"

	"github.com/spore-run/spore/internal/errdefs"
)

// sampleTree writes a tree with an empty file, small files, a multi-chunk
// file, nested and empty directories, a symlink and a FIFO.
func sampleTree(t *testing.T, r *rand.Rand) string {
	dir := filepath.Join(t.TempDir(), "tree")
	writeFile(t, filepath.Join(dir, "empty"), nil)
	writeFile(t, filepath.Join(dir, "small.txt"), []byte("hello\n"))
	writeFile(t, filepath.Join(dir, "pages.img"), memoryImage(r, 9<<20+123))
	writeFile(t, filepath.Join(dir, "a", "b", "deep.bin"), randBytes(r, 300<<10))
	writeFile(t, filepath.Join(dir, "a", "same.bin"), []byte("hello\n")) // dedupes with small.txt
	if err := os.MkdirAll(filepath.Join(dir, "emptydir"), 0o750); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink("../small.txt", filepath.Join(dir, "a", "link")); err != nil {
		t.Fatal(err)
	}
	if err := syscall.Mkfifo(filepath.Join(dir, "fifo"), 0o640); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(filepath.Join(dir, "small.txt"), 0o4755); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(filepath.Join(dir, "a", "b"), 0o555); err != nil { // read-only dir, filled before its mode
		t.Fatal(err)
	}
	t.Cleanup(func() { os.Chmod(filepath.Join(dir, "a", "b"), 0o755) })
	return dir
}

func TestRoundTrip(t *testing.T) {
	ctx := context.Background()
	r := rand.New(rand.NewPCG(seed(t), 1))
	dir := sampleTree(t, r)
	store := newStore(t)

	m, st, err := Pack(ctx, dir, store, PackOptions{ID: "snap-1", Metadata: map[string]string{"runsc": "test"}})
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("pack: %+v", st)
	var multi bool
	for _, e := range m.Entries {
		if e.Path == "pages.img" && len(e.Chunks) > 2 {
			multi = true
		}
	}
	if !multi {
		t.Fatalf("pages.img is not multi-chunk: %+v", m.Entries)
	}
	if st.TotalBytes != m.TotalBytes() || st.NewChunks == 0 || st.ReusedChunks != 0 || st.StoredBytes <= 0 {
		t.Fatalf("stats %+v", st)
	}
	if got := keys(t, store, "pending/"); len(got) != 0 {
		t.Fatalf("pending markers left: %v", got)
	}

	// What a reader fetches from the store is the same manifest.
	m2, err := ReadManifest(ctx, store, "snap-1")
	if err != nil {
		t.Fatal(err)
	}
	if m2.Metadata["runsc"] != "test" || len(m2.Entries) != len(m.Entries) {
		t.Fatalf("read back %+v", m2)
	}

	out := filepath.Join(t.TempDir(), "out")
	cache, err := OpenCache(t.TempDir(), 1<<30)
	if err != nil {
		t.Fatal(err)
	}
	ust, err := Unpack(ctx, m2, out, &Tiered{Cache: cache, Store: store}, UnpackOptions{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.Chmod(filepath.Join(out, "a", "b"), 0o755) })
	t.Logf("unpack: %+v", ust)
	if want, got := treeSnapshot(t, dir), treeSnapshot(t, out); !maps.Equal(want, got) {
		t.Fatalf("trees differ:\nwant %v\ngot  %v", want, got)
	}
	if ust.Fetch.FromStore == 0 || ust.Fetch.Zero == 0 {
		t.Fatalf("fetch stats %+v: want chunks from the store and zero pages as holes", ust.Fetch)
	}

	// A second restore on this node is served by the cache.
	out2 := filepath.Join(t.TempDir(), "out2")
	ust, err = Unpack(ctx, m2, out2, &Tiered{Cache: cache, Store: store}, UnpackOptions{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.Chmod(filepath.Join(out2, "a", "b"), 0o755) })
	if ust.Fetch.FromStore != 0 || ust.Fetch.FromCache == 0 {
		t.Fatalf("second restore %+v: want everything from the cache", ust.Fetch)
	}

	// Unpack never writes into an existing directory.
	if _, err := Unpack(ctx, m2, out, &Tiered{Store: store}, UnpackOptions{}); !errdefs.IsAlreadyExists(err) {
		t.Fatalf("unpack over an existing dir: %v", err)
	}
}

func TestPackSecondTimeStoresNothing(t *testing.T) {
	ctx := context.Background()
	r := rand.New(rand.NewPCG(seed(t), 2))
	dir := sampleTree(t, r)
	store := newStore(t)
	_, first, err := Pack(ctx, dir, store, PackOptions{ID: "one"})
	if err != nil {
		t.Fatal(err)
	}
	_, second, err := Pack(ctx, dir, store, PackOptions{ID: "two"})
	if err != nil {
		t.Fatal(err)
	}
	if second.StoredBytes != 0 || second.NewChunks != 0 || second.ReusedChunks != first.NewChunks {
		t.Fatalf("second pack of the same tree: %+v (first %+v)", second, first)
	}
}

// A 64 MiB file of random data, then 1 MiB changed in the middle, then
// 1 MiB inserted: each later Pack stores well under 10 % of the first.
func TestDedupeEditAndInsert(t *testing.T) {
	ctx := context.Background()
	r := rand.New(rand.NewPCG(seed(t), 3))
	store := newStore(t)
	dir := filepath.Join(t.TempDir(), "img")
	data := randBytes(r, 64<<20)
	writeFile(t, filepath.Join(dir, "pages.img"), data)
	_, first, err := Pack(ctx, dir, store, PackOptions{ID: "base"})
	if err != nil {
		t.Fatal(err)
	}

	edited := append([]byte(nil), data...)
	copy(edited[32<<20:], randBytes(r, 1<<20))
	writeFile(t, filepath.Join(dir, "pages.img"), edited)
	_, edit, err := Pack(ctx, dir, store, PackOptions{ID: "edit"})
	if err != nil {
		t.Fatal(err)
	}

	inserted := append(append(append([]byte(nil), data[:20<<20]...), randBytes(r, 1<<20)...), data[20<<20:]...)
	writeFile(t, filepath.Join(dir, "pages.img"), inserted)
	_, ins, err := Pack(ctx, dir, store, PackOptions{ID: "insert"})
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("first %d bytes in %d chunks; 1 MiB changed: %d bytes (%.1f %%), %d new chunks; 1 MiB inserted: %d bytes (%.1f %%), %d new chunks",
		first.StoredBytes, first.NewChunks, edit.StoredBytes, 100*float64(edit.StoredBytes)/float64(first.StoredBytes), edit.NewChunks,
		ins.StoredBytes, 100*float64(ins.StoredBytes)/float64(first.StoredBytes), ins.NewChunks)
	for name, st := range map[string]Stats{"edit": edit, "insert": ins} {
		if st.StoredBytes*10 >= first.StoredBytes {
			t.Errorf("%s stored %d bytes, not under 10 %% of %d", name, st.StoredBytes, first.StoredBytes)
		}
	}
}

// A Pack that died midway (here: the store failing after a few chunks) is
// finished by a rerun that uploads only what is missing.
func TestPackResumes(t *testing.T) {
	ctx := context.Background()
	r := rand.New(rand.NewPCG(seed(t), 4))
	dir := filepath.Join(t.TempDir(), "img")
	writeFile(t, filepath.Join(dir, "pages.img"), randBytes(r, 12<<20))
	store := newStore(t)
	_, _, err := Pack(ctx, dir, &failingStore{Store: store, n: 3}, PackOptions{ID: "s", Concurrency: 1})
	if err == nil {
		t.Fatal("pack through a failing store succeeded")
	}
	if got := keys(t, store, "manifests/"); len(got) != 0 {
		t.Fatalf("a failed pack committed a manifest: %v", got)
	}
	uploaded := len(keys(t, store, "chunks/"))
	m, st, err := Pack(ctx, dir, store, PackOptions{ID: "s"})
	if err != nil {
		t.Fatal(err)
	}
	if uploaded == 0 || st.ReusedChunks != uploaded || st.NewChunks != len(m.ChunkIDs())-uploaded {
		t.Fatalf("rerun: %+v after %d chunks uploaded of %d", st, uploaded, len(m.ChunkIDs()))
	}
}

// Unpack that fails (a chunk missing everywhere) leaves no directory.
func TestUnpackFailureLeavesNothing(t *testing.T) {
	ctx := context.Background()
	r := rand.New(rand.NewPCG(seed(t), 5))
	dir := filepath.Join(t.TempDir(), "img")
	writeFile(t, filepath.Join(dir, "pages.img"), randBytes(r, 12<<20)) // at least 3 chunks (at most 4 MiB each), whatever the seed
	store := newStore(t)
	m, _, err := Pack(ctx, dir, store, PackOptions{ID: "s"})
	if err != nil {
		t.Fatal(err)
	}
	if err := store.Delete(ctx, m.Entries[0].Chunks[1].ID.Key()); err != nil {
		t.Fatal(err)
	}
	parent := t.TempDir()
	_, err = Unpack(ctx, m, filepath.Join(parent, "out"), &Tiered{Store: store}, UnpackOptions{})
	if !errdefs.IsNotFound(err) {
		t.Fatalf("unpack with a chunk gone: %v", err)
	}
	if ents, _ := os.ReadDir(parent); len(ents) != 0 {
		t.Fatalf("left behind: %v", ents)
	}
}

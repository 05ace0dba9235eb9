package chunk

import (
	"bytes"
	"context"
	"errors"
	"io"
	"math/rand/v2"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"sync"
	"testing"

	"github.com/spore-run/spore/internal/blob/local"
	"github.com/spore-run/spore/internal/errdefs"
	"github.com/spore-run/spore/internal/fleetauth"
)

func TestPolynomialIrreducible(t *testing.T) {
	if !Polynomial.Irreducible() || Polynomial.Deg() != 53 {
		t.Fatalf("polynomial %#x: irreducible %v, degree %d", uint64(Polynomial), Polynomial.Irreducible(), Polynomial.Deg())
	}
}

// The cut points are part of the format: the same bytes must give the same
// chunks on every node and every build, or nothing dedupes.
func TestChunkingIsStable(t *testing.T) {
	data := randBytes(rand.New(rand.NewPCG(1, 2)), 8<<20)
	c := newChunker(bytes.NewReader(data))
	buf := make([]byte, MaxChunk)
	var sizes []uint
	for {
		ch, err := c.Next(buf)
		if err == io.EOF {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		sizes = append(sizes, ch.Length)
	}
	want := []uint{684351, 1171098, 338070, 773750, 541678, 427589, 515507, 706550, 407943, 1247428, 430111, 827727, 316806}
	if !equalUints(sizes, want) {
		t.Fatalf("cut sizes %v, want %v (the chunking parameters changed: a format change)", sizes, want)
	}
}

func equalUints(a, b []uint) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i] != b[i] {
			return false
		}
	}
	return true
}

func TestParseID(t *testing.T) {
	good := Sum([]byte("x")).String()
	if _, err := ParseID(good); err != nil {
		t.Fatal(err)
	}
	for _, s := range []string{"", good[:63], good + "0", "../" + good[3:], string(bytes.ToUpper([]byte(good))), good[:62] + "%2", good[:63] + "/"} {
		if _, err := ParseID(s); !errdefs.IsInvalidArgument(err) {
			t.Errorf("ParseID(%q) = %v, want invalid", s, err)
		}
	}
}

func TestManifestValidate(t *testing.T) {
	id := Sum([]byte("abc"))
	base := func() *Manifest {
		return &Manifest{Format: FormatVersion, ID: "m", Chunking: currentChunking(), Entries: []Entry{
			{Path: "d", Type: TypeDir, Mode: 0o755},
			{Path: "d/f", Type: TypeFile, Mode: 0o644, Size: 3, Chunks: []Ref{{ID: id, Size: 3, Stored: 12}}},
			{Path: "l", Type: TypeSymlink, Target: "/etc", Mode: 0o777},
		}}
	}
	if err := base().Validate(); err != nil {
		t.Fatal(err)
	}
	for name, edit := range map[string]func(m *Manifest){
		"format":          func(m *Manifest) { m.Format = 2 },
		"id":              func(m *Manifest) { m.ID = "../x" },
		"chunking":        func(m *Manifest) { m.Chunking.AvgBits = 12 },
		"absolute":        func(m *Manifest) { m.Entries[1].Path = "/d/f" },
		"dotdot":          func(m *Manifest) { m.Entries[1].Path = "../f" },
		"inner dotdot":    func(m *Manifest) { m.Entries[1].Path = "d/../../f" },
		"unclean":         func(m *Manifest) { m.Entries[1].Path = "d//f" },
		"dot":             func(m *Manifest) { m.Entries[0].Path = "." },
		"through symlink": func(m *Manifest) { m.Entries = append(m.Entries, Entry{Path: "l/passwd", Type: TypeFile}) },
		"parent missing":  func(m *Manifest) { m.Entries[1].Path = "e/f" },
		"duplicate":       func(m *Manifest) { m.Entries = append(m.Entries, m.Entries[1]) },
		"size mismatch":   func(m *Manifest) { m.Entries[1].Size = 4 },
		"chunk too big":   func(m *Manifest) { m.Entries[1].Chunks[0].Size = MaxChunk + 1 },
		"stored zero":     func(m *Manifest) { m.Entries[1].Chunks[0].Stored = 0 },
		"dir content":     func(m *Manifest) { m.Entries[0].Size = 1 },
		"unknown type":    func(m *Manifest) { m.Entries[2].Type = "socket" },
		"empty target":    func(m *Manifest) { m.Entries[2].Target = "" },
		"mode bits":       func(m *Manifest) { m.Entries[1].Mode = 0o170644 },
	} {
		m := base()
		edit(m)
		if err := m.Validate(); !errdefs.IsInvalidArgument(err) {
			t.Errorf("%s: Validate = %v, want invalid", name, err)
		}
	}
	b, _ := encodeManifest(base())
	if _, err := DecodeManifest(append(b[:len(b)-1], []byte(`,"extra":1}`)...)); !errdefs.IsInvalidArgument(err) {
		t.Errorf("unknown field accepted: %v", err)
	}
}

// packed returns a store holding a packed tree and its manifest.
func packed(t *testing.T, seedv uint64) (*Manifest, string, *local.Store) {
	t.Helper()
	r := rand.New(rand.NewPCG(seedv, 7))
	dir := filepath.Join(t.TempDir(), "img")
	writeFile(t, filepath.Join(dir, "pages.img"), randBytes(r, 16<<20)) // at least 4 chunks (at most 4 MiB each), whatever the seed
	store := newStore(t)
	m, _, err := Pack(context.Background(), dir, store, PackOptions{ID: "s"})
	if err != nil {
		t.Fatal(err)
	}
	return m, dir, store
}

// A flipped byte in a cached chunk is caught, dropped and refetched from
// the store; the restore is intact and the cache repaired.
func TestCorruptCacheChunkRefetched(t *testing.T) {
	ctx := context.Background()
	m, dir, store := packed(t, seed(t))
	cache, err := OpenCache(t.TempDir(), 1<<30)
	if err != nil {
		t.Fatal(err)
	}
	tiers := &Tiered{Cache: cache, Store: store}
	if _, err := Unpack(ctx, m, filepath.Join(t.TempDir(), "warm"), tiers, UnpackOptions{}); err != nil {
		t.Fatal(err)
	}
	victim := m.Entries[0].Chunks[1].ID
	flipByte(t, cache.path(victim))

	out := filepath.Join(t.TempDir(), "out")
	st, err := Unpack(ctx, m, out, tiers, UnpackOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if st.Fetch.Corrupt != 1 || st.Fetch.FromStore != 1 {
		t.Fatalf("fetch %+v: want the corrupt cached chunk caught and fetched from the store", st.Fetch)
	}
	if got, want := treeSnapshot(t, out), treeSnapshot(t, dir); got["pages.img"] != want["pages.img"] {
		t.Fatalf("restored %v, want %v", got, want)
	}
	frame, err := cache.Get(victim)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := open(victim, 0, frame); err != nil {
		t.Fatalf("cache not repaired: %v", err)
	}
}

// A flipped byte in the store is caught: a data-loss error, nothing written.
func TestCorruptStoreChunkFails(t *testing.T) {
	ctx := context.Background()
	m, _, store := packed(t, seed(t))
	p, err := store.Path(m.Entries[0].Chunks[2].ID.Key())
	if err != nil {
		t.Fatal(err)
	}
	flipByte(t, p)
	cache, err := OpenCache(t.TempDir(), 1<<30)
	if err != nil {
		t.Fatal(err)
	}
	parent := t.TempDir()
	_, err = Unpack(ctx, m, filepath.Join(parent, "out"), &Tiered{Cache: cache, Store: store}, UnpackOptions{})
	if !errdefs.IsDataLoss(err) {
		t.Fatalf("unpack with a corrupt chunk in the store: %v, want data loss", err)
	}
	t.Logf("error: %v", err)
	if ents, _ := os.ReadDir(parent); len(ents) != 0 {
		t.Fatalf("left behind: %v", ents)
	}
	if cache.Has(m.Entries[0].Chunks[2].ID) {
		t.Fatal("the corrupt chunk was cached")
	}
}

func TestCacheLRUBound(t *testing.T) {
	r := rand.New(rand.NewPCG(seed(t), 8))
	dir := t.TempDir()
	frames := map[ID][]byte{}
	var order []ID
	for range 10 {
		raw := randBytes(r, 1000)
		id := Sum(raw)
		frames[id] = compress(raw)
		order = append(order, id)
	}
	size := int64(len(frames[order[0]]))
	c, err := OpenCache(dir, 4*size+size/2) // room for 4
	if err != nil {
		t.Fatal(err)
	}
	for i, id := range order {
		if err := c.Put(id, frames[id]); err != nil {
			t.Fatal(err)
		}
		if i == 3 {
			if _, err := c.Get(order[0]); err != nil { // 0 is now the most recent
				t.Fatal(err)
			}
		}
		if i == 4 && (!c.Has(order[0]) || c.Has(order[1])) {
			t.Fatal("the 5th put should have evicted 1 (least recently used), not 0 (just read)")
		}
		if u := c.Usage(); u.Bytes > u.MaxBytes {
			t.Fatalf("after %d puts: %+v over the bound", i+1, u)
		}
	}
	for i, id := range order {
		if want := i >= 6; c.Has(id) != want {
			t.Errorf("chunk %d cached %v, want %v", i, c.Has(id), want)
		}
	}
	ents, _ := os.ReadDir(filepath.Join(dir, order[0].String()[:2]))
	for _, e := range ents {
		if e.Name() == order[0].String() {
			t.Error("evicted chunk's file still on disk")
		}
	}
}

func TestCachePinnedNeverEvicted(t *testing.T) {
	r := rand.New(rand.NewPCG(seed(t), 9))
	var ids []ID
	var frames [][]byte
	for range 6 {
		raw := randBytes(r, 1000)
		ids = append(ids, Sum(raw))
		frames = append(frames, compress(raw))
	}
	size := int64(len(frames[0]))
	c, err := OpenCache(t.TempDir(), 2*size+size/2) // room for 2
	if err != nil {
		t.Fatal(err)
	}
	unpin := c.Pin(ids[:2]) // pinned before they are even cached
	for i := range 2 {
		if err := c.Put(ids[i], frames[i]); err != nil {
			t.Fatal(err)
		}
	}
	// No room without evicting a pinned chunk: refused, nothing evicted.
	if err := c.Put(ids[2], frames[2]); !errors.Is(err, errdefs.ErrResourceLimit) {
		t.Fatalf("put into a cache full of pinned chunks: %v", err)
	}
	if !c.Has(ids[0]) || !c.Has(ids[1]) || c.Has(ids[2]) {
		t.Fatal("a pinned chunk was evicted")
	}
	unpin()
	unpin() // idempotent
	if err := c.Put(ids[2], frames[2]); err != nil {
		t.Fatal(err)
	}
	if !c.Has(ids[2]) || c.Has(ids[0]) {
		t.Fatal("after unpin the LRU chunk should have made room")
	}
	if u := c.Usage(); u.Pinned != 0 || u.Bytes > u.MaxBytes {
		t.Fatalf("usage %+v", u)
	}
}

func TestCacheSurvivesReopen(t *testing.T) {
	r := rand.New(rand.NewPCG(seed(t), 10))
	dir := t.TempDir()
	c, err := OpenCache(dir, 1<<20)
	if err != nil {
		t.Fatal(err)
	}
	var ids []ID
	for range 3 {
		raw := randBytes(r, 1000)
		id := Sum(raw)
		ids = append(ids, id)
		if err := c.Put(id, compress(raw)); err != nil {
			t.Fatal(err)
		}
	}
	// Leftover of a write a crash interrupted.
	tmp := filepath.Join(dir, ids[0].String()[:2], ".x.tmp-123")
	writeFile(t, tmp, []byte("partial"))

	c2, err := OpenCache(dir, 1<<20)
	if err != nil {
		t.Fatal(err)
	}
	for _, id := range ids {
		frame, err := c2.Get(id)
		if err != nil {
			t.Fatalf("after reopen: %v", err)
		}
		if _, err := open(id, 1000, frame); err != nil {
			t.Fatal(err)
		}
	}
	if u := c2.Usage(); u.Chunks != 3 {
		t.Fatalf("usage after reopen %+v", u)
	}
	if _, err := os.Stat(tmp); !os.IsNotExist(err) {
		t.Fatalf("temporary file survived the reopen: %v", err)
	}
	// Reopened with a smaller bound: the least recently used go.
	size := c2.Usage().Bytes / 3
	c3, err := OpenCache(dir, 2*size)
	if err != nil {
		t.Fatal(err)
	}
	if u := c3.Usage(); u.Chunks != 2 || u.Bytes > u.MaxBytes {
		t.Fatalf("usage after a smaller reopen %+v", u)
	}
}

func TestPeerHandler(t *testing.T) {
	ctx := context.Background()
	m, _, store := packed(t, seed(t))
	cache, err := OpenCache(t.TempDir(), 1<<30)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := Unpack(ctx, m, filepath.Join(t.TempDir(), "warm"), &Tiered{Cache: cache, Store: store}, UnpackOptions{}); err != nil {
		t.Fatal(err)
	}
	if _, err := NewHandler(nil, nil); !errdefs.IsInvalidArgument(err) {
		t.Fatalf("handler without a cache: %v", err)
	}
	h, err := NewHandler(cache, nil)
	if err != nil {
		t.Fatal(err)
	}
	// As a node serves it: behind its fleet's guard (here an insecure
	// fleet: the token).
	fleet, err := fleetauth.Insecure("s3cret-cluster-token", nil)
	if err != nil {
		t.Fatal(err)
	}
	mux := http.NewServeMux()
	mux.Handle(PeerPath, fleet.Guard(h, false, fleetauth.Roles(fleetauth.RoleNode)))
	srv := httptest.NewServer(mux)
	defer srv.Close()
	id := m.Entries[0].Chunks[0].ID

	get := func(path, auth string) int {
		req, _ := http.NewRequest(http.MethodGet, srv.URL+path, nil)
		if auth != "" {
			req.Header.Set("Authorization", auth)
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		return resp.StatusCode
	}
	for _, tc := range []struct {
		name, path, auth string
		want             int
	}{
		{"no token", PeerPath + id.String(), "", http.StatusUnauthorized},
		{"wrong token", PeerPath + id.String(), "Bearer s3cret-cluster-tokeN", http.StatusUnauthorized},
		{"longer token", PeerPath + id.String(), "Bearer s3cret-cluster-token2", http.StatusUnauthorized},
		{"not bearer", PeerPath + id.String(), "Basic s3cret-cluster-token", http.StatusUnauthorized},
		{"ok", PeerPath + id.String(), "Bearer s3cret-cluster-token", http.StatusOK},
		{"not cached", PeerPath + Sum([]byte("nope")).String(), "Bearer s3cret-cluster-token", http.StatusNotFound},
		{"short id", PeerPath + id.String()[:10], "Bearer s3cret-cluster-token", http.StatusBadRequest},
		{"upper id", PeerPath + string(bytes.ToUpper([]byte(id.String()))), "Bearer s3cret-cluster-token", http.StatusBadRequest},
		{"dotdot", PeerPath + "..%2f..%2fetc%2fpasswd", "Bearer s3cret-cluster-token", http.StatusBadRequest},
		{"escaped id", PeerPath + "%36" + id.String()[1:], "Bearer s3cret-cluster-token", http.StatusBadRequest},
		{"nested", PeerPath + id.String()[:2] + "/" + id.String(), "Bearer s3cret-cluster-token", http.StatusBadRequest},
	} {
		if got := get(tc.path, tc.auth); got != tc.want {
			t.Errorf("%s: GET %s = %d, want %d", tc.name, tc.path, got, tc.want)
		}
	}

	// Another node restores from this one alone (no store), through a
	// dead peer first.
	dead := httptest.NewServer(http.NotFoundHandler())
	dead.Close()
	other, err := OpenCache(t.TempDir(), 1<<30)
	if err != nil {
		t.Fatal(err)
	}
	peers := &Peers{URLs: []string{dead.URL, srv.URL}, Client: fleet.Client(nil, 0)}
	st, err := Unpack(ctx, m, filepath.Join(t.TempDir(), "out"), &Tiered{Cache: other, Peers: peers}, UnpackOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if st.Fetch.FromPeer != len(m.ChunkIDs()) || st.Fetch.FromStore != 0 {
		t.Fatalf("fetch %+v: want every chunk from the peer", st.Fetch)
	}
	// With the wrong token the peer tier yields nothing and the store serves.
	wrong, _ := fleetauth.Insecure("wrong-cluster-token", nil)
	bad := &Peers{URLs: []string{srv.URL}, Client: wrong.Client(nil, 0)}
	st, err = Unpack(ctx, m, filepath.Join(t.TempDir(), "out2"), &Tiered{Peers: bad, Store: store}, UnpackOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if st.Fetch.FromPeer != 0 || st.Fetch.FromStore != len(m.ChunkIDs()) {
		t.Fatalf("fetch with a wrong token %+v", st.Fetch)
	}
}

// Readers and writers of one chunk at once (two unpacks of trees sharing
// it): a reader sees the chunk whole or not at all, and -race finds no
// unlocked access (Get read an entry's readiness after unlocking, while
// Put set it: TestRootFSSharedThroughBlobStore).
func TestCacheConcurrentGetPut(t *testing.T) {
	r := rand.New(rand.NewPCG(seed(t), 10))
	c, err := OpenCache(t.TempDir(), 1<<20)
	if err != nil {
		t.Fatal(err)
	}
	raw := randBytes(r, 4000)
	id, frame := Sum(raw), compress(raw)
	var wg sync.WaitGroup
	for range 8 {
		wg.Go(func() {
			for range 50 {
				if err := c.Put(id, frame); err != nil {
					t.Error(err)
					return
				}
			}
		})
		wg.Go(func() {
			for range 50 {
				b, err := c.Get(id)
				if err != nil && !errors.Is(err, errdefs.ErrNotFound) {
					t.Error(err)
					return
				}
				if err == nil && !bytes.Equal(b, frame) {
					t.Error("a reader saw a partial chunk")
					return
				}
			}
		})
	}
	wg.Wait()
}

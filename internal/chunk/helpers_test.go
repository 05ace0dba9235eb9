package chunk

import (
	"bytes"
	"context"
	"io"
	"io/fs"
	"math/rand/v2"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/spore-run/spore/internal/blob"
	"github.com/spore-run/spore/internal/blob/local"
)

func newStore(t testing.TB) *local.Store {
	t.Helper()
	s, err := local.Open(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	return s
}

// seed returns the test's random seed: CHUNK_TEST_SEED if set, else a new
// one; it is logged so a failure can be replayed.
func seed(t testing.TB) uint64 {
	t.Helper()
	s := uint64(time.Now().UnixNano())
	if v := os.Getenv("CHUNK_TEST_SEED"); v != "" {
		var err error
		if s, err = strconv.ParseUint(v, 10, 64); err != nil {
			t.Fatalf("CHUNK_TEST_SEED: %v", err)
		}
	}
	t.Logf("seed %d (CHUNK_TEST_SEED=%d to replay)", s, s)
	return s
}

func randBytes(r *rand.Rand, n int) []byte {
	b := make([]byte, n)
	for i := 0; i+8 <= n; i += 8 {
		v := r.Uint64()
		for j := range 8 {
			b[i+j] = byte(v >> (8 * j))
		}
	}
	for i := n - n%8; i < n; i++ {
		b[i] = byte(r.Uint32())
	}
	return b
}

// memoryImage returns n bytes that look like a memory image: 4 KiB pages,
// most zero, the rest random, in runs.
func memoryImage(r *rand.Rand, n int) []byte {
	b := make([]byte, n)
	const page = 4096
	for off := 0; off < n; {
		run := (1 + r.IntN(64)) * page
		if off+run > n {
			run = n - off
		}
		if r.IntN(100) < 40 { // 40 % of runs hold data
			copy(b[off:off+run], randBytes(r, run))
		}
		off += run
	}
	return b
}

func writeFile(t testing.TB, path string, data []byte) {
	t.Helper()
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(path, data, 0o644); err != nil {
		t.Fatal(err)
	}
}

// treeSnapshot describes a tree for comparison: path -> type, mode, content.
func treeSnapshot(t testing.TB, dir string) map[string]string {
	t.Helper()
	out := map[string]string{}
	err := filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(dir, p)
		if rel == "." {
			return nil
		}
		fi, err := os.Lstat(p)
		if err != nil {
			return err
		}
		desc := fi.Mode().String()
		switch {
		case fi.Mode().IsRegular():
			b, err := os.ReadFile(p)
			if err != nil {
				return err
			}
			desc += " " + Sum(b).String() + " " + strconv.Itoa(len(b))
		case fi.Mode()&fs.ModeSymlink != 0:
			target, _ := os.Readlink(p)
			desc += " -> " + target
		}
		out[rel] = desc
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return out
}

func keys(t testing.TB, s blob.Store, prefix string) []string {
	t.Helper()
	var ks []string
	if err := s.List(context.Background(), prefix, func(i blob.Info) error {
		ks = append(ks, i.Key)
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	sort.Strings(ks)
	return ks
}

// age sets an object's modification time into the past (the local store's
// Modified is its file's mtime), as if it had been written long ago.
func age(t testing.TB, s *local.Store, key string, by time.Duration) {
	t.Helper()
	p, err := s.Path(key)
	if err != nil {
		t.Fatal(err)
	}
	old := time.Now().Add(-by)
	if err := os.Chtimes(p, old, old); err != nil {
		t.Fatal(err)
	}
}

// flipByte flips one byte in the middle of a file.
func flipByte(t testing.TB, path string) {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	b[len(b)/2] ^= 0xff
	if err := os.WriteFile(path, b, 0o600); err != nil {
		t.Fatal(err)
	}
}

// failingStore fails Puts of chunks after the first n (a crash midway).
type failingStore struct {
	blob.Store
	mu sync.Mutex
	n  int
}

func (f *failingStore) Put(ctx context.Context, key string, r io.Reader, size int64) error {
	if bytes.HasPrefix([]byte(key), []byte("chunks/")) {
		f.mu.Lock()
		ok := f.n > 0
		f.n--
		f.mu.Unlock()
		if !ok {
			return os.ErrDeadlineExceeded
		}
	}
	return f.Store.Put(ctx, key, r, size)
}

package chunk

import (
	"bytes"
	"context"
	"math/rand/v2"
	"os"
	"path/filepath"
	"syscall"
	"testing"
	"time"
)

// sparseFile writes a file of size bytes with data at each of the given
// offsets (64 KiB of random bytes each) and holes elsewhere.
func sparseFile(t testing.TB, path string, size int64, r *rand.Rand, at ...int64) {
	t.Helper()
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		t.Fatal(err)
	}
	f, err := os.Create(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if err := f.Truncate(size); err != nil {
		t.Fatal(err)
	}
	for _, off := range at {
		if _, err := f.WriteAt(randBytes(r, 64<<10), off); err != nil {
			t.Fatal(err)
		}
	}
}

// A file of mostly holes (a volume's image) packs as its data and zero
// chunks for its holes, never read: the manifest is the file's bytes
// (with the chunks the data makes), the store holds the data and one
// zero chunk per size, and it unpacks to the same bytes, sparse. A short
// hole is read as zeros. Before, the pack read and hashed every byte of
// the holes (a 10 GiB volume image: tens of seconds).
func TestSparseFilesPackAsTheirData(t *testing.T) {
	ctx := context.Background()
	r := rand.New(rand.NewPCG(seed(t), 2))
	dir := filepath.Join(t.TempDir(), "tree")
	const size = 8 << 30 // 8 GiB, nearly all hole
	sparseFile(t, filepath.Join(dir, "vol.img"), size, r, 0, 1<<30+12345, size-64<<10)
	// Data with a hole shorter than MinHole inside: read as zeros.
	sparseFile(t, filepath.Join(dir, "short.img"), 3<<20, r, 0, 2<<20)
	store := newStore(t)
	t0 := time.Now()
	m, st, err := Pack(ctx, dir, store, PackOptions{ID: "sparse"})
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("packed %d bytes (%d stored, %d chunks) in %v", st.TotalBytes, st.StoredBytes, st.NewChunks, time.Since(t0))
	var vol Entry
	for _, e := range m.Entries {
		if e.Path == "vol.img" {
			vol = e
		}
	}
	if vol.Size != size {
		t.Fatalf("vol.img has size %d in the manifest, want %d", vol.Size, size)
	}
	zeros, data := 0, int64(0)
	for _, c := range vol.Chunks {
		if isZeroChunk(c) {
			zeros++
		} else {
			data += c.Size
		}
	}
	// The data is 3 x 64 KiB; each stretch is cut on its own, so the
	// non-zero chunks cover it and the blocks around it (4 KiB each way),
	// not the zeros a chunk of MinChunk or more would take in.
	if data > 3*(72<<10) || zeros < size/MinChunk-8 {
		t.Fatalf("vol.img: %d bytes in data chunks, %d zero chunks: want its data alone read", data, zeros)
	}
	if st.NewChunks > 10 {
		t.Fatalf("%d chunks stored for 3 stretches of data and the holes", st.NewChunks)
	}

	out := filepath.Join(t.TempDir(), "out")
	if _, err := Unpack(ctx, m, out, &Tiered{Store: store}, UnpackOptions{}); err != nil {
		t.Fatal(err)
	}
	for _, name := range []string{"vol.img", "short.img"} {
		a, b := filepath.Join(dir, name), filepath.Join(out, name)
		if !sameBytes(t, a, b) {
			t.Fatalf("%s differs after the round trip", name)
		}
	}
	var sb syscall.Stat_t
	if err := syscall.Stat(filepath.Join(out, "vol.img"), &sb); err != nil || sb.Blocks*512 > 64<<20 {
		t.Fatalf("unpacked vol.img takes %d bytes on disk (%v): want it sparse", sb.Blocks*512, err)
	}
}

// sameBytes compares two files, skipping their holes' zeros quickly.
func sameBytes(t *testing.T, a, b string) bool {
	t.Helper()
	fa, err := os.Open(a)
	if err != nil {
		t.Fatal(err)
	}
	defer fa.Close()
	fb, err := os.Open(b)
	if err != nil {
		t.Fatal(err)
	}
	defer fb.Close()
	ia, _ := fa.Stat()
	ib, _ := fb.Stat()
	if ia.Size() != ib.Size() {
		return false
	}
	ba, bb := make([]byte, 4<<20), make([]byte, 4<<20)
	for off := int64(0); off < ia.Size(); {
		// Only the stretches the source has data in (its holes are zero
		// in both unless the copy has data there: checked below).
		next, _, ok := nextHole(fa, off, ia.Size())
		end := ia.Size()
		if ok {
			end = next
		}
		for off < end {
			n := min(int64(len(ba)), end-off)
			fa.ReadAt(ba[:n], off)
			fb.ReadAt(bb[:n], off)
			if !bytes.Equal(ba[:n], bb[:n]) {
				return false
			}
			off += n
		}
		if ok {
			_, he, _ := nextHole(fa, next, ia.Size())
			// The copy holds zeros there: sample its start and end.
			for _, o := range []int64{next, he - 4096} {
				fb.ReadAt(bb[:4096], o)
				if !bytes.Equal(bb[:4096], make([]byte, 4096)) {
					return false
				}
			}
			off = he
		}
	}
	return true
}

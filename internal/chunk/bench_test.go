package chunk

// Benchmarks (go test -run '^$' -bench . -benchtime 1x ./internal/chunk):
// Pack and Unpack throughput on 256 MiB of memory-image-like data against
// the local blob store, and the dedupe ratio over 10 successive snapshots
// of a tree an agent edits.

import (
	"context"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"testing"
)

const benchImage = 256 << 20

func benchTree(b *testing.B) string {
	b.Helper()
	dir := filepath.Join(b.TempDir(), "img")
	r := rand.New(rand.NewPCG(42, 42))
	writeFile(b, filepath.Join(dir, "pages.img"), memoryImage(r, benchImage))
	writeFile(b, filepath.Join(dir, "checkpoint.img"), randBytes(r, 2<<20))
	return dir
}

func BenchmarkPack(b *testing.B) {
	dir := benchTree(b)
	ctx := context.Background()
	b.SetBytes(benchImage + 2<<20)
	b.ResetTimer()
	var st Stats
	for i := range b.N {
		store := newStore(b) // a fresh store: every chunk is new
		var err error
		if _, st, err = Pack(ctx, dir, store, PackOptions{ID: fmt.Sprintf("b%d", i)}); err != nil {
			b.Fatal(err)
		}
	}
	b.ReportMetric(float64(st.StoredBytes)/float64(st.TotalBytes), "stored/raw")
}

func BenchmarkUnpack(b *testing.B) {
	dir := benchTree(b)
	ctx := context.Background()
	store := newStore(b)
	m, _, err := Pack(ctx, dir, store, PackOptions{ID: "u"})
	if err != nil {
		b.Fatal(err)
	}
	for _, tier := range []string{"store", "cache"} {
		b.Run(tier, func(b *testing.B) {
			cache, err := OpenCache(b.TempDir(), 1<<30)
			if err != nil {
				b.Fatal(err)
			}
			src := &Tiered{Store: store}
			if tier == "cache" {
				src = &Tiered{Cache: cache, Store: store}
				if _, err := Unpack(ctx, m, filepath.Join(b.TempDir(), "warm"), src, UnpackOptions{}); err != nil {
					b.Fatal(err)
				}
			}
			b.SetBytes(m.TotalBytes())
			b.ResetTimer()
			for i := range b.N {
				out := filepath.Join(b.TempDir(), fmt.Sprint("out", i))
				if _, err := Unpack(ctx, m, out, src, UnpackOptions{}); err != nil {
					b.Fatal(err)
				}
				b.StopTimer()
				os.RemoveAll(out)
				b.StartTimer()
			}
		})
	}
}

// An agent's working tree: 200 files of 4-400 KiB (source-like: text that
// compresses) plus a 64 MiB memory image; each snapshot the agent edits 5
// files, adds one and dirties 2 % of the image's pages in a few runs.
func BenchmarkDedupeSnapshots(b *testing.B) {
	ctx := context.Background()
	for range b.N {
		r := rand.New(rand.NewPCG(7, 7))
		dir := filepath.Join(b.TempDir(), "tree")
		text := func(n int) []byte {
			words := []string{"func", "return", "if", "err", "nil", "ctx", "for", "range", "the", "agent", "file", "x", "\n", "\t"}
			var out []byte
			for len(out) < n {
				out = append(out, words[r.IntN(len(words))]...)
				out = append(out, ' ')
			}
			return out[:n]
		}
		for i := range 200 {
			writeFile(b, filepath.Join(dir, "src", fmt.Sprintf("f%03d.go", i)), text(4<<10+r.IntN(400<<10)))
		}
		img := memoryImage(r, 64<<20)
		writeFile(b, filepath.Join(dir, "pages.img"), img)

		store := newStore(b)
		var first, total, later int64
		for snap := range 10 {
			if snap > 0 {
				for range 5 {
					p := filepath.Join(dir, "src", fmt.Sprintf("f%03d.go", r.IntN(200)))
					old, _ := os.ReadFile(p)
					at := r.IntN(len(old))
					edited := append(append(append([]byte(nil), old[:at]...), text(200)...), old[at:]...)
					writeFile(b, p, edited)
				}
				writeFile(b, filepath.Join(dir, "src", fmt.Sprintf("new%d.go", snap)), text(20<<10))
				for range 4 { // 4 runs of 80 pages: ~2 % of 16k pages
					at := r.IntN(len(img)/4096-80) * 4096
					copy(img[at:], randBytes(r, 80*4096))
				}
				writeFile(b, filepath.Join(dir, "pages.img"), img)
			}
			_, st, err := Pack(ctx, dir, store, PackOptions{ID: fmt.Sprintf("s%d", snap)})
			if err != nil {
				b.Fatal(err)
			}
			if snap == 0 {
				first = st.StoredBytes
			} else {
				later += st.StoredBytes
			}
			total += st.TotalBytes
		}
		stored := first + later
		b.ReportMetric(float64(total)/float64(stored), "raw/stored")
		b.ReportMetric(float64(later)/9/float64(first)*100, "%-of-first-per-later-snapshot")
		b.ReportMetric(float64(later)/9, "stored-bytes-per-later-snapshot")
	}
}

package oci

import (
	"context"
	"crypto/rand"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"testing"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/remote"
)

// BenchmarkPullUnpack pulls and unpacks a ~100 MB image (4 layers of 5
// random, incompressible 5 MiB files) from the in-process registry, next to
// the registry's raw transfer of the same blobs; the MB/s of each says what
// unpacking (decompress, verify both digests, write, chown/chmod/utimes)
// costs over the download. "ensure" adds the Store's syncfs and rename.
//
//	go test -run '^$' -bench BenchmarkPullUnpack -benchtime 5x ./internal/oci/
func BenchmarkPullUnpack(b *testing.B) {
	mustRoot(b)
	const layers, files, fileSize = 4, 5, 5 << 20
	r := newRegistry(b)
	var ls []v1.Layer
	for l := range layers {
		var ents []ent
		for f := range files {
			data := make([]byte, fileSize)
			rand.Read(data)
			ents = append(ents, file(fmt.Sprintf("layer%d/file%d", l, f), string(data), 0o644))
		}
		ls = append(ls, layerOf(b, ents...))
	}
	ref := r.push(b, "bench:v1", imageOf(b, "linux/amd64", ls...))
	var blobBytes int64
	var digests []v1.Hash
	for _, l := range ls {
		d, _ := l.Digest()
		n, _ := l.Size()
		digests = append(digests, d)
		blobBytes += n
	}
	ctx := context.Background()
	work := b.TempDir()

	b.Run("raw", func(b *testing.B) {
		b.SetBytes(blobBytes)
		repo := mustRef(b, ref).Context()
		for b.Loop() {
			for _, d := range digests {
				l, err := remote.Layer(repo.Digest(d.String()), remote.WithContext(ctx))
				if err != nil {
					b.Fatal(err)
				}
				rc, err := l.Compressed()
				if err != nil {
					b.Fatal(err)
				}
				if _, err := io.Copy(io.Discard, rc); err != nil {
					b.Fatal(err)
				}
				rc.Close()
			}
		}
	})
	b.Run("pull+unpack", func(b *testing.B) {
		b.SetBytes(blobBytes)
		i := 0
		for b.Loop() {
			img, err := Pull(ctx, ref, local)
			if err != nil {
				b.Fatal(err)
			}
			dir := filepath.Join(work, fmt.Sprint("u", i))
			i++
			if err := os.Mkdir(dir, 0o755); err != nil {
				b.Fatal(err)
			}
			if _, err := Unpack(ctx, img, dir, Limits{}); err != nil {
				b.Fatal(err)
			}
			b.StopTimer()
			os.RemoveAll(dir)
			b.StartTimer()
		}
	})
	b.Run("ensure", func(b *testing.B) {
		b.SetBytes(blobBytes)
		i := 0
		for b.Loop() {
			s := &Store{Dir: filepath.Join(work, fmt.Sprint("s", i)), Log: slog.New(slog.DiscardHandler)}
			i++
			img, err := Pull(ctx, ref, local)
			if err != nil {
				b.Fatal(err)
			}
			if _, err := s.Ensure(ctx, img); err != nil {
				b.Fatal(err)
			}
			b.StopTimer()
			os.RemoveAll(s.Dir)
			b.StartTimer()
		}
	})
}

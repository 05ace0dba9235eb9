package snapsync_test

import (
	"context"
	"crypto/rand"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/spore-run/spore/internal/blob/s3"
	"github.com/spore-run/spore/internal/chunk"
	"github.com/spore-run/spore/internal/snapshot"
	"github.com/spore-run/spore/internal/snapsync"
	"github.com/spore-run/spore/internal/testenv"
)

// BenchmarkS3 uploads and fetches a snapshot of 128 MiB of random memory
// through a versitygw bucket (real tier), reporting MB/s beside nothing
// else: run with -cpuprofile to see where a transfer's time goes.
//
//	go test -run '^$' -bench S3 -benchtime 3x ./internal/snapsync/
func BenchmarkS3(b *testing.B) {
	srv := testenv.S3(b)
	ctx := context.Background()
	store, err := s3.New(ctx, s3.Config{Endpoint: srv.Endpoint, Region: srv.Region, Bucket: srv.Bucket, PathStyle: true,
		AccessKeyID: srv.AccessKey, SecretAccessKey: srv.SecretKey})
	if err != nil {
		b.Fatal(err)
	}
	const size = 128 << 20
	mem := make([]byte, size)
	rand.Read(mem)
	var up, down time.Duration
	for i := range b.N {
		dir := b.TempDir()
		repo, err := snapshot.Open(filepath.Join(dir, "a"))
		if err != nil {
			b.Fatal(err)
		}
		stg, err := repo.Stage(snapID(i))
		if err != nil {
			b.Fatal(err)
		}
		mem[0] = byte(i) // a new first chunk each round; the rest dedupes against round 0
		if err := os.WriteFile(filepath.Join(stg.ImageDir(), "pages.img"), mem, 0o600); err != nil {
			b.Fatal(err)
		}
		if _, err := stg.Commit(snapshot.Manifest{Kind: snapshot.KindSnapshot, RootFS: "base", RootFSID: "b1", Runtime: "r"}, snapshot.CommitOptions{}); err != nil {
			b.Fatal(err)
		}
		ca, _ := chunk.OpenCache(filepath.Join(dir, "ca"), 1<<30)
		sa, _ := snapsync.New(snapsync.Config{Repo: repo, Store: store, Cache: ca, Runtime: "r"})
		// Round 0 measures a cold upload; later rounds would mostly dedupe,
		// so their upload goes to a fresh prefix-less copy of the data.
		if i > 0 {
			rand.Read(mem[1:])
			os.WriteFile(filepath.Join(repo.ImageDir(snapID(i)), "pages.img"), mem, 0o600)
		}
		t0 := time.Now()
		if _, err := sa.Upload(ctx, snapID(i)); err != nil {
			b.Fatal(err)
		}
		up += time.Since(t0)
		repoB, _ := snapshot.Open(filepath.Join(dir, "b"))
		cb, _ := chunk.OpenCache(filepath.Join(dir, "cb"), 1<<30)
		sb, _ := snapsync.New(snapsync.Config{Repo: repoB, Store: store, Cache: cb, Runtime: "r"})
		t0 = time.Now()
		if _, err := sb.Ensure(ctx, snapID(i), nil); err != nil {
			b.Fatal(err)
		}
		down += time.Since(t0)
	}
	mb := float64(size) / 1e6 * float64(b.N)
	b.ReportMetric(mb/up.Seconds(), "upload-MB/s")
	b.ReportMetric(mb/down.Seconds(), "fetch-MB/s")
}

func snapID(i int) string { return "sbench" + string(rune('a'+i)) }

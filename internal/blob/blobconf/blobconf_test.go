package blobconf_test

import (
	"context"
	"path/filepath"
	"testing"

	"github.com/spore-run/spore/internal/blob/blobconf"
	"github.com/spore-run/spore/internal/blob/local"
	"github.com/spore-run/spore/internal/blob/s3"
	"github.com/spore-run/spore/internal/errdefs"
)

func TestOpen(t *testing.T) {
	ctx := context.Background()
	for _, spec := range []string{"", "none"} {
		if st, err := blobconf.Open(ctx, spec); st != nil || err != nil {
			t.Fatalf("%q: %v %v, want no store", spec, st, err)
		}
	}
	dir := t.TempDir()
	for _, spec := range []string{filepath.Join(dir, "a"), "file://" + filepath.Join(dir, "b")} {
		st, err := blobconf.Open(ctx, spec)
		if err != nil {
			t.Fatalf("%q: %v", spec, err)
		}
		if _, ok := st.(*local.Store); !ok {
			t.Fatalf("%q: %T, want a directory store", spec, st)
		}
	}
	st, err := blobconf.Open(ctx, "s3://bucket/some/prefix?endpoint=http://127.0.0.1:9&region=eu-west-1")
	if err != nil {
		t.Fatal(err)
	}
	if _, ok := st.(*s3.Store); !ok {
		t.Fatalf("%T, want an S3 store", st)
	}
	for _, bad := range []string{
		"relative/dir", "file://host/x", "file://relative", "s3://", "s3://b?colour=red",
		"s3://key:secret@bucket", "s3://b?path-style=maybe", "ftp://x/y",
	} {
		if _, err := blobconf.Open(ctx, bad); !errdefs.IsInvalidArgument(err) {
			t.Errorf("%q: %v, want invalid argument", bad, err)
		}
	}
}

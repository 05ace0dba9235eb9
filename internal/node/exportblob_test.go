package node_test

import (
	"archive/tar"
	"context"
	"io"
	"os"
	"path/filepath"
	"testing"

	"github.com/google/go-containerregistry/pkg/v1/layout"
	"github.com/google/go-containerregistry/pkg/v1/random"

	"github.com/spore-run/spore/internal/blob/local"
	"github.com/spore-run/spore/internal/node"
	"github.com/spore-run/spore/internal/oci"
)

// TestPutLayoutTar: an OCI layout stored as one tar in a (local) blob
// store is the layout: its size as promised, only relative names of
// files and directories, and unpacked it opens as the same image.
func TestPutLayoutTar(t *testing.T) {
	ctx := context.Background()
	img, err := random.Image(3000, 2)
	if err != nil {
		t.Fatal(err)
	}
	src := filepath.Join(t.TempDir(), "layout")
	digest, err := oci.WriteLayout(src, img, "")
	if err != nil {
		t.Fatal(err)
	}
	st, err := local.Open(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	size, err := node.PutLayoutTar(ctx, st, "exports/x1.tar", src)
	if err != nil {
		t.Fatal(err)
	}
	info, err := st.Stat(ctx, "exports/x1.tar")
	if err != nil || info.Size != size {
		t.Fatalf("stat: %+v, %v; want size %d", info, err, size)
	}
	rc, err := st.Get(ctx, "exports/x1.tar")
	if err != nil {
		t.Fatal(err)
	}
	defer rc.Close()
	dst := t.TempDir()
	tr := tar.NewReader(rc)
	names := map[string]bool{}
	for {
		h, err := tr.Next()
		if err == io.EOF {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		names[h.Name] = true
		if filepath.IsAbs(h.Name) || !filepath.IsLocal(h.Name) {
			t.Fatalf("entry %q is not a local name", h.Name)
		}
		p := filepath.Join(dst, h.Name)
		switch h.Typeflag {
		case tar.TypeDir:
			if err := os.MkdirAll(p, 0o755); err != nil {
				t.Fatal(err)
			}
		case tar.TypeReg:
			b, _ := io.ReadAll(tr)
			if err := os.WriteFile(p, b, 0o644); err != nil {
				t.Fatal(err)
			}
		default:
			t.Fatalf("entry %q of type %q", h.Name, h.Typeflag)
		}
	}
	for _, n := range []string{"oci-layout", "index.json", "blobs/", "blobs/sha256/", "blobs/sha256/" + digest.Hex} {
		if !names[n] {
			t.Fatalf("tar has no %s: %v", n, names)
		}
	}
	p, err := layout.FromPath(dst)
	if err != nil {
		t.Fatal(err)
	}
	got, err := p.Image(digest)
	if err != nil {
		t.Fatal(err)
	}
	layers, err := got.Layers()
	if err != nil || len(layers) != 2 {
		t.Fatalf("layers: %d, %v", len(layers), err)
	}
	if _, err := node.PutLayoutTar(ctx, st, "../x.tar", src); err == nil {
		t.Fatal("a malformed key was accepted")
	}
}

package oci

import (
	"archive/tar"
	"bufio"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"hash"
	"io"
	"os"
	"time"

	"github.com/google/go-containerregistry/pkg/name"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/layout"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/remote"
	"github.com/google/go-containerregistry/pkg/v1/types"
	"github.com/klauspost/compress/gzip"

	"github.com/spore-run/spore/internal/errdefs"
)

// FileLayer is a gzip-compressed tar layer kept in a file whose digests
// are known (LayerBuilder computed them while writing it), so using it
// reads the file once, to send it.
type FileLayer struct {
	Path           string
	Digest_        v1.Hash `json:"digest"`
	DiffID_        v1.Hash `json:"diff_id"`
	Size_          int64   `json:"size"`
	UncompressedSz int64   `json:"uncompressed_size"`
}

var _ v1.Layer = (*FileLayer)(nil)

func (l *FileLayer) Digest() (v1.Hash, error)            { return l.Digest_, nil }
func (l *FileLayer) DiffID() (v1.Hash, error)            { return l.DiffID_, nil }
func (l *FileLayer) Size() (int64, error)                { return l.Size_, nil }
func (l *FileLayer) MediaType() (types.MediaType, error) { return types.OCILayer, nil }
func (l *FileLayer) Compressed() (io.ReadCloser, error)  { return os.Open(l.Path) }
func (l *FileLayer) Uncompressed() (io.ReadCloser, error) {
	f, err := os.Open(l.Path)
	if err != nil {
		return nil, err
	}
	zr, err := gzip.NewReader(bufio.NewReaderSize(f, 1<<20))
	if err != nil {
		f.Close()
		return nil, err
	}
	return struct {
		io.Reader
		io.Closer
	}{zr, f}, nil
}

// LayerBuilder writes a tar layer into a gzip file, hashing the tar (the
// diffID) and the file (the digest) on the way.
type LayerBuilder struct {
	Tar    *tar.Writer
	f      *os.File
	buf    *bufio.Writer
	zw     *gzip.Writer
	diffID hash.Hash
	digest hash.Hash
	raw    counter
	comp   counter
}

type counter struct {
	w io.Writer
	n int64
}

func (c *counter) Write(b []byte) (int, error) {
	n, err := c.w.Write(b)
	c.n += int64(n)
	return n, err
}

// NewLayerBuilder creates the layer file at path (it must not exist).
func NewLayerBuilder(path string) (*LayerBuilder, error) {
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o600)
	if err != nil {
		return nil, err
	}
	b := &LayerBuilder{f: f, diffID: sha256.New(), digest: sha256.New()}
	b.buf = bufio.NewWriterSize(f, 1<<20)
	b.comp.w = io.MultiWriter(b.buf, b.digest)
	b.zw, _ = gzip.NewWriterLevel(&b.comp, gzip.DefaultCompression)
	b.raw.w = io.MultiWriter(b.zw, b.diffID)
	b.Tar = tar.NewWriter(&b.raw)
	return b, nil
}

// Close ends the tar and the file (synced) and returns the layer. Abort
// instead on failure.
func (b *LayerBuilder) Close() (*FileLayer, error) {
	err := b.Tar.Close()
	if err == nil {
		err = b.zw.Close()
	}
	if err == nil {
		err = b.buf.Flush()
	}
	if err == nil {
		err = b.f.Sync()
	}
	if cerr := b.f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		os.Remove(b.f.Name())
		return nil, err
	}
	return &FileLayer{
		Path:           b.f.Name(),
		Digest_:        v1.Hash{Algorithm: "sha256", Hex: hex.EncodeToString(b.digest.Sum(nil))},
		DiffID_:        v1.Hash{Algorithm: "sha256", Hex: hex.EncodeToString(b.diffID.Sum(nil))},
		Size_:          b.comp.n,
		UncompressedSz: b.raw.n,
	}, nil
}

// Abort removes the unfinished file.
func (b *LayerBuilder) Abort() {
	b.f.Close()
	os.Remove(b.f.Name())
}

// ImageConfig is what an exported image says about running it.
type ImageConfig struct {
	Env        []string
	User       string
	WorkingDir string
	Cmd        []string
	Created    time.Time
	// History: one comment per layer.
	History []string
}

// NewImage is an OCI image (OCI manifest and config media types) of the
// layers in order, for linux/amd64, with cfg.
func NewImage(layers []v1.Layer, cfg ImageConfig) (v1.Image, error) {
	img := mutate.MediaType(empty.Image, types.OCIManifestSchema1)
	img = mutate.ConfigMediaType(img, types.OCIConfigJSON)
	for i, l := range layers {
		add := mutate.Addendum{Layer: l, MediaType: types.OCILayer}
		if i < len(cfg.History) {
			add.History = v1.History{Created: v1.Time{Time: cfg.Created}, CreatedBy: "spore export", Comment: cfg.History[i]}
		}
		var err error
		if img, err = mutate.Append(img, add); err != nil {
			return nil, err
		}
	}
	cf, err := img.ConfigFile()
	if err != nil {
		return nil, err
	}
	cf = cf.DeepCopy()
	cf.OS, cf.Architecture = "linux", "amd64"
	cf.Created = v1.Time{Time: cfg.Created}
	cf.Config.Env, cf.Config.User, cf.Config.WorkingDir, cf.Config.Cmd = cfg.Env, cfg.User, cfg.WorkingDir, cfg.Cmd
	return mutate.ConfigFile(img, cf)
}

// Push writes img to the registry as ref ("registry/repo:tag") and returns
// the manifest digest. Errors are classified as Pull's: a malformed
// reference or a plain-HTTP registry without o.Insecure is
// ErrInvalidArgument, refused credentials ErrUnauthorized, a connection
// the transport's Floor refused ErrFloor (and ErrInvalidArgument), an
// unreachable registry ErrUnavailable.
func Push(ctx context.Context, ref string, img v1.Image, o Options) (v1.Hash, error) {
	var nopts []name.Option
	if o.Insecure {
		nopts = append(nopts, name.Insecure)
	}
	r, err := name.ParseReference(ref, nopts...)
	if err != nil {
		return v1.Hash{}, errdefs.Invalidf("image reference %q: %v", ref, err)
	}
	want, err := parsePlatform("")
	if err != nil {
		return v1.Hash{}, err
	}
	ropts, err := remoteOptions(ctx, o, want)
	if err != nil {
		return v1.Hash{}, err
	}
	if err := remote.Write(r, img, ropts...); err != nil {
		return v1.Hash{}, classify(ctx, r.String(), err)
	}
	return img.Digest()
}

// WriteLayout writes img as an OCI image layout in dir (which must not
// exist, or be empty), its index entry annotated with refName
// (org.opencontainers.image.ref.name) when set.
func WriteLayout(dir string, img v1.Image, refName string) (v1.Hash, error) {
	p, err := layout.Write(dir, empty.Index)
	if err != nil {
		return v1.Hash{}, fmt.Errorf("OCI layout %s: %w", dir, err)
	}
	var opts []layout.Option
	if refName != "" {
		opts = append(opts, layout.WithAnnotations(map[string]string{"org.opencontainers.image.ref.name": refName}))
	}
	if err := p.AppendImage(img, opts...); err != nil {
		return v1.Hash{}, fmt.Errorf("OCI layout %s: %w", dir, err)
	}
	return img.Digest()
}

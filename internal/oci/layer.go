package oci

import (
	"archive/tar"
	"bufio"
	"bytes"
	"context"
	"crypto/sha256"
	"errors"
	"fmt"
	"hash"
	"io"
	"net"
	"syscall"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/types"
	"github.com/klauspost/compress/gzip"
	"github.com/klauspost/compress/zstd"

	"github.com/spore-run/spore/internal/errdefs"
)

// okLayerTypes are the tar layers; foreign and non-distributable ones are
// refused (they are fetched from elsewhere, or not at all).
var okLayerTypes = map[types.MediaType]bool{
	types.DockerLayer: true, types.DockerUncompressedLayer: true,
	types.OCILayer: true, types.OCILayerZStd: true, types.OCIUncompressedLayer: true,
}

func (u *unpacker) layer(i int, l v1.Layer, diffID v1.Hash) error {
	mt, err := l.MediaType()
	if err != nil {
		return classify(u.ctx, fmt.Sprintf("layer %d", i), err)
	}
	if !okLayerTypes[mt] {
		return errdefs.Invalidf("layer %d: media type %s is not a layer Spore unpacks", i, mt)
	}
	digest, err := l.Digest()
	if err != nil {
		return classify(u.ctx, fmt.Sprintf("layer %d", i), err)
	}
	name := fmt.Sprintf("layer %d (%s)", i, digest)
	rc, err := l.Compressed()
	if err != nil {
		return classify(u.ctx, name, err)
	}
	defer rc.Close()
	// Download, decompression and the registry client's digest check (at
	// EOF) run in a producer goroutine; the diffID hash, tar parsing and
	// writes here: one hash on each side keeps two cores equally busy.
	comp := &recordingReader{r: ctxReader{u.ctx, rc}}
	uh := sha256.New()
	pr, pw := io.Pipe()
	produced := make(chan error, 1)
	go func() {
		err := produce(comp, pw, u.pbuf)
		pw.CloseWithError(err) // nil: the consumer sees EOF
		produced <- err
	}()
	in := &recordingReader{r: io.TeeReader(pr, uh)}
	cerr, verdict := u.consume(name, tar.NewReader(in))
	if cerr == nil {
		// Past the tar end marker: padding still counts in the diffID, and
		// this waits for the producer's end.
		_, cerr = io.CopyBuffer(io.Discard, in, u.buf)
	}
	pr.CloseWithError(errStop) // unblocks the producer if we stopped early
	perr := <-produced
	switch {
	case perr != nil && !errors.Is(perr, errStop):
		return u.streamError(name, perr, comp)
	case cerr != nil && verdict:
		return cerr
	case cerr != nil:
		return u.streamError(name, cerr, comp) // a malformed tar stream
	}
	if got := hashOf(uh); got != diffID {
		return fmt.Errorf("%w: %s: uncompressed digest is %s, the configuration says %s",
			errdefs.ErrDataLoss, name, got, diffID)
	}
	return nil
}

// errStop tells the producer the consumer has stopped reading.
var errStop = errors.New("unpack stopped")

// produce decompresses comp into w, then reads comp to its end so the
// registry client verifies the blob's digest.
func produce(comp io.Reader, w io.Writer, buf []byte) error {
	plain, closeDec, err := decompress(bufio.NewReaderSize(comp, 1<<20))
	if err != nil {
		return err
	}
	defer closeDec()
	if _, err := io.CopyBuffer(w, plain, buf); err != nil {
		return err
	}
	_, err = io.CopyBuffer(io.Discard, comp, buf)
	return err
}

// consume applies the entries of one layer. verdict reports an error
// about an entry (ours to report as is) rather than about the stream.
func (u *unpacker) consume(name string, tr *tar.Reader) (err error, verdict bool) {
	u.written = map[string]bool{}
	for {
		hdr, err := tr.Next()
		if err == io.EOF {
			return nil, false
		}
		if err != nil {
			return err, false
		}
		if err := u.entry(hdr, tr); err != nil {
			var rerr *readError
			if errors.As(err, &rerr) {
				return rerr.err, false
			}
			return fmt.Errorf("%s: %s: %w", name, hdr.Name, err), true
		}
	}
}

// streamError classifies a failure to read or decode a layer stream. It
// reads the rest of the compressed blob (bounded by its size in the
// manifest): the registry client fails that read if the blob does not
// match its digest, so a clean EOF means the blob is authentic but
// malformed.
func (u *unpacker) streamError(name string, err error, comp *recordingReader) error {
	if u.ctx.Err() != nil {
		return u.ctx.Err()
	}
	if comp.err == nil {
		_, _ = io.CopyBuffer(io.Discard, comp, u.buf)
	}
	switch {
	case comp.err == nil:
		return fmt.Errorf("%w: %s: not a valid layer: %v", errdefs.ErrInvalidArgument, name, err)
	case errors.Is(comp.err, context.Canceled) || errors.Is(comp.err, context.DeadlineExceeded):
		return comp.err
	case isNetErr(comp.err):
		return fmt.Errorf("%w: %s: %v", errdefs.ErrUnavailable, name, comp.err)
	default:
		return fmt.Errorf("%w: %s: blob does not match its digest: %v", errdefs.ErrDataLoss, name, comp.err)
	}
}

func isNetErr(err error) bool {
	var ne net.Error
	return errors.As(err, &ne) || errors.Is(err, io.ErrUnexpectedEOF) ||
		errors.Is(err, syscall.ECONNRESET) || errors.Is(err, syscall.EPIPE)
}

func hashOf(h hash.Hash) v1.Hash {
	return v1.Hash{Algorithm: "sha256", Hex: fmt.Sprintf("%x", h.Sum(nil))}
}

// decompress picks the decoder from the stream's magic number, as the
// registry client does: media types lie more often than magic numbers.
func decompress(br *bufio.Reader) (io.Reader, func(), error) {
	magic, err := br.Peek(4)
	if err != nil && err != io.EOF {
		return nil, nil, err
	}
	switch {
	case bytes.HasPrefix(magic, []byte{0x1f, 0x8b}):
		zr, err := gzip.NewReader(br)
		if err != nil {
			return nil, nil, err
		}
		return zr, func() { zr.Close() }, nil
	case bytes.HasPrefix(magic, []byte{0x28, 0xb5, 0x2f, 0xfd}):
		zr, err := zstd.NewReader(br, zstd.WithDecoderConcurrency(1))
		if err != nil {
			return nil, nil, err
		}
		return zr, zr.Close, nil
	default:
		return br, func() {}, nil
	}
}

// recordingReader remembers the first read error, to tell a broken input
// from a failing write.
type recordingReader struct {
	r   io.Reader
	err error
}

func (r *recordingReader) Read(p []byte) (int, error) {
	n, err := r.r.Read(p)
	if err != nil && err != io.EOF && r.err == nil {
		r.err = err
	}
	return n, err
}

// readError marks a failure to read the layer stream while writing a file.
type readError struct{ err error }

func (e *readError) Error() string { return e.err.Error() }
func (e *readError) Unwrap() error { return e.err }

type ctxReader struct {
	ctx context.Context
	r   io.Reader
}

func (c ctxReader) Read(p []byte) (int, error) {
	if err := c.ctx.Err(); err != nil {
		return 0, err
	}
	return c.r.Read(p)
}

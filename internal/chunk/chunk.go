// Package chunk stores directory trees (checkpoint images, template root
// filesystems) as content-addressed chunks in a blob.Store.
//
// Every regular file is cut by content-defined chunking (Rabin fingerprints,
// github.com/restic/chunker, with one fixed polynomial so every node cuts the
// same bytes at the same places: an insertion moves only the chunks around
// it). A chunk is named by the SHA-256 of its raw bytes and stored once,
// zstd-compressed, under chunks/<2 hex>/<64 hex>. A Manifest
// (manifests/<id>.json) lists the tree: entries with their chunks.
//
// Reading goes through tiers (Tiered): the node-local Cache, then peers
// (Peers, served by Handler from their caches), then the store. Every chunk
// is verified against its hash whichever tier it came from.
//
// GC deletes chunks no manifest names; the protocol that makes it safe
// beside concurrent Packs is described in gc.go and docs/storage.md.
package chunk

import (
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"io"
	"sync"

	"github.com/klauspost/compress/zstd"
	"github.com/restic/chunker"

	"github.com/spore-run/spore/internal/errdefs"
)

// The chunking parameters. They are part of the format: a node that cut
// with other values would produce other chunks (still correct, but nothing
// would dedupe against the rest of the fleet), so they are constants and
// recorded in every manifest.
//
// Sizes are tuned for memory images (hundreds of MiB, mostly 4 KiB pages):
//   - MinChunk 256 KiB: a run of zero pages has fingerprint 0 and is cut at
//     the minimum, so zero regions become many copies of one chunk; smaller
//     would multiply objects (each a PUT and a manifest row) for no gain.
//   - average ~768 KiB (MinChunk + 2^AvgBits): a 256 MiB image of data is
//     ~340 objects, so per-object store latency stays small beside
//     transfer time, while a 1 MiB edit or insertion rewrites ~2 MiB (the
//     chunk around a given byte averages ~1 MiB; with 2^20 it is ~2 MiB and
//     an insertion's cost varied up to 10 % of a 64 MiB file).
//   - MaxChunk 4 MiB: bounds the memory a chunk in flight takes (a few per
//     worker) and the bytes refetched when one is corrupt.
const (
	// Polynomial is the irreducible degree-53 polynomial of the Rabin
	// fingerprint (restic's test polynomial, checked irreducible by a test).
	Polynomial = chunker.Pol(0x3DA3358B4DC173)
	MinChunk   = 256 << 10
	AvgBits    = 19
	MaxChunk   = 4 << 20
)

// maxFrame bounds a stored (compressed) chunk: zstd's worst case for
// incompressible input is a few bytes per 128 KiB block over the input.
const maxFrame = MaxChunk + MaxChunk/64 + 1024

// ID is a chunk's SHA-256 (of its raw bytes).
type ID [sha256.Size]byte

// Sum returns the ID of raw.
func Sum(raw []byte) ID { return sha256.Sum256(raw) }

func (id ID) String() string { return hex.EncodeToString(id[:]) }

// Key is the blob key of the chunk.
func (id ID) Key() string {
	s := id.String()
	return "chunks/" + s[:2] + "/" + s
}

// MarshalText encodes the ID as lowercase hex.
func (id ID) MarshalText() ([]byte, error) { return []byte(id.String()), nil }

// UnmarshalText accepts exactly 64 lowercase hex digits.
func (id *ID) UnmarshalText(b []byte) error {
	p, err := ParseID(string(b))
	if err != nil {
		return err
	}
	*id = p
	return nil
}

// ParseID parses 64 lowercase hex digits (nothing else: IDs reach file
// names and URLs, so there is exactly one spelling of each).
func ParseID(s string) (ID, error) {
	var id ID
	if len(s) != 2*len(id) {
		return id, errdefs.Invalidf("chunk id %.80q: want %d hex digits", s, 2*len(id))
	}
	for i := 0; i < len(s); i++ {
		if c := s[i]; !(c >= '0' && c <= '9' || c >= 'a' && c <= 'f') {
			return id, errdefs.Invalidf("chunk id %.80q: not lowercase hex", s)
		}
	}
	_, _ = hex.Decode(id[:], []byte(s))
	return id, nil
}

// newChunker returns a chunker with the format's parameters.
func newChunker(r io.Reader) *chunker.Chunker {
	c := chunker.NewWithBoundaries(r, Polynomial, MinChunk, MaxChunk)
	c.SetAverageBits(AvgBits)
	return c
}

// The codec. zstd's encoder and decoder are safe for concurrent
// EncodeAll/DecodeAll, so one of each serves the process.
var (
	codecOnce sync.Once
	encoder   *zstd.Encoder
	decoder   *zstd.Decoder
)

func codec() (*zstd.Encoder, *zstd.Decoder) {
	codecOnce.Do(func() {
		var err error
		// SpeedFastest: images are mostly zero pages (compressed by any
		// level) and random-looking data (compressed by none); the CPU
		// goes to throughput instead. Decoding does not depend on it.
		encoder, err = zstd.NewWriter(nil, zstd.WithEncoderLevel(zstd.SpeedFastest),
			zstd.WithEncoderConcurrency(1), zstd.WithEncoderCRC(false))
		if err != nil {
			panic(err) // only invalid options fail
		}
		// DecodeAllCapLimit: a frame may not expand past the capacity we
		// give it (the manifest's raw size), whatever its header claims.
		decoder, err = zstd.NewReader(nil, zstd.WithDecoderConcurrency(0),
			zstd.WithDecodeAllCapLimit(true), zstd.WithDecoderMaxMemory(MaxChunk))
		if err != nil {
			panic(err)
		}
	})
	return encoder, decoder
}

// compress returns the stored form of raw.
func compress(raw []byte) []byte {
	enc, _ := codec()
	return enc.EncodeAll(raw, make([]byte, 0, len(raw)/2+64))
}

// open decodes a stored frame and checks it is chunk id of size raw bytes
// (size 0: any size up to MaxChunk). Any mismatch is errdefs.ErrDataLoss:
// the bytes are not the chunk.
func open(id ID, size int64, frame []byte) ([]byte, error) {
	if size < 0 || size > MaxChunk {
		return nil, errdefs.Invalidf("chunk %s: size %d outside (0, %d]", id, size, MaxChunk)
	}
	limit := size
	if limit == 0 {
		limit = MaxChunk
	}
	_, dec := codec()
	raw, err := dec.DecodeAll(frame, make([]byte, 0, limit))
	if err != nil {
		return nil, fmt.Errorf("%w: chunk %s: decode: %v", errdefs.ErrDataLoss, id, err)
	}
	if size != 0 && int64(len(raw)) != size || len(raw) == 0 {
		return nil, fmt.Errorf("%w: chunk %s: %d bytes, want %d", errdefs.ErrDataLoss, id, len(raw), size)
	}
	if Sum(raw) != id {
		return nil, fmt.Errorf("%w: chunk %s: content does not match its hash", errdefs.ErrDataLoss, id)
	}
	return raw, nil
}

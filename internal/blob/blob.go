// Package blob is the blob store contract: named, immutable objects that
// every node can reach. Snapshot chunks and manifests live there (see
// package chunk); a snapshot is durable once its objects are.
//
// Implementations: blob/local (a directory: the embedded default of
// `spore up`, and a node's view of a shared file system) and blob/s3 (any
// S3-compatible server). blob/blobtest is the conformance suite both pass.
package blob

import (
	"context"
	"io"
	"time"
)

// Store holds objects under keys.
//
// Keys are relative slash-separated paths of [a-z0-9._-] elements (no
// empty, "." or ".." element, no leading or trailing slash), at most 512
// bytes; anything else is errdefs.ErrInvalidArgument.
//
// A Put is atomic: readers see the whole new object or none of it (or the
// previous one), never a part, also when the writer dies midway. Errors
// carry kinds from internal/errdefs: a missing object is ErrNotFound; a
// server that cannot be reached is ErrUnavailable.
type Store interface {
	// Put stores size bytes read from r under key, replacing any object
	// there. A reader that ends early or fails fails the Put and leaves
	// the previous object (or none).
	Put(ctx context.Context, key string, r io.Reader, size int64) error
	// Get opens the object; the caller closes it.
	Get(ctx context.Context, key string) (io.ReadCloser, error)
	// GetRange opens length bytes of the object from offset (length < 0:
	// to the end). A range past the end is ErrInvalidArgument.
	GetRange(ctx context.Context, key string, offset, length int64) (io.ReadCloser, error)
	// Stat describes the object.
	Stat(ctx context.Context, key string) (Info, error)
	// Delete removes the object; a missing one is not an error.
	Delete(ctx context.Context, key string) error
	// List calls fn for each object whose key starts with prefix, in
	// lexical key order, until fn returns an error (which List returns).
	List(ctx context.Context, prefix string, fn func(Info) error) error
}

// Info describes one object.
type Info struct {
	Key  string
	Size int64
	// Modified is when the object was last written, by the store's clock.
	Modified time.Time
}

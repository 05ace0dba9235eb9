package chunk

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"path"
	"regexp"
	"strings"
	"time"

	"github.com/spore-run/spore/internal/blob"
	"github.com/spore-run/spore/internal/errdefs"
)

// FormatVersion is the manifest format this package writes and reads.
const FormatVersion = 1

// Entry types.
const (
	TypeDir     = "dir"
	TypeFile    = "file"
	TypeSymlink = "symlink"
	TypeChar    = "char"  // character device (a root filesystem's /dev/null)
	TypeBlock   = "block" // block device
	TypeFIFO    = "fifo"
)

// Manifest lists a directory tree. Entries are in lexical walk order, so
// a directory comes before what it holds.
type Manifest struct {
	Format   int      `json:"format"`
	ID       string   `json:"id"`
	Chunking Chunking `json:"chunking"`
	// Created is informational (the packing node's clock).
	Created time.Time `json:"created"`
	// Metadata is free-form (the runsc build and CPU features an image
	// needs, for the compatibility gate).
	Metadata map[string]string `json:"metadata,omitempty"`
	// Refs are the held manifests this one needs (a snapshot's root
	// filesystem tree and runtime build): GC keeps them while it exists.
	Refs []string `json:"refs,omitempty"`
	// Held: GC deletes this manifest once no manifest and no live pending
	// marker refers to it and it is older than the grace period (see
	// gc.go). Otherwise a manifest goes only by DeleteManifest.
	Held    bool    `json:"held,omitempty"`
	Entries []Entry `json:"entries"`
}

// Chunking records the parameters the files were cut with.
type Chunking struct {
	Polynomial string `json:"polynomial"`
	Min        int    `json:"min"`
	AvgBits    int    `json:"avg_bits"`
	Max        int    `json:"max"`
}

func currentChunking() Chunking {
	return Chunking{Polynomial: fmt.Sprintf("%#x", uint64(Polynomial)), Min: MinChunk, AvgBits: AvgBits, Max: MaxChunk}
}

// Entry is one file, directory, symlink or device of the tree.
type Entry struct {
	// Path is relative to the tree's root, slash-separated and clean.
	Path string `json:"path"`
	Type string `json:"type"`
	// Mode holds the permission bits plus setuid, setgid and sticky
	// (unix.S_ISUID... values, i.e. the low 12 bits of st_mode).
	Mode uint32 `json:"mode"`
	UID  int    `json:"uid"`
	GID  int    `json:"gid"`
	// Size is the file's length (files only).
	Size   int64 `json:"size,omitempty"`
	Chunks []Ref `json:"chunks,omitempty"`
	// Target is a symlink's target, stored as is (never followed).
	Target string `json:"target,omitempty"`
	// Rdev is a device's number (char and block only).
	Rdev uint64 `json:"rdev,omitempty"`
}

// Ref names one chunk of a file, in order.
type Ref struct {
	ID ID `json:"id"`
	// Size is the raw length; Stored the compressed (object) length.
	Size   int64 `json:"size"`
	Stored int64 `json:"stored"`
}

// TotalBytes is the sum of the file sizes.
func (m *Manifest) TotalBytes() int64 {
	var n int64
	for _, e := range m.Entries {
		n += e.Size
	}
	return n
}

// ChunkIDs returns the distinct chunks the manifest names.
func (m *Manifest) ChunkIDs() map[ID]Ref {
	ids := map[ID]Ref{}
	for _, e := range m.Entries {
		for _, r := range e.Chunks {
			ids[r.ID] = r
		}
	}
	return ids
}

var manifestIDRE = regexp.MustCompile(`^[a-z0-9][a-z0-9._-]{0,127}$`)

// CheckManifestID accepts IDs that make a valid blob key element.
func CheckManifestID(id string) error {
	if !manifestIDRE.MatchString(id) {
		return errdefs.Invalidf("manifest id %.140q: want [a-z0-9][a-z0-9._-]{0,127}", id)
	}
	return nil
}

// ManifestKey is where manifest id is committed.
func ManifestKey(id string) string { return "manifests/" + id + ".json" }

// pendingKey is where an in-flight Pack announces the chunks it uses.
func pendingKey(id string) string { return "pending/" + id + ".json" }

// Validate checks everything a reader relies on: known format and types,
// paths that stay inside the tree and whose parents are directories of
// the tree (so no write goes through a symlink), sizes that add up.
func (m *Manifest) Validate() error {
	bad := func(format string, args ...any) error {
		return fmt.Errorf("%w: manifest %.140q: %s", errdefs.ErrInvalidArgument, m.ID, fmt.Sprintf(format, args...))
	}
	if m.Format != FormatVersion {
		return bad("format %d, this build reads %d", m.Format, FormatVersion)
	}
	if err := CheckManifestID(m.ID); err != nil {
		return err
	}
	if err := checkRefs(m.ID, m.Refs); err != nil {
		return bad("%v", err)
	}
	if m.Chunking != currentChunking() {
		// Still readable, but a Pack against it would dedupe nothing;
		// refuse rather than mix two chunkings in one store.
		return bad("chunking %+v, this build cuts with %+v", m.Chunking, currentChunking())
	}
	kinds := map[string]string{}
	for i, e := range m.Entries {
		p := e.Path
		if p == "" || p == "." || strings.HasPrefix(p, "/") || path.Clean(p) != p ||
			p == ".." || strings.HasPrefix(p, "../") || strings.ContainsRune(p, 0) {
			return bad("entry %d: path %.200q is not clean and relative", i, p)
		}
		if _, dup := kinds[p]; dup {
			return bad("entry %d: path %q twice", i, p)
		}
		if dir := path.Dir(p); dir != "." && kinds[dir] != TypeDir {
			return bad("entry %d: %q: parent %q is not an earlier directory entry", i, p, dir)
		}
		kinds[p] = e.Type
		if e.Mode&^0o7777 != 0 {
			return bad("entry %q: mode %#o has bits beyond 07777", p, e.Mode)
		}
		if e.UID < 0 || e.GID < 0 {
			return bad("entry %q: negative owner", p)
		}
		if e.Type != TypeFile && (e.Size != 0 || len(e.Chunks) != 0) {
			return bad("entry %q: a %s has no content", p, e.Type)
		}
		if e.Type != TypeSymlink && e.Target != "" {
			return bad("entry %q: a %s has no target", p, e.Type)
		}
		if e.Type != TypeChar && e.Type != TypeBlock && e.Rdev != 0 {
			return bad("entry %q: a %s has no device number", p, e.Type)
		}
		switch e.Type {
		case TypeDir, TypeChar, TypeBlock, TypeFIFO:
		case TypeSymlink:
			if e.Target == "" || strings.ContainsRune(e.Target, 0) {
				return bad("entry %q: symlink without a target", p)
			}
		case TypeFile:
			var sum int64
			for j, r := range e.Chunks {
				if r.Size <= 0 || r.Size > MaxChunk {
					return bad("entry %q: chunk %d: size %d outside (0, %d]", p, j, r.Size, MaxChunk)
				}
				if r.Stored <= 0 || r.Stored > maxFrame {
					return bad("entry %q: chunk %d: stored size %d outside (0, %d]", p, j, r.Stored, maxFrame)
				}
				sum += r.Size
			}
			if sum != e.Size {
				return bad("entry %q: chunks hold %d bytes, size is %d", p, sum, e.Size)
			}
		default:
			return bad("entry %q: unknown type %q", p, e.Type)
		}
	}
	return nil
}

// checkRefs accepts a list of held manifests that id may refer to: valid
// IDs, none twice, not id itself.
func checkRefs(id string, refs []string) error {
	seen := map[string]bool{}
	for _, r := range refs {
		if err := CheckManifestID(r); err != nil {
			return fmt.Errorf("ref: %w", err)
		}
		if seen[r] || r == id {
			return fmt.Errorf("ref %q twice, or to itself", r)
		}
		seen[r] = true
	}
	return nil
}

// encodeManifest returns the manifest's JSON.
func encodeManifest(m *Manifest) ([]byte, error) {
	b, err := json.Marshal(m)
	if err != nil {
		return nil, fmt.Errorf("encode manifest %s: %w", m.ID, err)
	}
	return b, nil
}

// maxManifest bounds what a reader accepts (a root filesystem of 100k
// files is ~20 MiB of JSON).
const maxManifest = 256 << 20

// DecodeManifest parses and validates a manifest.
func DecodeManifest(b []byte) (*Manifest, error) {
	var m Manifest
	d := json.NewDecoder(bytes.NewReader(b))
	d.DisallowUnknownFields()
	if err := d.Decode(&m); err != nil {
		return nil, errdefs.Invalidf("decode manifest: %v", err)
	}
	if d.More() {
		return nil, errdefs.Invalidf("decode manifest: data after the object")
	}
	if err := m.Validate(); err != nil {
		return nil, err
	}
	return &m, nil
}

// ReadManifest fetches and validates manifest id from the store.
func ReadManifest(ctx context.Context, store blob.Store, id string) (*Manifest, error) {
	if err := CheckManifestID(id); err != nil {
		return nil, err
	}
	m, err := readManifestKey(ctx, store, ManifestKey(id))
	if err != nil {
		return nil, err
	}
	if m.ID != id {
		return nil, errdefs.Invalidf("manifest %s holds id %q", id, m.ID)
	}
	return m, nil
}

func readManifestKey(ctx context.Context, store blob.Store, key string) (*Manifest, error) {
	rc, err := store.Get(ctx, key)
	if err != nil {
		return nil, fmt.Errorf("read %s: %w", key, err)
	}
	defer rc.Close()
	b, err := io.ReadAll(io.LimitReader(rc, maxManifest+1))
	if err != nil {
		return nil, fmt.Errorf("read %s: %w", key, err)
	}
	if len(b) > maxManifest {
		return nil, errdefs.Invalidf("%s: more than %d bytes", key, maxManifest)
	}
	m, err := DecodeManifest(b)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", key, err)
	}
	return m, nil
}

// DeleteManifest removes manifest id; its chunks go at the next GC unless
// another manifest names them.
func DeleteManifest(ctx context.Context, store blob.Store, id string) error {
	if err := CheckManifestID(id); err != nil {
		return err
	}
	return store.Delete(ctx, ManifestKey(id))
}

func putBytes(ctx context.Context, store blob.Store, key string, b []byte) error {
	if err := store.Put(ctx, key, bytes.NewReader(b), int64(len(b))); err != nil {
		return fmt.Errorf("put %s: %w", key, err)
	}
	return nil
}

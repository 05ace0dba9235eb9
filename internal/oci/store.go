package oci

import (
	"context"
	"crypto/sha256"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"time"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	"golang.org/x/sys/unix"

	"github.com/spore-run/spore/internal/atomicfs"
	"github.com/spore-run/spore/internal/errdefs"
)

// Store keeps unpacked images as root filesystem trees under Dir, one per
// layer stack (see ChainID), so every template made from the same layers
// shares one tree. Layout:
//
//	Dir/trees/sha256-<chainid>/rootfs       the tree
//	Dir/trees/sha256-<chainid>/stamp.json   what it was made from (Stamp)
//	Dir/staging/sha256-<chainid>.<random>/  an unpack in progress
//	Dir/locks/sha256-<chainid>.lock         flock: one unpacker across processes
//
// A tree appears by renaming its finished staging directory into trees/,
// so a tree that exists is complete. Trees are never modified: users
// must mount them read-only or copy them.
//
// Use a *Store; its zero value with Dir set is ready.
type Store struct {
	Dir    string
	Limits Limits       // per unpack; zero fields take the defaults
	Log    *slog.Logger // nil: slog.Default()

	mu       sync.Mutex
	inflight map[string]chan struct{} // key -> closed when its holder leaves
}

// Tree is an unpacked image.
type Tree struct {
	Key    string // "sha256:<chainid>"
	Rootfs string // the root filesystem directory
	Stamp  Stamp
}

// Stamp records what a tree was made from, written once with the tree.
type Stamp struct {
	Key          string    `json:"key"`
	ImageDigest  string    `json:"image_digest"`  // manifest digest of the image first unpacked
	ConfigDigest string    `json:"config_digest"` // its configuration
	Ref          string    `json:"ref"`           // the reference that image was pulled by
	Platform     string    `json:"platform,omitempty"`
	DiffIDs      []string  `json:"diff_ids"`
	Bytes        int64     `json:"bytes"` // file data unpacked
	Entries      int64     `json:"entries"`
	Unpacked     time.Time `json:"unpacked"`
}

// ChainID is the OCI image spec's identifier of img's applied layer stack:
// ChainID(L0) = DiffID(L0), ChainID(L0..Ln) = sha256(ChainID(L0..Ln-1) + " " + DiffID(Ln)).
// It is the Store key: it names exactly the bytes that make the tree.
func ChainID(img v1.Image) (v1.Hash, error) {
	cfg, err := img.ConfigFile()
	if err != nil {
		return v1.Hash{}, classify(context.Background(), "image", err)
	}
	ids := cfg.RootFS.DiffIDs
	if len(ids) == 0 {
		// An image without layers: the key of the empty tree.
		return v1.Hash{Algorithm: "sha256", Hex: fmt.Sprintf("%x", sha256.Sum256(nil))}, nil
	}
	chain := ids[0]
	for _, id := range ids[1:] {
		chain = v1.Hash{Algorithm: "sha256", Hex: fmt.Sprintf("%x", sha256.Sum256([]byte(chain.String()+" "+id.String())))}
	}
	if chain.Algorithm != "sha256" || len(chain.Hex) != 64 || strings.ContainsAny(chain.Hex, "/.") {
		return v1.Hash{}, errdefs.Invalidf("diffID %s is not a sha256 digest", chain)
	}
	return chain, nil
}

func (s *Store) log() *slog.Logger {
	if s.Log != nil {
		return s.Log
	}
	return slog.Default()
}

func dirName(key v1.Hash) string { return key.Algorithm + "-" + key.Hex }

// Lookup returns the tree stored under key ("sha256:<hex>"), or an
// errdefs.ErrNotFound error.
func (s *Store) Lookup(key string) (Tree, error) {
	h, err := v1.NewHash(key)
	if err != nil || h.Algorithm != "sha256" {
		return Tree{}, errdefs.Invalidf("tree key %q", key)
	}
	return s.lookup(h)
}

func (s *Store) lookup(key v1.Hash) (Tree, error) {
	dir := filepath.Join(s.Dir, "trees", dirName(key))
	var st Stamp
	if err := atomicfs.ReadJSON(filepath.Join(dir, "stamp.json"), &st); err != nil {
		if errors.Is(err, fs.ErrNotExist) {
			return Tree{}, errdefs.NotFoundf("tree %s", key)
		}
		return Tree{}, fmt.Errorf("%w: tree %s: %v", errdefs.ErrInternal, key, err)
	}
	return Tree{Key: key.String(), Rootfs: filepath.Join(dir, "rootfs"), Stamp: st}, nil
}

// Ensure returns the tree of img, unpacking it first if no tree with its
// key exists. Concurrent Ensures of the same layers (in this process or
// another using the same Dir) unpack once; the others wait and share the
// result. A failed unpack leaves nothing behind.
func (s *Store) Ensure(ctx context.Context, img *Image) (Tree, error) {
	key, err := ChainID(img)
	if err != nil {
		return Tree{}, err
	}
	if t, err := s.lookup(key); !errdefs.IsNotFound(err) {
		return t, err
	}
	release, err := s.lock(ctx, key)
	if err != nil {
		return Tree{}, err
	}
	defer release()
	// Whoever held the lock before may have made it.
	if t, err := s.lookup(key); !errdefs.IsNotFound(err) {
		return t, err
	}
	return s.unpack(ctx, img, key)
}

// lock serializes unpackers of key: first among goroutines (a channel, so
// waiters honour their ctx), then across processes (flock).
func (s *Store) lock(ctx context.Context, key v1.Hash) (func(), error) {
	k := key.String()
	for {
		s.mu.Lock()
		if s.inflight == nil {
			s.inflight = map[string]chan struct{}{}
		}
		ch, busy := s.inflight[k]
		if !busy {
			ch = make(chan struct{})
			s.inflight[k] = ch
		}
		s.mu.Unlock()
		if !busy {
			release := func() {
				s.mu.Lock()
				delete(s.inflight, k)
				s.mu.Unlock()
				close(ch)
			}
			unlock, err := s.flock(ctx, key)
			if err != nil {
				release()
				return nil, err
			}
			return func() { unlock(); release() }, nil
		}
		select {
		case <-ch:
		case <-ctx.Done():
			return nil, ctx.Err()
		}
	}
}

func (s *Store) flock(ctx context.Context, key v1.Hash) (func(), error) {
	dir := filepath.Join(s.Dir, "locks")
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, fmt.Errorf("%w: %v", errdefs.ErrInternal, err)
	}
	// Only another process unpacking the same image makes this wait.
	return atomicfs.Lock(ctx, filepath.Join(dir, dirName(key)+".lock"))
}

// unpack makes the tree of key; the caller holds its lock.
func (s *Store) unpack(ctx context.Context, img *Image, key v1.Hash) (Tree, error) {
	staging := filepath.Join(s.Dir, "staging")
	trees := filepath.Join(s.Dir, "trees")
	for _, d := range []string{staging, trees} {
		if err := os.MkdirAll(d, 0o700); err != nil {
			return Tree{}, fmt.Errorf("%w: %v", errdefs.ErrInternal, err)
		}
	}
	// Under the lock, any staging directory of this key is a crashed
	// unpacker's leftover.
	if old, _ := filepath.Glob(filepath.Join(staging, dirName(key)+".*")); len(old) > 0 {
		for _, o := range old {
			if err := os.RemoveAll(o); err != nil {
				return Tree{}, fmt.Errorf("%w: %v", errdefs.ErrInternal, err)
			}
		}
	}
	tmp, err := os.MkdirTemp(staging, dirName(key)+".")
	if err != nil {
		return Tree{}, fmt.Errorf("%w: %v", errdefs.ErrInternal, err)
	}
	done := false
	defer func() {
		if !done {
			if err := os.RemoveAll(tmp); err != nil {
				s.log().Error("oci: remove failed unpack", "dir", tmp, "err", err)
			}
		}
	}()
	rootfs := filepath.Join(tmp, "rootfs")
	if err := os.Mkdir(rootfs, 0o755); err != nil {
		return Tree{}, fmt.Errorf("%w: %v", errdefs.ErrInternal, err)
	}
	start := time.Now()
	stats, err := Unpack(ctx, img, rootfs, s.Limits)
	if err != nil {
		return Tree{}, fmt.Errorf("unpack %s: %w", img.Ref, err)
	}
	digest, err := img.Digest()
	if err != nil {
		return Tree{}, classify(ctx, img.Ref, err)
	}
	cfgDigest, err := img.ConfigName()
	if err != nil {
		return Tree{}, classify(ctx, img.Ref, err)
	}
	cfg, err := img.ConfigFile()
	if err != nil {
		return Tree{}, classify(ctx, img.Ref, err)
	}
	st := Stamp{
		Key: key.String(), ImageDigest: digest.String(), ConfigDigest: cfgDigest.String(),
		Ref: img.Ref, Platform: img.Platform, Bytes: stats.Bytes, Entries: stats.Entries,
		Unpacked: time.Now().UTC(),
	}
	for _, d := range cfg.RootFS.DiffIDs {
		st.DiffIDs = append(st.DiffIDs, d.String())
	}
	if err := atomicfs.WriteJSON(filepath.Join(tmp, "stamp.json"), st); err != nil {
		return Tree{}, fmt.Errorf("%w: %v", errdefs.ErrInternal, err)
	}
	// One syncfs for the whole tree instead of an fsync per file: after
	// the rename a crash must not leave a complete-looking tree with holes.
	if err := syncfs(tmp); err != nil {
		return Tree{}, fmt.Errorf("%w: sync %s: %v", errdefs.ErrInternal, tmp, err)
	}
	final := filepath.Join(trees, dirName(key))
	if err := os.Rename(tmp, final); err != nil {
		return Tree{}, fmt.Errorf("%w: %v", errdefs.ErrInternal, err)
	}
	done = true
	if err := atomicfs.SyncDir(trees); err != nil {
		return Tree{}, fmt.Errorf("%w: %v", errdefs.ErrInternal, err)
	}
	s.log().Info("oci: unpacked image", "ref", img.Ref, "digest", digest.String(), "key", key.String(),
		"bytes", stats.Bytes, "entries", stats.Entries, "layers", stats.Layers, "took", time.Since(start))
	return Tree{Key: key.String(), Rootfs: filepath.Join(final, "rootfs"), Stamp: st}, nil
}

func syncfs(dir string) error {
	f, err := os.Open(dir)
	if err != nil {
		return err
	}
	defer f.Close()
	return unix.Syncfs(int(f.Fd()))
}

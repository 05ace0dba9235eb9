package oci

import (
	"context"
	"log/slog"
	"os"
	"path/filepath"
	"sync"
	"testing"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/mutate"

	"github.com/spore-run/spore/internal/errdefs"
)

// TestStoreSharesOneTree: two tags of one image, and an image with the
// same layers but another configuration, share one tree; eight concurrent
// Ensures download each layer once and unpack once; a later Ensure
// downloads nothing.
func TestStoreSharesOneTree(t *testing.T) {
	mustRoot(t)
	r := newRegistry(t)
	l1 := layerOf(t, dir("etc/", 0o755), file("etc/os-release", "ID=test", 0o644))
	l2 := layerOf(t, file("usr/bin/tool", "#!/bin/sh", 0o755).owner(0, 0))
	img := imageOf(t, "linux/amd64", l1, l2)
	refA := r.push(t, "base:v1", img)
	refB := r.push(t, "base:latest", img)
	cfg, _ := img.ConfigFile()
	cfg = cfg.DeepCopy()
	cfg.Config.Cmd = []string{"/usr/bin/tool"}
	other, err := mutate.ConfigFile(img, cfg)
	if err != nil {
		t.Fatal(err)
	}
	refC := r.push(t, "withcmd:v1", other)

	ctx := context.Background()
	s := &Store{Dir: t.TempDir(), Log: slog.New(slog.DiscardHandler)}
	var (
		wg    sync.WaitGroup
		mu    sync.Mutex
		trees []Tree
	)
	for i := range 8 {
		ref := []string{refA, refB, refC}[i%3]
		wg.Go(func() {
			img, err := Pull(ctx, ref, local)
			if err != nil {
				t.Error(err)
				return
			}
			tree, err := s.Ensure(ctx, img)
			if err != nil {
				t.Error(err)
				return
			}
			mu.Lock()
			trees = append(trees, tree)
			mu.Unlock()
		})
	}
	wg.Wait()
	if t.Failed() {
		t.FailNow()
	}
	for _, tr := range trees {
		if tr.Rootfs != trees[0].Rootfs || tr.Key != trees[0].Key {
			t.Fatalf("trees differ: %+v vs %+v", tr, trees[0])
		}
	}
	for i, l := range []interface{ Digest() (v1.Hash, error) }{l1, l2} {
		d, _ := l.Digest()
		if n := r.gets(d); n != 1 {
			t.Errorf("layer %d fetched %d times, want 1", i, n)
		}
	}
	// Trees hold setuid binaries and device nodes: no unprivileged host
	// user may reach them.
	if fi, err := os.Stat(filepath.Join(s.Dir, "trees")); err != nil || fi.Mode().Perm() != 0o700 {
		t.Fatalf("trees directory: %v %v", fi.Mode(), err)
	}
	ents, _ := os.ReadDir(filepath.Join(s.Dir, "trees"))
	if len(ents) != 1 {
		t.Fatalf("%d trees, want 1", len(ents))
	}
	if b, err := os.ReadFile(filepath.Join(trees[0].Rootfs, "usr/bin/tool")); err != nil || string(b) != "#!/bin/sh" {
		t.Fatalf("tree content: %q %v", b, err)
	}
	if staging, _ := os.ReadDir(filepath.Join(s.Dir, "staging")); len(staging) != 0 {
		t.Fatalf("staging left: %v", staging)
	}

	// The stamp says what the tree came from.
	st := trees[0].Stamp
	key, _ := ChainID(img)
	if st.Key != key.String() || st.Bytes != int64(len("ID=test")+len("#!/bin/sh")) || st.Entries != 3 ||
		len(st.DiffIDs) != 2 || st.Unpacked.IsZero() || st.Ref == "" || st.ImageDigest == "" {
		t.Fatalf("stamp %+v", st)
	}
	got, err := s.Lookup(key.String())
	if err != nil || got.Stamp.ImageDigest != st.ImageDigest || got.Rootfs != trees[0].Rootfs {
		t.Fatalf("lookup: %+v %v", got, err)
	}

	// Another template from the same image later: no layer download.
	again, err := Pull(ctx, refB, local)
	if err != nil {
		t.Fatal(err)
	}
	if tr, err := s.Ensure(ctx, again); err != nil || tr.Rootfs != trees[0].Rootfs {
		t.Fatalf("second ensure: %+v %v", tr, err)
	}
	for _, l := range []interface{ Digest() (v1.Hash, error) }{l1, l2} {
		d, _ := l.Digest()
		if n := r.gets(d); n != 1 {
			t.Errorf("layer fetched again (%d)", n)
		}
	}
	if _, err := s.Lookup("sha256:" + key.Hex[:63] + "0"); !errdefs.IsNotFound(err) {
		t.Fatalf("lookup of an unknown key: %v", err)
	}
}

// TestStoreCorruptLayerLeavesNothing: a registry serving a layer whose
// bytes do not match its digest fails the Ensure with ErrDataLoss and
// leaves no tree and no staging directory; once the registry serves the
// right bytes the same Ensure succeeds.
func TestStoreCorruptLayerLeavesNothing(t *testing.T) {
	mustRoot(t)
	r := newRegistry(t)
	good := layerOf(t, file("a", "aaaa", 0o644))
	bad := layerOf(t, file("big", string(make([]byte, 64<<10)), 0o644), file("b", "bbbb", 0o644))
	ref := r.push(t, "corrupt:v1", imageOf(t, "", good, bad))
	d, _ := bad.Digest()
	r.setCorrupt(d.String())

	ctx := context.Background()
	s := &Store{Dir: t.TempDir(), Log: slog.New(slog.DiscardHandler)}
	img, err := Pull(ctx, ref, local)
	if err != nil {
		t.Fatal(err)
	}
	_, err = s.Ensure(ctx, img)
	t.Logf("%v", err)
	if !errdefs.IsDataLoss(err) {
		t.Fatalf("err %v, want ErrDataLoss", err)
	}
	for _, sub := range []string{"trees", "staging"} {
		if ents, _ := os.ReadDir(filepath.Join(s.Dir, sub)); len(ents) != 0 {
			t.Fatalf("%s left after a failed unpack: %v", sub, ents)
		}
	}
	key, _ := ChainID(img)
	if _, err := s.Lookup(key.String()); !errdefs.IsNotFound(err) {
		t.Fatalf("lookup after failure: %v", err)
	}

	r.setCorrupt("")
	img, err = Pull(ctx, ref, local)
	if err != nil {
		t.Fatal(err)
	}
	tree, err := s.Ensure(ctx, img)
	if err != nil {
		t.Fatal(err)
	}
	if b, err := os.ReadFile(filepath.Join(tree.Rootfs, "b")); err != nil || string(b) != "bbbb" {
		t.Fatalf("after repair: %q %v", b, err)
	}
}

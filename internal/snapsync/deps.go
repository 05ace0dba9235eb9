package snapsync

import (
	"context"
	"fmt"
	"maps"
	"strings"

	"github.com/spore-run/spore/internal/chunk"
	"github.com/spore-run/spore/internal/errdefs"
	"github.com/spore-run/spore/internal/snapshot"
)

// A snapshot's dependencies: besides its image, a restore needs the root
// filesystem tree it was taken over and the runtime build that wrote it,
// which an upgrade replaces on the nodes (docs/engine.md, "Versions kept
// across upgrades"). Each travels as a held chunk manifest named by its
// identity (Dep.ManifestID); the snapshot's manifest refers to them
// (chunk.Manifest.Refs), so the store keeps them while a snapshot needs
// them and its GC deletes them after (chunk's GC protocol). Upload
// publishes them before it commits the snapshot; Ensure installs those the
// node lacks before it fetches the snapshot.

// Dependency kinds.
const (
	DepTree    = "tree"    // a root filesystem build (rootfs.Stamp.ID)
	DepRuntime = "runtime" // a runtime build (runtime.Builds)
	// DepVolume is the snapshot's copy of an exclusive volume (an image
	// in the node's volume pool, docs/volumes.md): a sandbox restored
	// from the snapshot elsewhere gets its volume from it.
	DepVolume = "volume"
)

// MetaVolumes lists, in a snapshot's chunk manifest, its volume copies
// (comma-separated).
const MetaVolumes = "spore.volumes"

// MetaRuntimeBuild is the snapshot's runtime build in its chunk manifest's
// metadata (absent for images from before builds were kept).
const MetaRuntimeBuild = "spore.runtime_build"

// MetaDep says, in a dependency's chunk manifest, which kind it is.
const MetaDep = "spore.dep"

// Dep is one dependency of a snapshot.
type Dep struct {
	Kind string // DepTree or DepRuntime
	ID   string
}

// ManifestID names the dependency's chunk manifest.
func (d Dep) ManifestID() string { return d.Kind + "-" + d.ID }

func (d Dep) String() string {
	switch d.Kind {
	case DepRuntime:
		return "runtime build " + d.ID
	case DepVolume:
		return "volume copy " + d.ID
	}
	return "root filesystem build " + d.ID
}

// DepsOf lists the dependencies a snapshot names.
func DepsOf(m snapshot.Manifest) []Dep {
	var out []Dep
	if m.RootFSID != "" {
		out = append(out, Dep{Kind: DepTree, ID: m.RootFSID})
	}
	if m.RuntimeBuild != "" {
		out = append(out, Dep{Kind: DepRuntime, ID: m.RuntimeBuild})
	}
	for _, c := range volumeCopies(m) {
		out = append(out, Dep{Kind: DepVolume, ID: c})
	}
	return out
}

// volumeCopies are the volume copies a snapshot holds.
func volumeCopies(m snapshot.Manifest) []string {
	var out []string
	for _, v := range m.Run.Volumes {
		if v.Copy != "" {
			out = append(out, v.Copy)
		}
	}
	return out
}

// depsOfMeta lists the dependencies a snapshot's chunk manifest names.
func depsOfMeta(meta map[string]string) []Dep {
	var out []Dep
	if _, build, ok := strings.Cut(meta[MetaRootFS], "@"); ok && build != "" {
		out = append(out, Dep{Kind: DepTree, ID: build})
	}
	if b := meta[MetaRuntimeBuild]; b != "" {
		out = append(out, Dep{Kind: DepRuntime, ID: b})
	}
	if v := meta[MetaVolumes]; v != "" {
		for _, c := range strings.Split(v, ",") {
			out = append(out, Dep{Kind: DepVolume, ID: c})
		}
	}
	return out
}

// Deps is the node's side of the dependencies (implemented by the node
// over its root filesystems and its runtime).
type Deps interface {
	// Has reports whether the node holds dep.
	Has(dep Dep) bool
	// Dir returns the directory holding dep on this node (to publish it)
	// and the metadata its copy carries; ErrNotFound when the node lacks it.
	Dir(dep Dep) (dir string, meta map[string]string, err error)
	// Install adds dep from its copy: fill writes the copy's tree into
	// the directory it is given; meta is the copy's metadata.
	Install(ctx context.Context, dep Dep, meta map[string]string, fill func(dir string) error) error
	// Hold keeps the node from removing any dependency until release is
	// called: a fetch installs a snapshot's dependencies before it
	// commits the snapshot that needs them.
	Hold() (release func())
}

// PublishDeps makes dependencies present in the store as held manifests
// (an upload's chunk.PackOptions.EnsureRefs; the node's shared root
// filesystem too). A manifest or pending Pack must refer to them, or the
// store's GC deletes them once they are older than its grace period.
func (s *Syncer) PublishDeps(ctx context.Context, deps []Dep) error {
	if s.cfg.Deps == nil {
		return errdefs.Conflictf("snapsync: no dependencies kept on this node")
	}
	for _, d := range deps {
		err := s.once(ctx, "dep/"+d.ManifestID(), func() error {
			if _, err := chunk.ReadManifest(ctx, s.cfg.Store, d.ManifestID()); err == nil {
				return nil
			} else if !errdefs.IsNotFound(err) {
				return err
			}
			dir, meta, err := s.cfg.Deps.Dir(d)
			if err != nil {
				return fmt.Errorf("publish %s: %w", d, err)
			}
			meta = maps.Clone(meta)
			if meta == nil {
				meta = map[string]string{}
			}
			meta[MetaDep] = d.Kind
			_, st, err := chunk.Pack(ctx, dir, s.cfg.Store, chunk.PackOptions{ID: d.ManifestID(), Held: true, Metadata: meta, Cache: s.cfg.Cache, Log: s.log})
			if err != nil {
				return fmt.Errorf("publish %s: %w", d, err)
			}
			s.log.Info("snapshot dependency published", "dep", d.ManifestID(), "bytes", st.TotalBytes, "stored", st.StoredBytes)
			return nil
		})
		if err != nil {
			return err
		}
	}
	return nil
}

// depsAvailable checks, before anything is fetched, that every dependency
// a snapshot's metadata names is on this node or in the store.
func (s *Syncer) depsAvailable(ctx context.Context, meta map[string]string) error {
	for _, d := range depsOfMeta(meta) {
		if s.cfg.Deps.Has(d) {
			continue
		}
		_, err := chunk.ReadManifest(ctx, s.cfg.Store, d.ManifestID())
		if errdefs.IsNotFound(err) {
			return fmt.Errorf("%w: it needs %s, which neither this node nor the blob store holds", errdefs.ErrConflict, d)
		}
		if err != nil {
			return fmt.Errorf("%s in the blob store: %w", d, err)
		}
	}
	return nil
}

// installDeps installs, from the store, the dependencies a snapshot's
// metadata names that this node lacks. Callers hold the node's Deps.
func (s *Syncer) installDeps(ctx context.Context, meta map[string]string) error {
	for _, d := range depsOfMeta(meta) {
		if err := s.InstallDep(ctx, d); err != nil {
			return err
		}
	}
	return nil
}

// InstallDep gives this node dependency d from the store's copy, unless it
// holds it. The caller holds the node's Deps until what needs d is
// committed.
func (s *Syncer) InstallDep(ctx context.Context, d Dep) error {
	if s.cfg.Deps == nil {
		return errdefs.Conflictf("snapsync: no dependencies kept on this node")
	}
	return s.once(ctx, "dep/"+d.ManifestID(), func() error {
		if s.cfg.Deps.Has(d) {
			return nil
		}
		cm, err := chunk.ReadManifest(ctx, s.cfg.Store, d.ManifestID())
		if err != nil {
			return fmt.Errorf("fetch %s: %w", d, err)
		}
		if cm.Metadata[MetaDep] != d.Kind {
			return fmt.Errorf("%w: the blob store's %s is not a %s", errdefs.ErrDataLoss, cm.ID, d.Kind)
		}
		src := &chunk.Tiered{Cache: s.cfg.Cache, Store: s.cfg.Store, Log: s.log}
		var st chunk.UnpackStats
		err = s.cfg.Deps.Install(ctx, d, cm.Metadata, func(dir string) error {
			var uerr error
			st, uerr = chunk.Unpack(ctx, cm, dir, src, chunk.UnpackOptions{})
			return uerr
		})
		if err != nil {
			return fmt.Errorf("fetch %s: %w", d, err)
		}
		s.log.Info("snapshot dependency fetched", "dep", d.ManifestID(), "bytes", st.Bytes,
			"from_cache", st.Fetch.FromCache, "from_store", st.Fetch.FromStore)
		return nil
	})
}

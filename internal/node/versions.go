package node

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/spore-run/spore/internal/engine"
	"github.com/spore-run/spore/internal/errdefs"
	"github.com/spore-run/spore/internal/rootfs"
	"github.com/spore-run/spore/internal/runtime/gvisor"
	"github.com/spore-run/spore/internal/snapsync"
)

// Versions kept across upgrades (docs/engine.md). A snapshot restores only
// over the root filesystem tree it was taken over and with the runsc
// build that wrote it; an upgrade (`make setup` after a change of the base
// root filesystem, or of runsc) gives both new builds. The node keeps
// every old one that a snapshot, template or sandbox of its engine needs
// (the trees in <rootfs>/.kept, see rootfs; the runsc builds in
// <data>/runsc-builds, see gvisor), fetches from the blob store those a
// snapshot it is given needs and it lacks (snapsync.Deps), and removes the
// ones nothing needs any more (PruneVersions).

// versions implements snapsync.Deps over the node's root filesystems and
// runtime.
type versions struct {
	n *Node
	// pruneTrees: the node alone uses its root filesystem directory
	// (Config.OwnRootFS), so it may remove the trees kept there.
	pruneTrees bool
	// mu: fetches hold it shared from the install of a snapshot's
	// dependencies to the commit of the snapshot; PruneVersions holds it
	// alone, so it never removes what a fetch is about to need.
	mu sync.RWMutex
}

var _ snapsync.Deps = (*versions)(nil)

// Has implements snapsync.Deps.
func (v *versions) Has(d snapsync.Dep) bool {
	switch d.Kind {
	case snapsync.DepTree:
		_, ok := rootfs.Has(v.n.rootfsDir, d.ID)
		return ok
	case snapsync.DepRuntime:
		_, err := v.n.Runtime.HasBuild(d.ID)
		return err == nil
	case snapsync.DepVolume:
		if !v.n.vols.made() {
			return false
		}
		p, err := v.n.vols.open(context.Background())
		return err == nil && p.Exists(d.ID)
	}
	return false
}

// Dir implements snapsync.Deps: a tree's copy carries its stamp.
func (v *versions) Dir(d snapsync.Dep) (string, map[string]string, error) {
	switch d.Kind {
	case snapsync.DepTree:
		p, st, err := rootfs.TreeOf(v.n.rootfsDir, d.ID)
		if err != nil {
			return "", nil, err
		}
		b, err := json.Marshal(st)
		if err != nil {
			return "", nil, err
		}
		return p, map[string]string{metaStamp: string(b)}, nil
	case snapsync.DepRuntime:
		if _, err := v.n.Runtime.HasBuild(d.ID); err != nil {
			return "", nil, err
		}
		return gvisor.BuildDir(v.n.Runtime.BuildsDir(), d.ID), nil, nil
	case snapsync.DepVolume:
		p, err := v.n.vols.open(context.Background())
		if err != nil {
			return "", nil, err
		}
		dir, err := p.Published(d.ID)
		return dir, nil, err
	}
	return "", nil, errdefs.Invalidf("dependency kind %q", d.Kind)
}

// Install implements snapsync.Deps.
func (v *versions) Install(ctx context.Context, d snapsync.Dep, meta map[string]string, fill func(dir string) error) error {
	switch d.Kind {
	case snapsync.DepTree:
		var st rootfs.Stamp
		if err := json.Unmarshal([]byte(meta[metaStamp]), &st); err != nil || st.ID != d.ID {
			return fmt.Errorf("%w: the copy of root filesystem build %s has no stamp of that build", errdefs.ErrDataLoss, d.ID)
		}
		return rootfs.AddKept(ctx, v.n.rootfsDir, st, fill)
	case snapsync.DepRuntime:
		return v.n.Runtime.InstallBuild(ctx, d.ID, fill)
	case snapsync.DepVolume:
		if !engine.IsVolumeCopy(d.ID) {
			return errdefs.Invalidf("volume copy %q is not named as one", d.ID)
		}
		p, err := v.n.vols.open(ctx)
		if err != nil {
			return err
		}
		return p.Install(ctx, d.ID, fill)
	}
	return errdefs.Invalidf("dependency kind %q", d.Kind)
}

// Hold implements snapsync.Deps.
func (v *versions) Hold() func() {
	v.mu.RLock()
	var once sync.Once
	return func() { once.Do(v.mu.RUnlock) }
}

// VersionsReport says what PruneVersions removed and kept.
type VersionsReport struct {
	RemovedTrees, RemovedBuilds []string
	KeptTrees, KeptBuilds       int
}

// PruneVersions removes the kept root filesystem builds and runsc builds
// that no snapshot, template or sandbox of this node needs any more (the
// named root filesystems and the current runsc build always stay; trees
// only in a root filesystem directory the node owns, Config.OwnRootFS). A
// build a restore target still runs with stays until the target goes.
// The blob store's copies go with its GC (chunk's held manifests). The
// node runs it when it opens, after EnsureTemplates, and every
// pruneEvery.
func (n *Node) PruneVersions(ctx context.Context) (VersionsReport, error) {
	n.versions.mu.Lock()
	defer n.versions.mu.Unlock()
	uses := n.Engine.Uses()
	var rep VersionsReport
	var err error
	if n.versions.pruneTrees {
		rep.RemovedTrees, err = rootfs.Prune(ctx, n.rootfsDir, func(id string) bool { return uses.Trees[id] })
		if err != nil {
			return rep, fmt.Errorf("prune root filesystems: %w", err)
		}
	}
	if kept, err := rootfs.Kept(n.rootfsDir); err == nil {
		rep.KeptTrees = len(kept)
	}
	builds, err := n.Runtime.KeptBuilds()
	if err != nil {
		return rep, err
	}
	var errs []error
	for _, b := range builds {
		if uses.Builds[b] || b == n.Runtime.Build() {
			rep.KeptBuilds++
			continue
		}
		switch err := n.Runtime.RemoveBuild(ctx, b); {
		case err == nil:
			rep.RemovedBuilds = append(rep.RemovedBuilds, b)
		case errdefs.IsConflict(err):
			rep.KeptBuilds++ // a restore target runs with it
		default:
			errs = append(errs, err)
		}
	}
	if len(rep.RemovedTrees)+len(rep.RemovedBuilds) > 0 {
		n.log.Info("versions nothing needs removed", "rootfs_builds", rep.RemovedTrees, "runsc_builds", rep.RemovedBuilds)
	}
	return rep, errors.Join(errs...)
}

// pruneEvery is how often a node removes the versions nothing needs.
const pruneEvery = time.Hour

// pruneVersionsEvery runs PruneVersions every period until stop closes.
func (n *Node) pruneVersionsEvery(period time.Duration, stop <-chan struct{}) {
	t := time.NewTicker(period)
	defer t.Stop()
	for {
		select {
		case <-stop:
			return
		case <-t.C:
		}
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
		if _, err := n.PruneVersions(ctx); err != nil {
			n.log.Warn("prune the versions nothing needs", "err", err)
		}
		cancel()
	}
}

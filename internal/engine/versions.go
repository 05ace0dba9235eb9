package engine

import (
	"fmt"

	"github.com/spore-run/spore/internal/errdefs"
	"github.com/spore-run/spore/internal/rootfs"
	"github.com/spore-run/spore/internal/runtime"
	"github.com/spore-run/spore/internal/snapshot"
)

// Versions kept across upgrades (docs/engine.md). A checkpoint image
// restores only with the runtime build that wrote it and over the root
// filesystem tree it was taken over. Every snapshot and sandbox record
// names both (RootFSID, RuntimeBuild); a restore runs with that build
// (runtime.Spec.Build) over that tree (rootfs.Resolve: the named tree
// while it is that build, else the kept one), so an upgrade of either
// strands nothing. What the engine's snapshots and sandboxes need is what
// the node keeps (Uses); the rest it may remove.

// runtimeBuilds is the runtime's builds capability, nil without one.
func (e *Engine) runtimeBuilds() runtime.Builds {
	b, _ := e.rt.(runtime.Builds)
	return b
}

// currentBuild is the build new instances run with ("" for a runtime
// without builds).
func (e *Engine) currentBuild() string {
	if b := e.runtimeBuilds(); b != nil {
		return b.Build()
	}
	return ""
}

// runtimeName is the runtime name of build (Manifest.Runtime).
func (e *Engine) runtimeName(build string) string {
	if b := e.runtimeBuilds(); b != nil && build != "" {
		if name, err := b.HasBuild(build); err == nil {
			return name
		}
	}
	return e.rt.Name()
}

// buildOf is the runtime build that restores m: the one that wrote it;
// for an image from before builds were kept, the current build, when it
// is the runtime (and version) that wrote it.
func (e *Engine) buildOf(m snapshot.Manifest) (string, error) {
	b := e.runtimeBuilds()
	if m.RuntimeBuild == "" {
		if m.Runtime != e.rt.Name() {
			return "", fmt.Errorf("snapshot %s was written by runtime %s, this engine runs %s: %w",
				m.ID, m.Runtime, e.rt.Name(), errdefs.ErrConflict)
		}
		return e.currentBuild(), nil
	}
	if b == nil {
		return "", fmt.Errorf("snapshot %s was written by runtime build %s, and this engine's runtime keeps no builds: %w",
			m.ID, m.RuntimeBuild, errdefs.ErrConflict)
	}
	if _, err := b.HasBuild(m.RuntimeBuild); err != nil {
		if errdefs.IsNotFound(err) {
			return "", fmt.Errorf("snapshot %s was written by runtime build %s, which this node does not hold: %w",
				m.ID, m.RuntimeBuild, errdefs.ErrConflict)
		}
		return "", err
	}
	return m.RuntimeBuild, nil
}

// treeOf is the path of the root filesystem tree m was taken over.
func (e *Engine) treeOf(m snapshot.Manifest) (string, error) {
	p, err := rootfs.Resolve(e.rootfsDir, m.RootFS, m.RootFSID)
	if errdefs.IsNotFound(err) {
		st, lerr := rootfs.Lookup(e.rootfsDir, m.RootFS)
		if lerr != nil {
			return "", lerr // no such root filesystem here at all
		}
		have := st.ID
		hint := ""
		if m.Kind == snapshot.KindTemplate {
			hint = "; rebuild the template"
		}
		return "", fmt.Errorf("snapshot %s was taken over root filesystem %s build %s, which this node does not hold (its %s is build %s%s): %w",
			m.ID, m.RootFS, m.RootFSID, m.RootFS, have, hint, errdefs.ErrConflict)
	}
	return p, err
}

// current reports whether m was made over the current build of its root
// filesystem with the current runtime build (a template that is not is
// rebuilt by EnsureTemplate; it still restores).
func (e *Engine) current(m snapshot.Manifest) bool {
	st, err := rootfs.Lookup(e.rootfsDir, m.RootFS)
	if err != nil || st.ID != m.RootFSID || m.Runtime != e.rt.Name() {
		return false
	}
	return m.RuntimeBuild == "" && e.runtimeBuilds() == nil || m.RuntimeBuild == e.currentBuild()
}

// Uses is what the engine's snapshots and sandboxes need of the node:
// root filesystem builds (rootfs.Stamp.ID) and runtime builds.
type Uses struct {
	Trees  map[string]bool
	Builds map[string]bool
}

// Uses reports the root filesystem builds and runtime builds that a
// snapshot (template, hibernation) or a sandbox (running, paused,
// hibernated, or with an operation in flight) of this engine needs. The
// current runtime build is always in it.
func (e *Engine) Uses() Uses {
	u := Uses{Trees: map[string]bool{}, Builds: map[string]bool{}}
	if cur := e.currentBuild(); cur != "" {
		u.Builds[cur] = true
	}
	add := func(tree, build string) {
		if tree != "" {
			u.Trees[tree] = true
		}
		if build != "" {
			u.Builds[build] = true
		}
	}
	e.mu.Lock()
	for _, r := range e.records {
		add(r.RootFSID, r.RuntimeBuild)
	}
	e.mu.Unlock()
	for _, m := range e.snaps.List() {
		add(m.RootFSID, m.RuntimeBuild)
	}
	return u
}

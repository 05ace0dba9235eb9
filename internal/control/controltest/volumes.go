package controltest

import (
	"context"
	"os"
	"path/filepath"
	"sync"

	"github.com/spore-run/spore/internal/engine"
	"github.com/spore-run/spore/internal/errdefs"
	"github.com/spore-run/spore/internal/node"
	"github.com/spore-run/spore/internal/nodeapi"
	"github.com/spore-run/spore/internal/runtime"
	"github.com/spore-run/spore/internal/snapshot"
	"github.com/spore-run/spore/internal/snapsync"
)

// Volumes is the fake node's volume store: a directory per volume, made
// at its first mount, put behind the template's slots as the real node
// does (internal/node/volumes.go). It records what it was asked.
type Volumes struct {
	dir string

	mu      sync.Mutex
	made    map[string]int64 // volume ID -> size
	deleted []string
}

func newVolumes(dir string) *Volumes {
	return &Volumes{dir: dir, made: map[string]int64{}}
}

// slots are the fake templates' volume slots, over an empty directory.
func (v *Volumes) slots() ([]runtime.Mount, error) {
	empty := filepath.Join(v.dir, "empty")
	if err := os.MkdirAll(empty, 0o755); err != nil {
		return nil, err
	}
	out := make([]runtime.Mount, nodeapi.MaxVolumeMounts)
	for i := range out {
		out[i] = runtime.Mount{Source: empty, Destination: node.SlotPath(i)}
	}
	return out, nil
}

// BuildImage: the fake node builds no image templates.
func (v *Volumes) BuildImage(context.Context, node.ImageTemplateSpec) (snapshot.Manifest, error) {
	return snapshot.Manifest{}, errdefs.Conflictf("the fake node builds no image templates")
}

// PrepareVolumes makes each volume's directory (the first time) and puts
// volume i behind slot i.
func (v *Volumes) PrepareVolumes(_ context.Context, mounts []nodeapi.VolumeMount) ([]engine.Volume, error) {
	if len(mounts) > nodeapi.MaxVolumeMounts {
		return nil, errdefs.Invalidf("too many volume mounts")
	}
	v.mu.Lock()
	defer v.mu.Unlock()
	var out []engine.Volume
	for i, m := range mounts {
		src := filepath.Join(v.dir, "mounts", m.VolumeID)
		if err := os.MkdirAll(src, 0o755); err != nil {
			return nil, err
		}
		v.made[m.VolumeID] = m.SizeBytes
		out = append(out, engine.Volume{Source: src, VolumeMount: snapshot.VolumeMount{
			Volume: m.VolumeID, Slot: node.SlotPath(i), Path: m.Path, ReadOnly: m.ReadOnly, Exclusive: m.Exclusive}})
	}
	return out, nil
}

// DeleteVolume removes a volume's directory.
func (v *Volumes) DeleteVolume(_ context.Context, id string) error {
	v.mu.Lock()
	defer v.mu.Unlock()
	delete(v.made, id)
	v.deleted = append(v.deleted, id)
	return os.RemoveAll(filepath.Join(v.dir, "mounts", id))
}

// Made reports whether the node made the volume, and its size.
func (v *Volumes) Made(id string) (int64, bool) {
	v.mu.Lock()
	defer v.mu.Unlock()
	size, ok := v.made[id]
	return size, ok
}

// Deleted lists the volumes whose content the node was told to delete.
func (v *Volumes) Deleted() []string {
	v.mu.Lock()
	defer v.mu.Unlock()
	return append([]string(nil), v.deleted...)
}

// Dir is the directory behind a volume's mounts.
func (v *Volumes) Dir(id string) string { return filepath.Join(v.dir, "mounts", id) }

// VolumeUsage is the bytes of the files in a volume's directory, and the
// size it was made with.
func (v *Volumes) VolumeUsage(_ context.Context, id string) (nodeapi.VolumeUsage, error) {
	v.mu.Lock()
	size, ok := v.made[id]
	v.mu.Unlock()
	if !ok {
		return nodeapi.VolumeUsage{}, errdefs.NotFoundf("volume %s is not on this node", id)
	}
	var used int64
	err := filepath.WalkDir(filepath.Join(v.dir, "mounts", id), func(_ string, d os.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.Type().IsRegular() {
			fi, err := d.Info()
			if err != nil {
				return err
			}
			used += fi.Size()
		}
		return nil
	})
	return nodeapi.VolumeUsage{UsedBytes: used, CapacityBytes: size}, err
}

// The fake node's volume images (engine.VolumeImages): a directory each,
// beside the volumes' (an image named like a volume is that volume's).

// Flush: a directory has nothing to write back.
func (v *Volumes) Flush(context.Context, string) error { return nil }

// Capture copies the image's directory.
func (v *Volumes) Capture(_ context.Context, image, copy string) error {
	return copyTree(v.Dir(image), v.Dir(copy))
}

// Clone copies the image's directory and returns the copy.
func (v *Volumes) Clone(_ context.Context, src, dst string) (string, error) {
	if err := copyTree(v.Dir(src), v.Dir(dst)); err != nil {
		return "", err
	}
	v.mu.Lock()
	v.made[dst] = 0
	v.mu.Unlock()
	return v.Dir(dst), nil
}

// Remove removes an image's directory.
func (v *Volumes) Remove(_ context.Context, image string) error {
	return os.RemoveAll(v.Dir(image))
}

// Settle renames the image's directory to the volume's.
func (v *Volumes) Settle(_ context.Context, image, volume string) error {
	if _, err := os.Stat(v.Dir(image)); os.IsNotExist(err) {
		return nil
	}
	if err := os.RemoveAll(v.Dir(volume)); err != nil {
		return err
	}
	return os.Rename(v.Dir(image), v.Dir(volume))
}

// Images lists the images' directories.
func (v *Volumes) Images(context.Context) ([]string, error) {
	ents, err := os.ReadDir(filepath.Join(v.dir, "mounts"))
	if os.IsNotExist(err) {
		return nil, nil
	}
	var out []string
	for _, e := range ents {
		out = append(out, e.Name())
	}
	return out, err
}

func copyTree(src, dst string) error {
	if _, err := os.Stat(src); err != nil {
		return errdefs.NotFoundf("volume image %s", filepath.Base(src))
	}
	return os.CopyFS(dst, os.DirFS(src))
}

// Deps is the fake node's side of snapshot dependencies (snapsync.Deps):
// volume copies travel as the real node's do (a directory each here); the
// fake nodes share one root filesystem and runtime, so those are always
// here and publish as empty directories.
func (v *Volumes) Deps() snapsync.Deps { return volumeDeps{v} }

type volumeDeps struct{ v *Volumes }

func (d volumeDeps) Has(dep snapsync.Dep) bool {
	if dep.Kind != snapsync.DepVolume {
		return true
	}
	_, err := os.Stat(d.v.Dir(dep.ID))
	return err == nil
}

func (d volumeDeps) Dir(dep snapsync.Dep) (string, map[string]string, error) {
	if dep.Kind != snapsync.DepVolume {
		dir := filepath.Join(d.v.dir, "deps-empty")
		return dir, nil, os.MkdirAll(dir, 0o755)
	}
	if _, err := os.Stat(d.v.Dir(dep.ID)); err != nil {
		return "", nil, errdefs.NotFoundf("volume copy %s", dep.ID)
	}
	return d.v.Dir(dep.ID), nil, nil
}

func (d volumeDeps) Install(ctx context.Context, dep snapsync.Dep, _ map[string]string, fill func(dir string) error) error {
	if dep.Kind != snapsync.DepVolume {
		return errdefs.Invalidf("the fake node installs no %s", dep.Kind)
	}
	tmp := d.v.Dir(dep.ID) + ".tmp"
	if err := os.RemoveAll(tmp); err != nil {
		return err
	}
	if err := os.MkdirAll(filepath.Dir(tmp), 0o755); err != nil {
		return err
	}
	if err := fill(tmp); err != nil { // fill makes it
		os.RemoveAll(tmp)
		return err
	}
	return os.Rename(tmp, d.v.Dir(dep.ID))
}

func (d volumeDeps) Hold() func() { return func() {} }

package engine

import (
	"context"
	"fmt"
	"slices"
	"strings"

	"github.com/spore-run/spore/internal/errdefs"
	"github.com/spore-run/spore/internal/ids"
	"github.com/spore-run/spore/internal/runtime"
	"github.com/spore-run/spore/internal/snapshot"
)

// Exclusive volumes (docs/volumes.md): a volume mounted read-write by one
// sandbox whose content is part of every snapshot of it. The content
// lives in volume images on the node (VolumeImages, the node's pool); the
// engine decides when they are copied and whose they are:
//
//   - a snapshot or fork freezes the sandbox (pause), copies each such
//     volume's image (copyName: c-<snapshot or fork key>-<volume>), then
//     checkpoints, then lets it run: memory and volume are of one instant;
//     a snapshot's manifest names its copies (VolumeMount.Copy), which go
//     with the snapshot;
//   - a new sandbox restored from such an image (a fork child, a create
//     from the snapshot) gets a new volume, ids.Derive('v', sandbox,
//     volume), made from the copy: the control plane derives the same ID
//     for the volume's record;
//   - a rollback keeps the sandbox's volume and gives the new instance a
//     new image of it from the snapshot's copy (rollbackImage); the image
//     it replaces goes with the replaced instance, and the image becomes
//     the volume's own (settled under the volume's ID) when the sandbox
//     goes. Both ride on the cleanup journal's instance entries, so a
//     crash never loses the volume's content nor leaves it twice.
//
// Images of these two shapes that nothing names (a capture or a rollback
// a crash interrupted) are removed at Open.

// VolumeImages keeps volume images: the node's volume pool.
type VolumeImages interface {
	// Flush writes the image's dirty data back while its writers run:
	// the capture that follows, with them paused, writes back the rest.
	Flush(ctx context.Context, image string) error
	// Capture copies the mounted image to the new image copy as it is now
	// (its writers are paused).
	Capture(ctx context.Context, image, copy string) error
	// Clone makes the new image dst from the image src (a copy: no writer)
	// and mounts it read-write; it returns the mount, a slot's source.
	Clone(ctx context.Context, src, dst string) (string, error)
	// Remove deletes an image (unmounted first); a missing one is not an
	// error.
	Remove(ctx context.Context, image string) error
	// Settle makes image the volume's own image (replacing it, both
	// unmounted first); done already (image gone, volume there) is not an
	// error.
	Settle(ctx context.Context, image, volume string) error
	// Images lists the images.
	Images(ctx context.Context) ([]string, error)
}

const (
	copyPrefix     = "c-"
	rollbackPrefix = "r-"
)

// copyName is the image that holds volume's content for the snapshot (or
// fork) key.
func copyName(key, volume string) string { return copyPrefix + key + "-" + volume }

// rollbackImage is the image of volume that instance, a rollback's, runs
// with.
func rollbackImage(instance, volume string) string { return rollbackPrefix + instance + "-" + volume }

// IsVolumeCopy reports whether an image holds a snapshot's content, not
// a sandbox's volume: the node never mounts it.
func IsVolumeCopy(image string) bool { return strings.HasPrefix(image, copyPrefix) }

// capturesVolumes reports whether run has volumes captured with its
// snapshots.
func capturesVolumes(run snapshot.RunConfig) bool {
	return slices.ContainsFunc(run.Volumes, snapshot.VolumeMount.Captured)
}

// flushVolumes writes back the captured volumes' dirty data before the
// sandbox is paused for their capture (a failure only makes the pause
// longer: logged).
func (e *Engine) flushVolumes(ctx context.Context, run snapshot.RunConfig) {
	if e.vols == nil {
		return
	}
	for _, v := range run.Volumes {
		if v.Captured() {
			if err := e.vols.Flush(ctx, v.ImageName()); err != nil {
				e.log.Warn("flush a volume before its capture", "volume", v.Volume, "err", err)
			}
		}
	}
}

// captureVolumes copies each captured volume of run (its instance paused)
// into its image for key, and returns run with the copies named. On
// failure the copies made are removed.
func (e *Engine) captureVolumes(ctx context.Context, run snapshot.RunConfig, key string) (snapshot.RunConfig, error) {
	if !capturesVolumes(run) {
		return run, nil
	}
	if e.vols == nil {
		return run, errdefs.Unavailablef("this node keeps no volume images: exclusive volumes cannot be captured")
	}
	run.Volumes = slices.Clone(run.Volumes)
	for i, v := range run.Volumes {
		if !v.Captured() {
			continue
		}
		c := copyName(key, v.Volume)
		if err := e.vols.Capture(ctx, v.ImageName(), c); err != nil {
			e.dropCopies(run)
			return run, fmt.Errorf("capture volume %s: %w", v.Volume, err)
		}
		run.Volumes[i].Copy = c
	}
	return run, nil
}

// dropCopies removes the copies run names (a failed capture's, a fork's
// once its children are made, a deleted snapshot's); a failure is logged
// (Open removes what nothing names).
func (e *Engine) dropCopies(run snapshot.RunConfig) {
	if e.vols == nil {
		return
	}
	ctx, cancel := cleanupCtx()
	defer cancel()
	for _, v := range run.Volumes {
		if v.Copy == "" {
			continue
		}
		if err := e.vols.Remove(ctx, v.Copy); err != nil {
			e.log.Warn("volume copy left", "image", v.Copy, "err", err)
		}
	}
}

// volumesForNew gives a new sandbox restored from run (a fork child, a
// create from a snapshot) its own volume for each captured one, made from
// the copy: run is changed in place (mounts and volumes cloned first).
// It returns the images made, for the caller to remove on failure.
func (e *Engine) volumesForNew(ctx context.Context, sandbox string, run *snapshot.RunConfig) ([]string, error) {
	if !hasCopies(*run) {
		return nil, nil
	}
	if e.vols == nil {
		return nil, errdefs.Unavailablef("this node keeps no volume images: exclusive volumes cannot be restored")
	}
	run.Volumes, run.Mounts = slices.Clone(run.Volumes), slices.Clone(run.Mounts)
	var made []string
	for i, v := range run.Volumes {
		if v.Copy == "" {
			continue
		}
		vol := ids.Derive('v', sandbox, v.Volume)
		// Nothing of the new sandbox exists yet (it is claimed): an image
		// of this name is a failed attempt's.
		if err := e.vols.Remove(ctx, vol); err != nil {
			return made, err
		}
		if err := e.cloneBehind(ctx, run, v.Slot, v.Copy, vol); err != nil {
			return made, fmt.Errorf("copy volume %s for %s: %w", v.Volume, sandbox, err)
		}
		made = append(made, vol)
		run.Volumes[i] = snapshot.VolumeMount{Volume: vol, Slot: v.Slot, Path: v.Path, Exclusive: true}
	}
	return made, nil
}

// volumesForRollback is the run a rollback of a sandbox running with cur
// restores: to's, with each captured volume the sandbox's own (the one in
// the same slot) behind a new image made from the snapshot's copy for
// instance. A captured volume the sandbox does not hold in that slot is
// ErrInvalidArgument. It returns the images made.
func (e *Engine) volumesForRollback(ctx context.Context, instance string, cur, to snapshot.RunConfig) (snapshot.RunConfig, []string, error) {
	run := to
	run.Volumes = slices.Clone(to.Volumes)
	for i := range run.Volumes {
		run.Volumes[i].Copy = "" // the copy stays the snapshot's
	}
	if !hasCopies(to) {
		return run, nil, nil
	}
	if e.vols == nil {
		return run, nil, errdefs.Unavailablef("this node keeps no volume images: exclusive volumes cannot be restored")
	}
	run.Mounts = slices.Clone(to.Mounts)
	var made []string
	for i, v := range to.Volumes {
		if v.Copy == "" {
			continue
		}
		j := slices.IndexFunc(cur.Volumes, func(c snapshot.VolumeMount) bool { return c.Slot == v.Slot && c.Captured() })
		if j < 0 {
			return run, made, errdefs.Invalidf("the snapshot holds exclusive volume %s at %s, which this sandbox does not hold there: roll back to a snapshot of this sandbox", v.Volume, v.Path)
		}
		img := rollbackImage(instance, cur.Volumes[j].Volume)
		if err := e.cloneBehind(ctx, &run, v.Slot, v.Copy, img); err != nil {
			return run, made, fmt.Errorf("copy volume %s back: %w", cur.Volumes[j].Volume, err)
		}
		made = append(made, img)
		run.Volumes[i] = snapshot.VolumeMount{Volume: cur.Volumes[j].Volume, Image: img, Slot: v.Slot, Path: v.Path, Exclusive: true}
	}
	return run, made, nil
}

// removeImages removes images a failed operation made (logged on failure).
func (e *Engine) removeImages(images []string) {
	if len(images) == 0 || e.vols == nil {
		return
	}
	ctx, cancel := cleanupCtx()
	defer cancel()
	for _, img := range images {
		if err := e.vols.Remove(ctx, img); err != nil {
			e.log.Warn("volume image left", "image", img, "err", err)
		}
	}
}

// cloneBehind makes image from the copy and puts it behind run's volume
// slot (the slot's mount is changed in place).
func (e *Engine) cloneBehind(ctx context.Context, run *snapshot.RunConfig, slot, copy, image string) error {
	k := slices.IndexFunc(run.Mounts, func(m runtime.Mount) bool { return m.Destination == slot })
	if k < 0 {
		return errdefs.Invalidf("no volume slot %s", slot)
	}
	src, err := e.vols.Clone(ctx, copy, image)
	if err != nil {
		return err
	}
	run.Mounts[k].Source = src
	return nil
}

// hasCopies reports whether run names volume copies (a snapshot's).
func hasCopies(run snapshot.RunConfig) bool {
	return slices.ContainsFunc(run.Volumes, func(v snapshot.VolumeMount) bool { return v.Copy != "" })
}

// imageActions is what goes with an instance that ran with run when it is
// freed: a rollback's image it replaced is removed (replaced), the
// image of a sandbox that goes becomes its volume's own (gone).
func imageActions(run snapshot.RunConfig, gone bool) []ImageAction {
	var out []ImageAction
	for _, v := range run.Volumes {
		if v.Image == "" || v.Image == v.Volume {
			continue
		}
		if gone {
			out = append(out, ImageAction{Image: v.Image, SettleAs: v.Volume})
		} else {
			out = append(out, ImageAction{Image: v.Image})
		}
	}
	return out
}

// ImageAction is a volume image to free with an instance: removed, or
// settled as its volume's own image (SettleAs).
type ImageAction struct {
	Image    string `json:"image"`
	SettleAs string `json:"settle_as,omitempty"`
}

func (e *Engine) runImageActions(ctx context.Context, acts []ImageAction) error {
	if len(acts) == 0 {
		return nil
	}
	if e.vols == nil {
		return errdefs.Unavailablef("no volume images on this node")
	}
	for _, a := range acts {
		var err error
		if a.SettleAs != "" {
			err = e.vols.Settle(ctx, a.Image, a.SettleAs)
		} else {
			err = e.vols.Remove(ctx, a.Image)
		}
		if err != nil {
			return fmt.Errorf("volume image %s: %w", a.Image, err)
		}
	}
	return nil
}

// removeStrayImages removes the copies and rollback images nothing names
// (no manifest, no record, no cleanup entry): what a crash during a
// capture, a fork or a rollback left. Run at Open, after recovery.
func (e *Engine) removeStrayImages(ctx context.Context) {
	if e.vols == nil {
		return
	}
	imgs, err := e.vols.Images(ctx)
	if err != nil {
		e.log.Warn("list volume images: strays not removed", "err", err)
		return
	}
	named := map[string]bool{}
	for _, m := range e.snaps.List() {
		for _, v := range m.Run.Volumes {
			named[v.Copy] = true
		}
	}
	e.mu.Lock()
	for _, r := range e.records {
		for _, v := range r.Run.Volumes {
			named[v.Image] = true
		}
	}
	e.mu.Unlock()
	for _, c := range e.PendingCleanups() {
		for _, a := range c.Images {
			named[a.Image] = true
		}
	}
	for _, img := range imgs {
		if (strings.HasPrefix(img, copyPrefix) || strings.HasPrefix(img, rollbackPrefix)) && !named[img] {
			e.log.Warn("removing stray volume image", "image", img)
			if err := e.vols.Remove(ctx, img); err != nil {
				e.log.Warn("stray volume image left", "image", img, "err", err)
			}
		}
	}
}

// volumesForWake is the run a hibernated sandbox wakes with, from its
// hibernation's run hib (whose exclusive volumes were captured with it):
// on its own node its volumes' images are where the capture left them,
// and the copies only go; a sandbox taken over from another node (Adopt)
// gets each such volume made here, under the volume's own ID, from the
// hibernation's copy. It returns the images made (for the caller to
// remove on failure) and the copies to remove once it runs.
func (e *Engine) volumesForWake(ctx context.Context, rec *record, hib snapshot.RunConfig) (snapshot.RunConfig, []string, []ImageAction, error) {
	run := hib
	if !hasCopies(hib) {
		return run, nil, nil, nil
	}
	run.Volumes, run.Mounts = slices.Clone(hib.Volumes), slices.Clone(hib.Mounts)
	adopted := rec.Source == adoptSource(rec.Hibernation)
	var made []string
	var copies []ImageAction
	for i, v := range hib.Volumes {
		if v.Copy == "" {
			continue
		}
		copies = append(copies, ImageAction{Image: v.Copy})
		run.Volumes[i].Copy = ""
		if !adopted {
			continue
		}
		if e.vols == nil {
			return run, made, nil, errdefs.Unavailablef("this node keeps no volume images: exclusive volumes cannot be restored")
		}
		// An image of this name is a failed wake's: nothing else here
		// has the volume (its content came with the sandbox).
		if err := e.vols.Remove(ctx, v.Volume); err != nil {
			return run, made, nil, err
		}
		if err := e.cloneBehind(ctx, &run, v.Slot, v.Copy, v.Volume); err != nil {
			return run, made, nil, fmt.Errorf("make volume %s from the hibernation's copy: %w", v.Volume, err)
		}
		made = append(made, v.Volume)
		run.Volumes[i].Image = ""
	}
	return run, made, copies, nil
}

// hibernationCopies are the copies of exclusive volumes rec's hibernation
// holds, to remove with it.
func (e *Engine) hibernationCopies(rec *record) []ImageAction {
	if rec.Hibernation == "" {
		return nil
	}
	m, err := e.snaps.Get(rec.Hibernation)
	if err != nil {
		return nil // gone already; Open removes a copy nothing names
	}
	var out []ImageAction
	for _, v := range m.Run.Volumes {
		if v.Copy != "" {
			out = append(out, ImageAction{Image: v.Copy})
		}
	}
	return out
}

// adoptedRun is the run recorded for a sandbox taken over from another
// node with its hibernation's run hib: its exclusive volumes will be
// made here under their own IDs when it wakes (volumesForWake), so no
// image of the other node's is named. A captured volume without a copy
// (hibernated by a release that did not capture them) cannot move: its
// content is only on its node.
func adoptedRun(hib snapshot.RunConfig) (snapshot.RunConfig, error) {
	run := hib
	run.Volumes = slices.Clone(hib.Volumes)
	for i, v := range run.Volumes {
		if v.Captured() && v.Copy == "" {
			return run, errdefs.Conflictf("exclusive volume %s was not captured with the hibernation: the sandbox resumes on its own node only", v.Volume)
		}
		run.Volumes[i].Copy, run.Volumes[i].Image = "", ""
	}
	return run, nil
}

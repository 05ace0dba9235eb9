package engine

import (
	"slices"
	"strings"

	"github.com/spore-run/spore/internal/envd"
	"github.com/spore-run/spore/internal/errdefs"
	"github.com/spore-run/spore/internal/runtime"
	"github.com/spore-run/spore/internal/snapshot"
)

// Volume is a volume to show in a new sandbox: Source, a host directory
// the node prepared (the volume's mount, or a read-only view of it), is
// put behind the template's volume slot Slot, and the sandbox's daemon
// binds the slot at Path.
type Volume struct {
	snapshot.VolumeMount
	Source string
}

// withVolumes returns run with the volumes behind their slots: the
// template's mounts copied with each slot's source replaced. A slot the
// template lacks (a template built before volume slots) or a slot asked
// twice is ErrInvalidArgument; a run that has volumes already (a snapshot
// of a sandbox with volumes: they come with it) takes no others.
func withVolumes(run snapshot.RunConfig, template string, vols []Volume) (snapshot.RunConfig, error) {
	if len(vols) == 0 {
		return run, nil
	}
	if len(run.Volumes) > 0 {
		return run, errdefs.Invalidf("%s already mounts volumes (a snapshot of a sandbox with volumes brings them): mount none at create", template)
	}
	run.Mounts = slices.Clone(run.Mounts)
	run.Volumes = nil
	for _, v := range vols {
		if !strings.HasPrefix(v.Slot, envd.SlotPrefix) {
			return run, errdefs.Invalidf("%s is not a volume slot", v.Slot)
		}
		i := slices.IndexFunc(run.Mounts, func(m runtime.Mount) bool { return m.Destination == v.Slot })
		if i < 0 {
			return run, errdefs.Invalidf("template %s has no volume slot %s: rebuild it to mount volumes", template, v.Slot)
		}
		if slices.ContainsFunc(run.Volumes, func(m snapshot.VolumeMount) bool { return m.Slot == v.Slot }) {
			return run, errdefs.Invalidf("volume slot %s asked twice", v.Slot)
		}
		run.Mounts[i].Source = v.Source
		run.Volumes = append(run.Volumes, v.VolumeMount)
	}
	return run, nil
}

// daemonVolumes is what the sandbox's daemon binds at /init.
func daemonVolumes(run snapshot.RunConfig) []envd.VolumeMount {
	var out []envd.VolumeMount
	for _, v := range run.Volumes {
		out = append(out, envd.VolumeMount{Slot: v.Slot, Path: v.Path, ReadOnly: v.ReadOnly})
	}
	return out
}

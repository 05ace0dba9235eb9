package engine

import (
	"testing"

	"github.com/spore-run/spore/internal/errdefs"
	"github.com/spore-run/spore/internal/runtime"
	"github.com/spore-run/spore/internal/snapshot"
)

// A create's volumes go behind the template's slots (the template's own
// mounts untouched); a slot the template lacks, a slot asked twice, and
// volumes asked of a snapshot that brings its own are refused.
func TestWithVolumes(t *testing.T) {
	tpl := snapshot.RunConfig{Mounts: []runtime.Mount{
		{Source: "/envd", Destination: "/opt/spore", ReadOnly: true},
		{Source: "/empty", Destination: "/run/spore/volumes/0"},
		{Source: "/empty", Destination: "/run/spore/volumes/1"},
	}}
	vol := func(slot, src, path string) Volume {
		return Volume{VolumeMount: snapshot.VolumeMount{Volume: "v1", Slot: slot, Path: path}, Source: src}
	}
	run, err := withVolumes(tpl, "base", []Volume{vol("/run/spore/volumes/1", "/pool/mounts/v1", "/data")})
	if err != nil {
		t.Fatal(err)
	}
	if run.Mounts[2].Source != "/pool/mounts/v1" || run.Mounts[1].Source != "/empty" || tpl.Mounts[2].Source != "/empty" {
		t.Fatalf("mounts %+v (template's %+v)", run.Mounts, tpl.Mounts)
	}
	if len(run.Volumes) != 1 || run.Volumes[0].Path != "/data" || len(daemonVolumes(run)) != 1 || daemonVolumes(run)[0].Slot != "/run/spore/volumes/1" {
		t.Fatalf("volumes %+v", run.Volumes)
	}
	if same, err := withVolumes(tpl, "base", nil); err != nil || len(same.Volumes) != 0 {
		t.Fatalf("no volumes: %+v %v", same, err)
	}
	for name, c := range map[string]struct {
		run  snapshot.RunConfig
		vols []Volume
	}{
		"no such slot": {tpl, []Volume{vol("/run/spore/volumes/7", "/x", "/data")}},
		"slot twice":   {tpl, []Volume{vol("/run/spore/volumes/0", "/x", "/a"), vol("/run/spore/volumes/0", "/y", "/b")}},
		"has its own":  {run, []Volume{vol("/run/spore/volumes/0", "/x", "/a")}},
		"not a slot":   {tpl, []Volume{vol("/opt/spore/x", "/x", "/a")}},
		"daemon mount": {tpl, []Volume{vol("/opt/spore", "/x", "/a")}},
	} {
		if _, err := withVolumes(c.run, "base", c.vols); !errdefs.IsInvalidArgument(err) {
			t.Errorf("%s: %v, want refused", name, err)
		}
	}
}

package gvisor

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"

	"github.com/spore-run/spore/internal/errdefs"
	"github.com/spore-run/spore/internal/runtime"
	"github.com/spore-run/spore/internal/timing"
)

var _ runtime.Precreator = (*Driver)(nil)

// Precreate implements runtime.Precreator with `runsc create`: the gofer
// and the sandbox process start, the sentry boots and waits for its
// container to be started. `runsc restore` of an existing created
// container skips all of that and only loads the image into it
// (../shared/notes/restore-internals.md: a tiny restore's command 142 ->
// 71-83 ms on this kind of host).
//
// What the restore must match is fixed here: the bundle (mounts, limits,
// cgroup, network namespace, hostname), the overlay and network flags, and
// the stdio type (an unlinked file, as `runsc run` and `runsc restore`
// get). The driver keeps what it created with and refuses a restore whose
// spec differs.
func (d *Driver) Precreate(ctx context.Context, spec runtime.Spec) error {
	done := timing.Track(ctx, "prepare")
	err := d.prepare(spec)
	done()
	if err != nil {
		return err
	}
	shape, err := d.shapeOf(spec)
	if err != nil {
		d.cleanup(spec.ID)
		return err
	}
	if err := os.WriteFile(d.precreatedFile(spec.ID), shape, 0o600); err != nil {
		d.cleanup(spec.ID)
		return fmt.Errorf("instance %s: %w", spec.ID, err)
	}
	_, err = d.runscIn(ctx, spec.ID, d.cfg.SlowTimeout, d.startFlags(spec, "create", "--bundle", d.bundleDir(spec.ID), spec.ID)...)
	if err != nil {
		d.abandon(spec.ID)
		return fmt.Errorf("pre-create instance %s: %w", spec.ID, err)
	}
	return nil
}

func (d *Driver) precreatedFile(id string) string { return filepath.Join(d.instDir(id), "precreated") }

// shapeOf is what a restore into a pre-created instance must match: the
// OCI spec the driver writes for it and the flags runsc gets, but for Env
// and Hostname (runtime.RestoreShape: runsc's restore does not use them;
// the bundle keeps the pre-created ones).
func (d *Driver) shapeOf(spec runtime.Spec) ([]byte, error) {
	id, netNS := spec.ID, spec.NetNS
	spec = runtime.RestoreShape(spec)
	spec.ID, spec.NetNS = id, netNS // the instance's own: they must match too
	parent := d.cfg.CgroupParent
	if d.managed {
		parent = ""
	}
	build, err := d.buildFor(spec)
	if err != nil {
		return nil, err
	}
	b, err := json.Marshal(struct {
		OCI   any      `json:"oci"`
		Flags []string `json:"flags"`
		Alert string   `json:"alert,omitempty"`
		Build string   `json:"build"`
	}{ociSpec(spec, parent), d.startFlags(spec), spec.MemoryAlertSignal, build})
	if err != nil {
		return nil, fmt.Errorf("instance %s: %w", spec.ID, err)
	}
	return b, nil
}

// precreated reports whether id is a pre-created instance not yet
// restored into, and if so whether spec is the one it was created with.
func (d *Driver) precreated(spec runtime.Spec) (ok bool, err error) {
	if err := d.checkID(spec.ID); err != nil {
		return false, err
	}
	had, rerr := os.ReadFile(d.precreatedFile(spec.ID))
	if rerr != nil || !d.exists(spec.ID) {
		return false, nil
	}
	want, err := d.shapeOf(spec)
	if err != nil {
		return true, err
	}
	if !bytes.Equal(had, want) {
		return true, errdefs.Conflictf("instance %s was pre-created for another spec (root filesystem, mounts, limits, network, process or runsc build differ)", spec.ID)
	}
	return true, nil
}

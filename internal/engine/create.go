package engine

import (
	"bytes"
	"context"
	"fmt"
	"net/netip"
	"reflect"
	"time"

	"github.com/spore-run/spore/internal/errdefs"
	"github.com/spore-run/spore/internal/ids"
	"github.com/spore-run/spore/internal/netns"
	"github.com/spore-run/spore/internal/rootfs"
	"github.com/spore-run/spore/internal/runtime"
	"github.com/spore-run/spore/internal/snapshot"
)

// TemplateSpec describes a template to build.
type TemplateSpec struct {
	Name   string
	RootFS string // name of the root filesystem (default "base")
	Run    snapshot.RunConfig
	// Ready is run in the sandbox until it exits 0; then the snapshot is
	// taken. Empty means ready as soon as it boots.
	Ready        []string
	ReadyTimeout time.Duration // default 60s
	// Prepare, when set, runs once the readiness check passed, before the
	// snapshot, with the address of the build instance's daemon: what it
	// changes in the sandbox (the daemon's defaults, a started process)
	// is in every sandbox of the template.
	Prepare func(ctx context.Context, addr netip.Addr) error
}

// BuildTemplate boots a root filesystem with the start command, waits for
// the readiness check and snapshots the result as a template. A template
// with the same name is replaced (sandboxes already created from it are not
// affected); the old one is deleted unless a restore is reading it.
func (e *Engine) BuildTemplate(ctx context.Context, spec TemplateSpec) (snapshot.Manifest, error) {
	if err := ids.ValidateName("template name", spec.Name); err != nil {
		return snapshot.Manifest{}, err
	}
	if spec.RootFS == "" {
		spec.RootFS = "base"
	}
	if len(spec.Run.Args) == 0 {
		return snapshot.Manifest{}, errdefs.Invalidf("template %s: empty start command", spec.Name)
	}
	if spec.ReadyTimeout <= 0 {
		spec.ReadyTimeout = 60 * time.Second
	}
	stamp, err := rootfs.Lookup(e.rootfsDir, spec.RootFS)
	if err != nil {
		return snapshot.Manifest{}, err
	}
	old, oldErr := e.snaps.Get(spec.Name)
	// The build instance has no record: if the engine dies mid-build, the
	// next Open removes it as an orphan.
	instance := ids.New('b')
	log := e.log.With("template_id", spec.Name, "instance", instance)
	rs := runtime.Spec{
		ID: instance, RootFS: rootfs.Path(e.rootfsDir, spec.RootFS), Args: spec.Run.Args, Env: spec.Run.Env,
		Cwd: spec.Run.Cwd, User: spec.Run.User, Hostname: spec.Run.Hostname, Limits: spec.Run.Limits,
		Mounts: spec.Run.Mounts, MemoryAlertSignal: spec.Run.MemoryAlertSignal, Build: e.currentBuild(),
	}
	spec.Run.AccessToken = "" // a template's daemon has no token until /init
	start := time.Now()
	addr, err := e.launch(ctx, instance, rs, "", netns.Policy{Internet: true})
	if err != nil {
		return snapshot.Manifest{}, fmt.Errorf("template %s: boot: %w", spec.Name, err)
	}
	defer func() {
		cctx, cancel := cleanupCtx()
		defer cancel()
		_ = e.killInstance(cctx, instance)
	}()
	if err := e.waitReady(ctx, instance, spec); err != nil {
		return snapshot.Manifest{}, err
	}
	if spec.Prepare != nil {
		if !addr.IsValid() {
			return snapshot.Manifest{}, errdefs.Invalidf("template %s: a prepare step needs the engine's network", spec.Name)
		}
		if err := spec.Prepare(ctx, addr); err != nil {
			return snapshot.Manifest{}, fmt.Errorf("template %s: %w", spec.Name, err)
		}
	}
	st, err := e.snaps.Stage(ids.New('s'))
	if err != nil {
		return snapshot.Manifest{}, err
	}
	defer st.Abort()
	if err := e.rt.Checkpoint(ctx, instance, st.ImageDir(), runtime.CheckpointOptions{}); err != nil {
		return snapshot.Manifest{}, fmt.Errorf("template %s: %w", spec.Name, err)
	}
	m, err := st.Commit(snapshot.Manifest{
		Names: []string{spec.Name}, Kind: snapshot.KindTemplate, Template: spec.Name,
		RootFS: spec.RootFS, RootFSID: stamp.ID, Runtime: e.rt.Name(), RuntimeBuild: rs.Build, Run: spec.Run,
	}, snapshot.CommitOptions{MoveNames: true})
	if err != nil {
		return snapshot.Manifest{}, err
	}
	log.Info("template built", "snapshot_id", m.ID, "took", time.Since(start), "size", m.SizeBytes)
	if oldErr == nil && old.Kind == snapshot.KindTemplate {
		if err := e.DeleteSnapshot(ctx, old.ID); err != nil {
			log.Warn("old template kept", "snapshot_id", old.ID, "err", err)
		}
	}
	return m, nil
}

// EnsureTemplate builds the template unless one with this name exists, was
// made over the current build of its root filesystem with the current
// runtime build (an older one still restores, over the versions kept for
// it, but new sandboxes get the new ones), and was built from the same
// start command, mounts and limits. It reports whether it built.
func (e *Engine) EnsureTemplate(ctx context.Context, spec TemplateSpec) (snapshot.Manifest, bool, error) {
	if m, err := e.snaps.Get(spec.Name); err == nil {
		rootFS := spec.RootFS
		if rootFS == "" {
			rootFS = "base"
		}
		// Limits too: a template built before /dev/shm had a size has
		// none in its manifest and is rebuilt with one.
		same := reflect.DeepEqual(m.Run.Args, spec.Run.Args) && reflect.DeepEqual(m.Run.Mounts, spec.Run.Mounts) &&
			m.Run.Limits == spec.Run.Limits && m.Run.MemoryAlertSignal == spec.Run.MemoryAlertSignal && m.RootFS == rootFS
		if e.current(m) && same && m.Kind == snapshot.KindTemplate {
			return m, false, nil
		}
	} else if !errdefs.IsNotFound(err) {
		return snapshot.Manifest{}, false, err
	}
	m, err := e.BuildTemplate(ctx, spec)
	return m, err == nil, err
}

func (e *Engine) waitReady(ctx context.Context, instance string, spec TemplateSpec) error {
	if len(spec.Ready) == 0 {
		return nil
	}
	ctx, cancel := context.WithTimeout(ctx, spec.ReadyTimeout)
	defer cancel()
	var out bytes.Buffer
	for {
		out.Reset()
		code, err := e.rt.Exec(ctx, instance, runtime.ExecSpec{Args: spec.Ready, Stdout: &out, Stderr: &out, User: spec.Run.User})
		if err == nil && code == 0 {
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("template %s: readiness check %q did not pass within %v (last exit %d, %v): %s: %w",
				spec.Name, spec.Ready, spec.ReadyTimeout, code, err, out.String(), errdefs.ErrUnavailable)
		case <-time.After(50 * time.Millisecond):
		}
	}
}

// CreateOptions tune Create.
type CreateOptions struct {
	// Template is a template name or any snapshot's ID or name.
	Template string
	// Env is added to the sandbox's default environment for commands.
	Env []string
	// VCPUs and MemoryMB, when set, override the template's limits (they
	// are host-side and apply to a restored sandbox; the disk size and the
	// process limit are part of the image).
	VCPUs    float64
	MemoryMB int64
	// Policy is the egress policy (default: internet allowed).
	Policy *netns.Policy
	// AccessToken for the sandbox's daemon (generated when empty).
	AccessToken string
	// ID is the sandbox's ID, minted by the caller (generated when
	// empty). A create with the ID of an existing sandbox made from the
	// same template or snapshot returns that sandbox (a replay: no
	// second instance); one made from another source is ErrAlreadyExists.
	ID string
	// Volumes are shown in the sandbox (behind the template's volume
	// slots); a snapshot's own volumes come with it.
	Volumes []Volume
}

// Create makes a new sandbox by restoring a template (or any snapshot): its
// processes continue from the moment the snapshot was taken.
func (e *Engine) Create(ctx context.Context, opts CreateOptions) (Sandbox, error) {
	if opts.Template == "" {
		return Sandbox{}, errdefs.Invalidf("create: template is required")
	}
	if opts.VCPUs < 0 || opts.MemoryMB < 0 {
		return Sandbox{}, errdefs.Invalidf("create: negative resource limit")
	}
	id := opts.ID
	if id == "" {
		id = ids.New('i')
	}
	// Held across the restore: a replay of this create waits for it.
	existing, unlock, err := e.claim(ctx, id)
	if err != nil {
		return Sandbox{}, err
	}
	defer unlock()
	m, release, err := e.acquireSnapshot(opts.Template)
	if existing != nil {
		if release != nil {
			release()
		}
		return e.replayCreate(existing, opts, m, err)
	}
	if err != nil {
		return Sandbox{}, err
	}
	defer release()
	if m.Kind == snapshot.KindHibernation {
		return Sandbox{}, errdefs.Invalidf("snapshot %s holds a hibernated sandbox: resume that sandbox instead", m.ID)
	}
	run := m.Run
	run.Env = append(append([]string(nil), run.Env...), opts.Env...)
	if opts.VCPUs > 0 {
		run.Limits.VCPUs = opts.VCPUs
	}
	if opts.MemoryMB > 0 {
		run.Limits.MemoryMB = opts.MemoryMB
	}
	template := m.Template
	if template == "" {
		template = m.ID
	}
	policy := netns.Policy{Internet: true}
	if opts.Policy != nil {
		policy = *opts.Policy
	}
	run.AccessToken = opts.AccessToken
	if run.AccessToken == "" {
		run.AccessToken = newToken()
	}
	if run, err = withVolumes(run, opts.Template, opts.Volumes); err != nil {
		return Sandbox{}, err
	}
	// A snapshot's exclusive volumes come as new volumes of this sandbox,
	// at the snapshot's instant (exclusive.go).
	made, err := e.volumesForNew(ctx, id, &run)
	if err != nil {
		e.removeImages(made)
		return Sandbox{}, fmt.Errorf("sandbox %s: %w", id, err)
	}
	rec := &record{
		ID: id, State: StateRunning, Template: template, Parent: m.ID, Source: m.ID,
		RootFS: m.RootFS, RootFSID: m.RootFSID, Run: run, CreatedAt: time.Now().UTC(), Policy: policy,
	}
	if err := e.restoreNew(ctx, rec, m, m.ID, e.snaps.ImageDir(m.ID), m.Run.AccessToken); err != nil {
		e.removeImages(made)
		return Sandbox{}, err
	}
	return rec.view(), nil
}

// replayCreate answers a create whose ID names an existing sandbox: the
// sandbox, when it was made from the same source (m, resolved from
// opts.Template; mErr when that failed), else ErrAlreadyExists.
func (e *Engine) replayCreate(rec *record, opts CreateOptions, m snapshot.Manifest, mErr error) (Sandbox, error) {
	same := mErr == nil && rec.Source == m.ID
	if rec.Source == "" && mErr == nil { // a record from before sources were kept
		same = rec.Template == m.Template || rec.Template == m.ID
	}
	if !same {
		return Sandbox{}, fmt.Errorf("sandbox %s exists, made from %s, not %s: %w", rec.ID, rec.Template, opts.Template, errdefs.ErrAlreadyExists)
	}
	return rec.view(), nil
}

// restoreNew brings a new sandbox to life from an image: journal the
// create, restore, re-initialise its daemon, commit. On failure nothing is
// left. imageToken is the daemon token held in the image.
func (e *Engine) restoreNew(ctx context.Context, rec *record, m snapshot.Manifest, parent, image, imageToken string) error {
	instance := rec.newInstance()
	spec, err := e.instanceSpec(instance, m)
	if err != nil {
		return err
	}
	spec.Limits = rec.Run.Limits
	spec.Mounts = rec.Run.Mounts // with its volumes behind their slots
	rec.RuntimeBuild = spec.Build
	defer e.claimTarget(&spec, rec.Run.Volumes)()
	instance = spec.ID
	rec.Pending = &pending{Op: opCreate, Instance: instance, Started: time.Now().UTC()}
	if err := e.save(rec); err != nil {
		return err
	}
	addr, err := e.launch(ctx, rec.ID, spec, image, rec.Policy)
	if err != nil {
		_ = e.forget(rec.ID)
		return fmt.Errorf("sandbox %s: restore from %s: %w", rec.ID, parent, err)
	}
	if err := e.initDaemon(ctx, rec, addr, imageToken); err != nil {
		e.discard(rec.ID, instance, "")
		_ = e.forget(rec.ID)
		return fmt.Errorf("sandbox %s: restored from %s, but its daemon: %w", rec.ID, parent, err)
	}
	rec.Instance, rec.Addr, rec.Pending = instance, addr, nil
	if err := e.save(rec); err != nil {
		e.discard(rec.ID, instance, "")
		_ = e.forget(rec.ID)
		return err
	}
	e.log.Info("sandbox created", "sandbox_id", rec.ID, "snapshot_id", parent, "instance", instance)
	return nil
}

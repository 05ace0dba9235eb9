// Package gvisor runs Spore sandboxes with gVisor's runsc.
//
// Each instance has a directory under the driver's state directory holding
// its OCI bundle and the host directory backing its writable root overlay
// (an anonymous, already-unlinked file that runsc sizes to Limits.DiskMB).
// The read-only lower root filesystem is shared by every instance booted or
// restored from it. runsc's own state lives in <state>/root, which is what
// lets a restarted engine find the instances that kept running. The runsc
// builds instances run with are kept by content (see builds.go).
package gvisor

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/spore-run/spore/internal/errdefs"
	"github.com/spore-run/spore/internal/ids"
	"github.com/spore-run/spore/internal/runtime"
	"github.com/spore-run/spore/internal/timing"
)

// Config configures the driver.
type Config struct {
	Runsc    string // path of the runsc binary new instances run with
	StateDir string // the driver's own directory (created if missing)
	// BuildsDir keeps the runsc builds instances and images need, by
	// content (see builds.go; default <StateDir>/builds).
	BuildsDir string
	// Platform is runsc's --platform (default "systrap"; "kvm" hangs on
	// hosts without hardware virtualization).
	Platform string
	// CgroupParent is the cgroup under which every instance gets its own
	// (default "/spore").
	CgroupParent string
	// Timeout bounds quick calls (state, pause, resume, kill; default 30s);
	// SlowTimeout bounds start, checkpoint and restore (default 5m). A
	// shorter context deadline wins.
	Timeout     time.Duration
	SlowTimeout time.Duration
	// Cgroups says who manages instances' cgroups: "" or "runsc" (runsc,
	// from the OCI resources), or "driver": on cgroup v1 hosts the driver
	// itself (see cgroup.go; ~15 ms faster per start and restore, but the
	// guest then sees the host's memory and CPU count, since runsc derives
	// them from the cgroup it manages). Elsewhere "driver" means runsc.
	Cgroups string
	// ExtraFlags are passed to runsc before the verb (for example
	// "--debug", "--debug-log=/tmp/runsc/").
	ExtraFlags []string
	// BackgroundLoadBytes: a restore whose image holds at least this many
	// bytes of memory pages returns before they are all loaded (`runsc
	// restore --background`): the sandbox runs while the rest loads, and a
	// guest touching memory not loaded yet waits for that range. 0 means
	// DefaultBackgroundLoadBytes; negative, never.
	BackgroundLoadBytes int64
	Logger              *slog.Logger
}

// DefaultBackgroundLoadBytes is Config.BackgroundLoadBytes' default (see
// docs/engine.md, "Loading memory in the background", for the numbers it
// rests on).
const DefaultBackgroundLoadBytes = 128 << 20

// Driver implements runtime.Runtime with runsc.
type Driver struct {
	cfg     Config
	version string
	build   string // of Config.Runsc: the build new instances run with
	bin     string // its kept copy, which the driver runs
	log     *slog.Logger
	managed bool // the driver manages instances' cgroups (see cgroup.go)
	pids    pidWatcher
	alerts  memAlerts
	oomLog  *kmsgFollower // the host kernel's log (hostKmsg)
}

var _ runtime.Runtime = (*Driver)(nil)

// New checks the runsc binary and prepares the state directory.
func New(ctx context.Context, cfg Config) (*Driver, error) {
	if cfg.Runsc == "" {
		return nil, errdefs.Invalidf("gvisor: runsc path is empty")
	}
	if !filepath.IsAbs(cfg.StateDir) {
		return nil, errdefs.Invalidf("gvisor: state dir %q must be an absolute path", cfg.StateDir)
	}
	if cfg.Platform == "" {
		cfg.Platform = "systrap"
	}
	if cfg.CgroupParent == "" {
		cfg.CgroupParent = "/spore"
	}
	if cfg.Timeout == 0 {
		cfg.Timeout = 30 * time.Second
	}
	if cfg.SlowTimeout == 0 {
		cfg.SlowTimeout = 5 * time.Minute
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	if cfg.BackgroundLoadBytes == 0 {
		cfg.BackgroundLoadBytes = DefaultBackgroundLoadBytes
	}
	if cfg.BuildsDir == "" {
		cfg.BuildsDir = filepath.Join(cfg.StateDir, "builds")
	}
	if !filepath.IsAbs(cfg.BuildsDir) {
		return nil, errdefs.Invalidf("gvisor: builds dir %q must be an absolute path", cfg.BuildsDir)
	}
	if _, err := os.Stat(cfg.Runsc); err != nil {
		return nil, fmt.Errorf("gvisor: runsc binary (run `make setup`): %w: %v", errdefs.ErrUnavailable, err)
	}
	for _, d := range []string{cfg.StateDir, filepath.Join(cfg.StateDir, "root"), filepath.Join(cfg.StateDir, "inst")} {
		if err := os.MkdirAll(d, 0o700); err != nil {
			return nil, fmt.Errorf("gvisor: %w", err)
		}
	}
	if cfg.Cgroups != "" && cfg.Cgroups != "runsc" && cfg.Cgroups != "driver" {
		return nil, errdefs.Invalidf("gvisor: cgroups mode %q (want runsc or driver)", cfg.Cgroups)
	}
	if strings.ContainsAny(cfg.CgroupParent, "'\n") || !strings.HasPrefix(cfg.CgroupParent, "/") {
		return nil, errdefs.Invalidf("gvisor: cgroup parent %q must be an absolute path without quotes", cfg.CgroupParent)
	}
	d := &Driver{cfg: cfg, log: cfg.Logger, managed: cfg.Cgroups == "driver" && cgroupV1(), oomLog: hostKmsg}
	build, err := KeepBuild(ctx, cfg.BuildsDir, cfg.Runsc)
	if err != nil {
		return nil, fmt.Errorf("gvisor: keep runsc build: %w", err)
	}
	d.build, d.bin = build, filepath.Join(BuildDir(cfg.BuildsDir, build), buildBinary)
	out, err := d.runsc(ctx, cfg.Timeout, nil, "--version")
	if err != nil {
		return nil, fmt.Errorf("gvisor: runsc --version: %w", err)
	}
	d.version = versionFrom(d.bin, out)
	return d, nil
}

// Name implements runtime.Runtime.
func (d *Driver) Name() string { return "gvisor/" + d.version }

// Capabilities implements runtime.Runtime.
func (d *Driver) Capabilities() runtime.Capabilities {
	return runtime.Capabilities{LiveCheckpoint: true, Pause: true, DiskLimit: true}
}

func (d *Driver) instDir(id string) string    { return filepath.Join(d.cfg.StateDir, "inst", id) }
func (d *Driver) bundleDir(id string) string  { return filepath.Join(d.instDir(id), "bundle") }
func (d *Driver) overlayDir(id string) string { return filepath.Join(d.instDir(id), "overlay") }

// exists reports whether runsc holds state for exactly this ID. runsc itself
// resolves unique prefixes, so every call checks the exact ID first.
func (d *Driver) exists(id string) bool {
	m, _ := filepath.Glob(filepath.Join(d.cfg.StateDir, "root", globEscape(id)+"_sandbox:*.state"))
	return len(m) > 0
}

func globEscape(s string) string {
	r := strings.NewReplacer(`*`, `\*`, `?`, `\?`, `[`, `\[`, `\`, `\\`)
	return r.Replace(s)
}

func (d *Driver) checkID(id string) error {
	return ids.Validate("instance ID", id)
}

func (d *Driver) mustExist(id string) error {
	if err := d.checkID(id); err != nil {
		return err
	}
	if !d.exists(id) {
		return fmt.Errorf("instance %s: %w", id, errdefs.ErrNotFound)
	}
	return nil
}

// Start implements runtime.Runtime.
func (d *Driver) Start(ctx context.Context, spec runtime.Spec) error {
	done := timing.Track(ctx, "prepare")
	err := d.prepare(spec)
	done()
	if err != nil {
		return err
	}
	_, err = d.runscIn(ctx, spec.ID, d.cfg.SlowTimeout, d.startFlags(spec, "run", "-detach", "--bundle", d.bundleDir(spec.ID), spec.ID)...)
	if err != nil {
		d.abandon(spec.ID)
		return fmt.Errorf("start instance %s: %w", spec.ID, err)
	}
	defer timing.Track(ctx, "after-launch")()
	d.afterLaunch(spec.ID)
	return nil
}

// Restore implements runtime.Runtime.
func (d *Driver) Restore(ctx context.Context, spec runtime.Spec, imageDir string) error {
	if _, err := os.Stat(filepath.Join(imageDir, "checkpoint.img")); err != nil {
		return fmt.Errorf("restore instance %s: image %s: %w", spec.ID, imageDir, errdefs.ErrNotFound)
	}
	pre, err := d.precreated(spec)
	if err != nil {
		return err
	}
	if !pre {
		done := timing.Track(ctx, "prepare")
		err := d.prepare(spec)
		done()
		if err != nil {
			return err
		}
	}
	verb := []string{"restore", "-detach", "--image-path", imageDir, "--bundle", d.bundleDir(spec.ID)}
	if d.loadInBackground(imageDir) {
		// The sandbox holds the image's files open until the pages are in:
		// the image may be deleted (unlinked) meanwhile, never rewritten.
		verb = append(verb, "--background")
		timing.FromContext(ctx).Add("background-load", 0)
	}
	_, err = d.runscIn(ctx, spec.ID, d.cfg.SlowTimeout, d.startFlags(spec, append(verb, spec.ID)...)...)
	if err != nil {
		d.abandon(spec.ID)
		return fmt.Errorf("restore instance %s: %w", spec.ID, err)
	}
	if pre {
		os.Remove(d.precreatedFile(spec.ID)) // used: a second restore into it is refused (it exists)
	}
	defer timing.Track(ctx, "after-launch")()
	d.afterLaunch(spec.ID)
	return nil
}

// loadInBackground says whether the restore of imageDir loads its memory
// in the background (Config.BackgroundLoadBytes).
func (d *Driver) loadInBackground(imageDir string) bool {
	if d.cfg.BackgroundLoadBytes < 0 {
		return false
	}
	fi, err := os.Stat(filepath.Join(imageDir, "pages.img"))
	return err == nil && fi.Size() >= d.cfg.BackgroundLoadBytes
}

// afterLaunch prepares a just started or restored instance for its memory
// limit (see protectSandbox).
func (d *Driver) afterLaunch(id string) {
	if pid := d.sandboxPID(id); pid > 0 {
		d.protectSandbox(id, pid)
		d.armMemoryAlertsAsync(id, pid)
	}
}

// sandboxPID reads the instance's sandbox process ID from runsc's state
// file (what `runsc state` prints, without starting a process: this runs
// after every start and restore).
func (d *Driver) sandboxPID(id string) int {
	m, _ := filepath.Glob(filepath.Join(d.cfg.StateDir, "root", globEscape(id)+"_sandbox:*.state"))
	if len(m) != 1 {
		return 0
	}
	b, err := readBounded(m[0], 4<<20)
	if err != nil {
		return 0
	}
	var st struct {
		Sandbox struct {
			PID int `json:"pid"`
		} `json:"sandbox"`
	}
	if json.Unmarshal(b, &st) != nil {
		return 0
	}
	return st.Sandbox.PID
}

func (d *Driver) startFlags(spec runtime.Spec, verb ...string) []string {
	network := "none"
	if spec.NetNS != "" {
		network = "sandbox"
	}
	overlay := "root:dir=" + d.overlayDir(spec.ID)
	if spec.Limits.DiskMB > 0 {
		overlay += ",size=" + strconv.FormatInt(spec.Limits.DiskMB, 10) + "m"
	}
	return append([]string{"--network=" + network, "--overlay2=" + overlay}, verb...)
}

// prepare validates spec and writes the instance's bundle.
func (d *Driver) prepare(spec runtime.Spec) error {
	if err := d.checkID(spec.ID); err != nil {
		return err
	}
	if !filepath.IsAbs(spec.RootFS) {
		return errdefs.Invalidf("instance %s: root filesystem %q must be an absolute path", spec.ID, spec.RootFS)
	}
	if st, err := os.Stat(spec.RootFS); err != nil || !st.IsDir() {
		return fmt.Errorf("instance %s: root filesystem %s: %w", spec.ID, spec.RootFS, errdefs.ErrNotFound)
	}
	if len(spec.Args) == 0 {
		return errdefs.Invalidf("instance %s: empty start command", spec.ID)
	}
	if spec.MemoryAlertSignal != "" && !alertSignals[spec.MemoryAlertSignal] {
		return errdefs.Invalidf("instance %s: memory alert signal %q is not USR1 or USR2", spec.ID, spec.MemoryAlertSignal)
	}
	build, err := d.buildFor(spec)
	if err != nil {
		return err
	}
	if l := spec.Limits; l.VCPUs < 0 || l.MemoryMB < 0 || l.MaxProcs < 0 || l.DiskMB < 0 || l.ShmMB < 0 {
		return errdefs.Invalidf("instance %s: negative resource limit", spec.ID)
	}
	for _, m := range spec.Mounts {
		if !filepath.IsAbs(m.Source) || !filepath.IsAbs(m.Destination) || filepath.Clean(m.Destination) == "/" {
			return errdefs.Invalidf("instance %s: mount %s -> %s needs absolute paths and a destination other than /", spec.ID, m.Source, m.Destination)
		}
		if _, err := os.Stat(m.Source); err != nil {
			return fmt.Errorf("instance %s: mount source %s: %w", spec.ID, m.Source, errdefs.ErrNotFound)
		}
	}
	if d.exists(spec.ID) {
		return fmt.Errorf("instance %s: %w", spec.ID, errdefs.ErrAlreadyExists)
	}
	// A directory left by a crash before runsc knew the ID is stale.
	_ = os.RemoveAll(d.instDir(spec.ID))
	for _, dir := range []string{d.bundleDir(spec.ID), d.overlayDir(spec.ID)} {
		if err := os.MkdirAll(dir, 0o700); err != nil {
			return fmt.Errorf("instance %s: %w", spec.ID, err)
		}
	}
	parent := d.cfg.CgroupParent
	if d.managed {
		parent = "" // the driver's own cgroups; runsc runs with --ignore-cgroups
	}
	// Before runsc ever runs for it: every call on it uses this build.
	if err := os.WriteFile(filepath.Join(d.instDir(spec.ID), buildFile), []byte(build+"\n"), 0o600); err != nil {
		d.cleanup(spec.ID)
		return fmt.Errorf("instance %s: %w", spec.ID, err)
	}
	b, err := json.Marshal(ociSpec(spec, parent))
	if err != nil {
		d.cleanup(spec.ID)
		return fmt.Errorf("instance %s: %w", spec.ID, err)
	}
	if err := os.WriteFile(filepath.Join(d.bundleDir(spec.ID), "config.json"), b, 0o600); err != nil {
		d.cleanup(spec.ID)
		return fmt.Errorf("instance %s: %w", spec.ID, err)
	}
	if spec.MemoryAlertSignal != "" {
		if err := os.WriteFile(d.alertFile(spec.ID), []byte(spec.MemoryAlertSignal), 0o600); err != nil {
			d.cleanup(spec.ID)
			return fmt.Errorf("instance %s: %w", spec.ID, err)
		}
	}
	if d.managed {
		if err := d.makeCgroups(spec.ID, spec.Limits); err != nil {
			d.cleanup(spec.ID)
			return err
		}
	}
	return nil
}

// abandon frees whatever a failed start or restore may have left: runsc's
// own state if it got that far, and the instance directory.
func (d *Driver) abandon(id string) {
	if d.exists(id) {
		ctx, cancel := context.WithTimeout(context.Background(), d.cfg.Timeout)
		defer cancel()
		if _, err := d.runscFor(ctx, id, d.cfg.Timeout, "delete", "-force", id); err != nil {
			if d.torn(id) {
				err = d.reapTorn(ctx, id)
			}
			if err != nil {
				d.log.Warn("delete failed instance", "instance", id, "err", err)
			}
		}
	}
	d.cleanup(id)
}

func (d *Driver) cleanup(id string) {
	d.disarmMemoryAlerts(id, nil)
	if err := os.RemoveAll(d.instDir(id)); err != nil {
		d.log.Warn("remove instance dir", "instance", id, "err", err)
	}
	if d.managed {
		d.removeCgroups(id)
	}
}

// Checkpoint implements runtime.Runtime.
func (d *Driver) Checkpoint(ctx context.Context, id, imageDir string, opts runtime.CheckpointOptions) error {
	if err := d.mustExist(id); err != nil {
		return err
	}
	args := []string{"checkpoint", "--image-path", imageDir}
	if opts.LeaveRunning {
		args = append(args, "--leave-running")
	}
	if _, err := d.runscFor(ctx, id, d.cfg.SlowTimeout, append(args, id)...); err != nil {
		return fmt.Errorf("checkpoint instance %s: %w", id, err)
	}
	if !opts.LeaveRunning {
		// runsc stops the sandbox after a plain checkpoint; free the rest.
		if err := d.Kill(ctx, id); err != nil && !errdefs.IsNotFound(err) {
			return err
		}
	}
	return nil
}

// Exec implements runtime.Runtime.
func (d *Driver) Exec(ctx context.Context, id string, spec runtime.ExecSpec) (int, error) {
	if err := d.mustExist(id); err != nil {
		return -1, err
	}
	if len(spec.Args) == 0 {
		return -1, errdefs.Invalidf("exec in %s: empty command", id)
	}
	args := []string{"exec", "--user", fmt.Sprintf("%d:%d", spec.User.UID, spec.User.GID)}
	if spec.Cwd != "" {
		args = append(args, "--cwd", spec.Cwd)
	}
	for _, e := range spec.Env {
		args = append(args, "--env", e)
	}
	args = append(args, id)
	args = append(args, spec.Args...)
	cmd := exec.CommandContext(ctx, d.binFor(id), d.globalFlags(args)...)
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	cmd.WaitDelay = time.Second
	cmd.Stdin = spec.Stdin
	// Pipes, never the caller's files: runsc exec may write at offset 0.
	cmd.Stdout = orDiscard(spec.Stdout)
	cmd.Stderr = orDiscard(spec.Stderr)
	err := cmd.Run()
	var ee *exec.ExitError
	switch {
	case err == nil:
		return 0, nil
	case errors.As(err, &ee) && ctx.Err() == nil:
		return ee.ExitCode(), nil
	case ctx.Err() != nil:
		return -1, fmt.Errorf("exec in %s: %w", id, ctx.Err())
	default:
		return -1, fmt.Errorf("exec in %s: %w: %v", id, errdefs.ErrInternal, err)
	}
}

func orDiscard(w io.Writer) io.Writer {
	if w == nil {
		return io.Discard
	}
	return w
}

// Pause implements runtime.Runtime.
func (d *Driver) Pause(ctx context.Context, id string) error {
	if err := d.mustExist(id); err != nil {
		return err
	}
	if _, err := d.runscFor(ctx, id, d.cfg.Timeout, "pause", id); err != nil {
		return fmt.Errorf("pause instance %s: %w", id, err)
	}
	return nil
}

// Resume implements runtime.Runtime.
func (d *Driver) Resume(ctx context.Context, id string) error {
	if err := d.mustExist(id); err != nil {
		return err
	}
	if _, err := d.runscFor(ctx, id, d.cfg.Timeout, "resume", id); err != nil {
		return fmt.Errorf("resume instance %s: %w", id, err)
	}
	return nil
}

// Kill implements runtime.Runtime.
func (d *Driver) Kill(ctx context.Context, id string) error {
	if err := d.checkID(id); err != nil {
		return err
	}
	if !d.exists(id) {
		_, statErr := os.Stat(d.instDir(id))
		d.cleanup(id)
		if statErr == nil {
			return nil // a half-created instance: its directory was all there was
		}
		return fmt.Errorf("instance %s: %w", id, errdefs.ErrNotFound)
	}
	if _, err := d.runscFor(ctx, id, d.cfg.Timeout, "delete", "-force", id); err != nil {
		if d.torn(id) {
			return d.reapTorn(ctx, id)
		}
		return fmt.Errorf("kill instance %s: %w", id, err)
	}
	d.cleanup(id)
	return nil
}

type runscState struct {
	ID      string    `json:"id"`
	PID     int       `json:"pid"`
	Status  string    `json:"status"`
	Created time.Time `json:"created"`
}

func (s runscState) info() runtime.Info {
	st := runtime.StateStopped
	switch s.Status {
	case "running", "created":
		st = runtime.StateRunning
	case "paused":
		st = runtime.StatePaused
	}
	return runtime.Info{ID: s.ID, State: st, PID: s.PID, Created: s.Created}
}

// State implements runtime.Runtime.
func (d *Driver) State(ctx context.Context, id string) (runtime.Info, error) {
	if err := d.mustExist(id); err != nil {
		return runtime.Info{}, err
	}
	out, err := d.runscFor(ctx, id, d.cfg.Timeout, "state", id)
	if err != nil {
		if !d.exists(id) { // deleted concurrently
			return runtime.Info{}, fmt.Errorf("instance %s: %w", id, errdefs.ErrNotFound)
		}
		return runtime.Info{}, fmt.Errorf("state of instance %s: %w", id, err)
	}
	var s runscState
	if err := json.Unmarshal(out, &s); err != nil {
		return runtime.Info{}, fmt.Errorf("state of instance %s: %w: decode: %v", id, errdefs.ErrInternal, err)
	}
	return s.info(), nil
}

// List implements runtime.Runtime.
func (d *Driver) List(ctx context.Context) ([]runtime.Info, error) {
	out, err := d.runsc(ctx, d.cfg.Timeout, nil, "list", "--format=json")
	if err != nil {
		return nil, fmt.Errorf("list instances: %w", err)
	}
	var states []runscState
	if err := json.Unmarshal(bytes.TrimSpace(out), &states); err != nil {
		return nil, fmt.Errorf("list instances: %w: decode: %v", errdefs.ErrInternal, err)
	}
	infos := make([]runtime.Info, 0, len(states))
	for _, s := range states {
		infos = append(infos, s.info())
	}
	return infos, nil
}

// Recover implements runtime.Runtime.
func (d *Driver) Recover(ctx context.Context, id string) (runtime.Info, error) {
	d.awaitDetached(ctx, id)
	info, err := d.State(ctx, id)
	if err != nil {
		if !errdefs.IsNotFound(err) && d.torn(id) {
			if err := d.reapTorn(ctx, id); err != nil {
				return runtime.Info{}, err
			}
			return runtime.Info{}, fmt.Errorf("instance %s: its runsc state was torn: %w", id, errdefs.ErrNotFound)
		}
		return runtime.Info{}, err
	}
	if info.State == runtime.StateStopped || !pidAlive(info.PID) {
		if err := d.Kill(ctx, id); err != nil && !errdefs.IsNotFound(err) {
			return runtime.Info{}, err
		}
		return runtime.Info{}, fmt.Errorf("instance %s has exited: %w", id, errdefs.ErrNotFound)
	}
	if !d.alertsArmed(id) { // a restarted engine: its alerts went with it
		d.armMemoryAlertsAsync(id, info.PID)
	}
	return info, nil
}

// Sweep removes what instances that no longer exist left behind: instances
// whose runsc state file is torn (see torn.go), sandbox
// and gofer processes of a start or restore killed before runsc recorded
// it, instance directories runsc never knew, and empty cgroups under the
// driver's cgroup parent. Run it only when no call of this driver is in
// flight (the engine runs it while recovering).
func (d *Driver) Sweep(ctx context.Context) error {
	d.reapTornStates(ctx)
	d.killStrays(ctx)
	ents, err := os.ReadDir(filepath.Join(d.cfg.StateDir, "inst"))
	if err != nil {
		return fmt.Errorf("sweep: %w", err)
	}
	for _, e := range ents {
		if !d.exists(e.Name()) {
			d.log.Info("sweeping stale instance directory", "instance", e.Name())
			d.cleanup(e.Name())
		}
	}
	for _, dir := range d.cgroupDirs() {
		kids, _ := os.ReadDir(dir)
		for _, k := range kids {
			if k.IsDir() && !d.exists(k.Name()) {
				// Fails (EBUSY) while tasks remain: then it is not stale.
				_ = syscall.Rmdir(filepath.Join(dir, k.Name()))
			}
		}
	}
	return nil
}

// cgroupDirs returns the driver's cgroup parent in every mounted hierarchy.
func (d *Driver) cgroupDirs() []string {
	var dirs []string
	roots, _ := filepath.Glob("/sys/fs/cgroup/*")
	roots = append(roots, "/sys/fs/cgroup")
	for _, r := range roots {
		p := filepath.Join(r, d.cfg.CgroupParent)
		if st, err := os.Stat(p); err == nil && st.IsDir() {
			dirs = append(dirs, p)
		}
	}
	return dirs
}

// Purge kills every instance the driver holds and unmounts what runsc
// pinned under its root (its shared empty network namespace), so that the
// state directory can be removed. The driver is unusable afterwards.
func (d *Driver) Purge(ctx context.Context) error {
	list, err := d.List(ctx)
	if err != nil {
		return err
	}
	var errs []error
	for _, i := range list {
		if err := d.Kill(ctx, i.ID); err != nil && !errdefs.IsNotFound(err) {
			errs = append(errs, err)
		}
	}
	nullNS := filepath.Join(d.cfg.StateDir, "root", "null-netns")
	for syscall.Unmount(nullNS, syscall.MNT_DETACH) == nil {
	}
	if err := d.Sweep(ctx); err != nil {
		errs = append(errs, err)
	}
	for _, dir := range d.cgroupDirs() {
		_ = syscall.Rmdir(dir) // only if empty: other drivers may share the parent
	}
	return errors.Join(errs...)
}

func pidAlive(pid int) bool {
	return pid > 0 && syscall.Kill(pid, 0) == nil
}

func (d *Driver) globalFlags(args []string) []string {
	flags := []string{"--root=" + filepath.Join(d.cfg.StateDir, "root"), "--platform=" + d.cfg.Platform}
	if d.managed {
		flags = append(flags, "--ignore-cgroups")
	}
	flags = append(flags, d.cfg.ExtraFlags...)
	return append(flags, args...)
}

// runsc runs one runsc command of the current build, concerning no
// instance in particular (list, --version), under a deadline and returns
// its stdout. A failure carries runsc's stderr.
func (d *Driver) runsc(ctx context.Context, timeout time.Duration, stdin io.Reader, args ...string) ([]byte, error) {
	return d.runscCmd(ctx, d.bin, "", timeout, stdin, args...)
}

// runscFor runs a runsc command on instance id with the build id runs
// with (builds.go).
func (d *Driver) runscFor(ctx context.Context, id string, timeout time.Duration, args ...string) ([]byte, error) {
	return d.runscCmd(ctx, d.binFor(id), "", timeout, nil, args...)
}

// runscIn runs runsc, of the build instance id runs with, inside id's
// cgroups (when the driver manages them), so the gofer and sandbox it
// starts are born there.
func (d *Driver) runscIn(ctx context.Context, id string, timeout time.Duration, args ...string) ([]byte, error) {
	bin := d.binFor(id)
	if !d.managed {
		id = ""
	}
	return d.runscCmd(ctx, bin, id, timeout, nil, args...)
}

func (d *Driver) runscCmd(ctx context.Context, bin, cgroupOf string, timeout time.Duration, stdin io.Reader, args ...string) ([]byte, error) {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	name, argv := bin, d.globalFlags(args)
	if cgroupOf != "" {
		name, argv = "/bin/sh", append([]string{"-c", d.joinScript(cgroupOf), bin}, argv...)
	}
	cmd := exec.CommandContext(ctx, name, argv...)
	// If the engine dies, its in-flight runsc calls die with it, so a
	// restarted engine never races a half-finished call it did not start.
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	v := verbOf(args)
	if outlivesCaller(v) {
		// Except pause and resume, which finish on their own (in
		// milliseconds) and which Recover waits for (see detached.go).
		cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	}
	cmd.WaitDelay = time.Second
	cmd.Stdin = stdin
	// Output goes to unlinked files, never to pipes: a process runsc
	// leaves behind (the sandbox of a run, restore or create) or one that
	// inherited its descriptors holds a pipe open after runsc exits, and
	// a call that succeeded then failed with "WaitDelay expired before
	// I/O complete" (a checkpoint under load, once in CI). A file is
	// complete when runsc exits, whoever else holds it.
	outf, err := d.outputFile(v)
	if err != nil {
		return nil, err
	}
	defer outf.Close()
	errf := outf // the sandbox's own output goes with runsc's
	if v != "run" && v != "restore" && v != "create" {
		if errf, err = d.outputFile(v); err != nil {
			return nil, err
		}
		defer errf.Close()
	}
	cmd.Stdout, cmd.Stderr = outf, errf
	start := time.Now()
	done := timing.Track(ctx, "runsc "+v)
	err = cmd.Run()
	done()
	d.log.Debug("runsc", "args", args, "took", time.Since(start), "err", err)
	if err != nil {
		b, _ := io.ReadAll(io.NewSectionReader(errf, 0, 1<<20))
		msg := strings.TrimSpace(string(b))
		if len(msg) > 4096 {
			msg = msg[len(msg)-4096:]
		}
		if ctx.Err() != nil {
			return nil, fmt.Errorf("runsc %s: %w after %v: %v: %s", verbOf(args), errdefs.ErrUnavailable, timeout, ctx.Err(), msg)
		}
		return nil, fmt.Errorf("runsc %s: %w: %v: %s", verbOf(args), errdefs.ErrInternal, err, msg)
	}
	if errf == outf {
		return nil, nil
	}
	out, err := io.ReadAll(io.NewSectionReader(outf, 0, maxRunscOutput+1))
	if err != nil {
		return nil, fmt.Errorf("runsc %s: read its output: %w", v, err)
	}
	if len(out) > maxRunscOutput {
		return nil, fmt.Errorf("runsc %s: %w: output over %d bytes", v, errdefs.ErrInternal, maxRunscOutput)
	}
	return out, nil
}

// maxRunscOutput bounds what a runsc call's output is read to (a list of
// thousands of sandboxes is a few MB).
const maxRunscOutput = 64 << 20

// outputFile is an unlinked file in the state directory for a runsc
// call's output.
func (d *Driver) outputFile(verb string) (*os.File, error) {
	f, err := os.CreateTemp(d.cfg.StateDir, "runsc-*.out")
	if err != nil {
		return nil, fmt.Errorf("runsc %s: output file: %w", verb, err)
	}
	os.Remove(f.Name())
	return f, nil
}

func verbOf(args []string) string {
	for _, a := range args {
		if !strings.HasPrefix(a, "-") {
			return a
		}
	}
	return strings.Join(args, " ")
}

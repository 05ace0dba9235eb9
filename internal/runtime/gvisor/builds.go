package gvisor

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"syscall"

	"github.com/spore-run/spore/internal/atomicfs"
	"github.com/spore-run/spore/internal/errdefs"
	"github.com/spore-run/spore/internal/ids"
	"github.com/spore-run/spore/internal/runtime"
)

// Kept builds (runtime.Builds). A checkpoint image is only read by the
// runsc build that wrote it, so the driver keeps every build an image or
// an instance may still need, named by its content:
//
//	<builds>/<sha256 of the binary>/runsc          the binary
//	<builds>/<sha256 of the binary>/runsc.version  its version (Name)
//
// The driver runs every instance from there, never from Config.Runsc: an
// upgrade that replaces Config.Runsc (`make setup`) while instances run
// changes nothing under them, and an instance's later calls (exec,
// checkpoint, pause, kill) go to the build that started it, recorded in
// its directory (<inst>/<id>/build). Config.Runsc is hashed and added at
// New: it is the build new instances run with.
//
// A build directory appears whole, by a rename of a staging directory
// (.tmp-*) under a lock (<builds>/.lock), and goes by a rename into a
// trash directory (.trash-*) before its files are removed: a crash leaves
// either a whole build or none, and the leftovers go at the next change.

var _ runtime.Builds = (*Driver)(nil)

const (
	buildBinary  = "runsc"
	buildVersion = "runsc.version"
	buildFile    = "build" // in an instance's directory: the build it runs with
)

var buildRE = regexp.MustCompile(`^[0-9a-f]{64}$`)

// checkBuild accepts build identities (hex SHA-256 digests).
func checkBuild(build string) error {
	if !buildRE.MatchString(build) {
		return errdefs.Invalidf("runsc build %.80q is not a hex SHA-256 digest", build)
	}
	return nil
}

// hashKey identifies a file's content for as long as it is not written:
// a write or a replacement changes its inode, size or change time.
type hashKey struct {
	dev, ino     uint64
	size         int64
	mtime, ctime syscall.Timespec
}

// hashes memoizes BuildOf: hashing an 83 MB binary costs ~0.1-0.2 s of CPU,
// and every driver (every test) opened in a process would pay it.
var hashes = struct {
	sync.Mutex
	m map[hashKey]string
}{m: map[hashKey]string{}}

func keyOf(fi fs.FileInfo) (hashKey, bool) {
	st, ok := fi.Sys().(*syscall.Stat_t)
	if !ok {
		return hashKey{}, false
	}
	return hashKey{dev: st.Dev, ino: st.Ino, size: st.Size, mtime: st.Mtim, ctime: st.Ctim}, true
}

// BuildOf returns the build identity of the runsc binary at path: the hex
// SHA-256 of its content.
func BuildOf(path string) (string, error) {
	f, err := os.Open(path)
	if err != nil {
		return "", fmt.Errorf("runsc build of %s: %w", path, err)
	}
	defer f.Close()
	fi, err := f.Stat()
	if err != nil {
		return "", err
	}
	key, ok := keyOf(fi)
	if ok {
		hashes.Lock()
		b, hit := hashes.m[key]
		hashes.Unlock()
		if hit {
			return b, nil
		}
	}
	h := sha256.New()
	if _, err := io.Copy(h, f); err != nil {
		return "", fmt.Errorf("runsc build of %s: %w", path, err)
	}
	b := hex.EncodeToString(h.Sum(nil))
	if fi2, err := f.Stat(); err == nil {
		if key2, ok2 := keyOf(fi2); ok && ok2 && key2 == key { // not written while read
			hashes.Lock()
			hashes.m[key] = b
			hashes.Unlock()
		}
	}
	return b, nil
}

// BuildDir is where build is kept under the builds directory dir.
func BuildDir(dir, build string) string { return filepath.Join(dir, build) }

// KeepBuild adds the runsc binary at path, with its version, to the builds
// kept in dir, unless it is there, and returns its build: a hard link when
// dir is on the binary's file system (no data copied), a copy otherwise.
// Setup calls it before it replaces a binary, so the old build stays. A
// binary is replaced by a rename, as setup does, never written in place:
// that would write the kept build too.
func KeepBuild(ctx context.Context, dir, path string) (string, error) {
	build, err := BuildOf(path)
	if err != nil {
		return "", err
	}
	if _, err := os.Stat(filepath.Join(BuildDir(dir, build), buildBinary)); err == nil {
		return build, nil
	}
	version, err := Version(ctx, path)
	if err != nil {
		return "", err
	}
	err = installBuild(ctx, dir, build, func(staging string) error {
		if err := os.Mkdir(staging, 0o755); err != nil {
			return err
		}
		dst := filepath.Join(staging, buildBinary)
		if err := os.Link(path, dst); err != nil {
			if err := copyFile(path, dst); err != nil {
				return err
			}
		}
		return os.WriteFile(filepath.Join(staging, buildVersion), []byte(version+"\n"), 0o644)
	})
	return build, err
}

// installBuild makes build appear in dir whole: fill makes a staging
// directory at the path it is given and writes the binary (and its
// version) into it; the binary must hash to build; the directory is then
// renamed into place. One already there is kept.
func installBuild(ctx context.Context, dir, build string, fill func(staging string) error) error {
	if err := checkBuild(build); err != nil {
		return err
	}
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return fmt.Errorf("%w: runsc builds: %v", errdefs.ErrInternal, err)
	}
	unlock, err := atomicfs.Lock(ctx, filepath.Join(dir, ".lock"))
	if err != nil {
		return err
	}
	defer unlock()
	final := BuildDir(dir, build)
	if _, err := os.Stat(filepath.Join(final, buildBinary)); err == nil {
		return nil
	}
	clearLeftovers(dir)
	tmp, err := os.MkdirTemp(dir, ".tmp-")
	if err != nil {
		return fmt.Errorf("%w: runsc build %s: %v", errdefs.ErrInternal, build, err)
	}
	defer os.RemoveAll(tmp)
	staging := filepath.Join(tmp, build)
	if err := fill(staging); err != nil {
		return fmt.Errorf("runsc build %s: %w", build, err)
	}
	bin := filepath.Join(staging, buildBinary)
	got, err := BuildOf(bin)
	if err != nil {
		return err
	}
	if got != build {
		return fmt.Errorf("%w: runsc build %s: the binary given hashes to %s", errdefs.ErrDataLoss, build, got)
	}
	if _, err := os.Stat(filepath.Join(staging, buildVersion)); err != nil {
		return fmt.Errorf("%w: runsc build %s: no version file", errdefs.ErrInvalidArgument, build)
	}
	if err := os.Chmod(bin, 0o755); err != nil {
		return err
	}
	if err := os.Chmod(staging, 0o755); err != nil {
		return err
	}
	if _, err := atomicfs.SyncTree(staging); err != nil {
		return fmt.Errorf("runsc build %s: %w", build, err)
	}
	// A directory without a binary is a removal cut short: replace it.
	if err := os.RemoveAll(final); err != nil {
		return fmt.Errorf("%w: runsc build %s: %v", errdefs.ErrInternal, build, err)
	}
	if err := os.Rename(staging, final); err != nil {
		return fmt.Errorf("%w: runsc build %s: %v", errdefs.ErrInternal, build, err)
	}
	return atomicfs.SyncDir(dir)
}

// clearLeftovers removes what crashed installs and removals left in dir.
// Callers hold dir's lock.
func clearLeftovers(dir string) {
	ents, _ := os.ReadDir(dir)
	for _, e := range ents {
		if strings.HasPrefix(e.Name(), ".tmp-") || strings.HasPrefix(e.Name(), ".trash-") {
			os.RemoveAll(filepath.Join(dir, e.Name()))
		}
	}
}

func copyFile(src, dst string) error {
	in, err := os.Open(src)
	if err != nil {
		return err
	}
	defer in.Close()
	out, err := os.OpenFile(dst, os.O_CREATE|os.O_EXCL|os.O_WRONLY, 0o755)
	if err != nil {
		return err
	}
	if _, err := io.Copy(out, in); err != nil {
		out.Close()
		return err
	}
	return out.Close()
}

// Build implements runtime.Builds.
func (d *Driver) Build() string { return d.build }

// BuildsDir is where the driver keeps its builds.
func (d *Driver) BuildsDir() string { return d.cfg.BuildsDir }

// HasBuild implements runtime.Builds.
func (d *Driver) HasBuild(build string) (string, error) {
	if err := checkBuild(build); err != nil {
		return "", err
	}
	dir := BuildDir(d.cfg.BuildsDir, build)
	if _, err := os.Stat(filepath.Join(dir, buildBinary)); err != nil {
		return "", fmt.Errorf("runsc build %s: not on this node: %w", build, errdefs.ErrNotFound)
	}
	return "gvisor/" + versionFrom(filepath.Join(dir, buildBinary), nil), nil
}

// KeptBuilds implements runtime.Builds.
func (d *Driver) KeptBuilds() ([]string, error) {
	ents, err := os.ReadDir(d.cfg.BuildsDir)
	if err != nil {
		return nil, fmt.Errorf("runsc builds: %w", err)
	}
	var out []string
	for _, e := range ents {
		if checkBuild(e.Name()) != nil {
			continue
		}
		if _, err := os.Stat(filepath.Join(d.cfg.BuildsDir, e.Name(), buildBinary)); err == nil {
			out = append(out, e.Name())
		}
	}
	return out, nil
}

// InstallBuild adds build to the driver's builds: fill makes the
// directory it is given and writes the build's binary ("runsc") and
// version file ("runsc.version") into it (a copy fetched from elsewhere);
// the binary must hash to build.
func (d *Driver) InstallBuild(ctx context.Context, build string, fill func(dir string) error) error {
	return installBuild(ctx, d.cfg.BuildsDir, build, fill)
}

// RemoveBuild implements runtime.Builds.
func (d *Driver) RemoveBuild(ctx context.Context, build string) error {
	if err := checkBuild(build); err != nil {
		return err
	}
	if build == d.build {
		return errdefs.Conflictf("runsc build %s is the one new instances run with", build)
	}
	if users := d.instancesOfBuild(build); len(users) > 0 {
		return errdefs.Conflictf("runsc build %s: instances run with it (%s)", build, strings.Join(users, ", "))
	}
	unlock, err := atomicfs.Lock(ctx, filepath.Join(d.cfg.BuildsDir, ".lock"))
	if err != nil {
		return err
	}
	defer unlock()
	final := BuildDir(d.cfg.BuildsDir, build)
	if _, err := os.Stat(final); errors.Is(err, fs.ErrNotExist) {
		return fmt.Errorf("runsc build %s: %w", build, errdefs.ErrNotFound)
	}
	trash := filepath.Join(d.cfg.BuildsDir, ".trash-"+build+"-"+ids.New('d'))
	if err := os.Rename(final, trash); err != nil { // the commit point
		return fmt.Errorf("%w: remove runsc build %s: %v", errdefs.ErrInternal, build, err)
	}
	_ = atomicfs.SyncDir(d.cfg.BuildsDir)
	d.log.Info("runsc build removed: nothing needs it any more", "build", build)
	return os.RemoveAll(trash)
}

// instancesOfBuild lists the instances whose directory names build.
func (d *Driver) instancesOfBuild(build string) []string {
	ents, _ := os.ReadDir(filepath.Join(d.cfg.StateDir, "inst"))
	var out []string
	for _, e := range ents {
		if b, _ := os.ReadFile(filepath.Join(d.instDir(e.Name()), buildFile)); strings.TrimSpace(string(b)) == build {
			out = append(out, e.Name())
		}
	}
	return out
}

// buildFor resolves a spec's build: "" is the current one; another must
// be kept here.
func (d *Driver) buildFor(spec runtime.Spec) (string, error) {
	if spec.Build == "" || spec.Build == d.build {
		return d.build, nil
	}
	if _, err := d.HasBuild(spec.Build); err != nil {
		return "", fmt.Errorf("instance %s: %w", spec.ID, err)
	}
	return spec.Build, nil
}

// binFor is the binary that runs instance id's calls: its build's, as
// recorded in its directory; the current build's for an instance without
// one (made before builds were recorded) and for calls naming none.
func (d *Driver) binFor(id string) string {
	if id == "" {
		return d.bin
	}
	b, err := os.ReadFile(filepath.Join(d.instDir(id), buildFile))
	build := strings.TrimSpace(string(b))
	if err != nil || build == d.build || checkBuild(build) != nil {
		return d.bin
	}
	return filepath.Join(BuildDir(d.cfg.BuildsDir, build), buildBinary)
}

// Version is the version of the runsc binary at path (see versionFrom).
func Version(ctx context.Context, runsc string) (string, error) {
	if v := versionFrom(runsc, nil); v != "unknown" {
		return v, nil
	}
	out, err := exec.CommandContext(ctx, runsc, "--version").Output()
	if err != nil {
		return "", fmt.Errorf("runsc --version: %w", err)
	}
	return versionFrom(runsc, out), nil
}

// versionFrom is the pinned module version setup records beside the
// binary (builds from the module proxy report none of their own), else
// what `runsc --version` printed (out).
func versionFrom(runsc string, out []byte) string {
	if b, err := os.ReadFile(runsc + ".version"); err == nil {
		return strings.TrimSpace(string(b))
	}
	return parseVersion(out)
}

func parseVersion(out []byte) string {
	for _, line := range strings.Split(string(out), "\n") {
		if v, ok := strings.CutPrefix(line, "runsc version "); ok {
			return strings.TrimSpace(v)
		}
	}
	return "unknown"
}

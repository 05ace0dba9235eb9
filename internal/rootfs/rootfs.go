// Package rootfs builds and names the root filesystems sandboxes boot from.
//
// A root filesystem is a directory <dir>/<name> used read-only as the lower
// layer of every sandbox booted or restored from it, plus a stamp file
// <dir>/<name>.json recording how it was built and a build identity. A
// checkpoint image is only valid over the exact root filesystem it was taken
// on, so snapshots record that identity, a restore finds that build's tree
// (Resolve), and a build the name no longer holds is kept while something
// needs it (keep.go).
package rootfs

import (
	"bufio"
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
	"slices"
	"strings"
	"time"

	"github.com/spore-run/spore/internal/atomicfs"
	"github.com/spore-run/spore/internal/errdefs"
	"github.com/spore-run/spore/internal/ids"
	"github.com/spore-run/spore/internal/netns"
)

// Stamp records how a root filesystem was built.
type Stamp struct {
	ID       string   `json:"id"` // build identity: changes with every build
	Suite    string   `json:"suite"`
	Variant  string   `json:"variant"`
	Packages []string `json:"packages"`
	Extra    string   `json:"extra,omitempty"` // hash of files added after debootstrap
	Revision int      `json:"revision,omitempty"`
	// Image is the OCI chain ID ("sha256:...") of the image tree a root
	// filesystem was made from (see RegisterImage); empty for Debian ones.
	Image string    `json:"image,omitempty"`
	Built time.Time `json:"built"`
	// Name is the name a kept tree was built as (kept trees only).
	Name string `json:"name,omitempty"`
}

// Path returns the directory of the named root filesystem.
func Path(dir, name string) string { return filepath.Join(dir, name) }

func stampPath(dir, name string) string { return filepath.Join(dir, name+".json") }

// Lookup returns the stamp of a built root filesystem.
func Lookup(dir, name string) (Stamp, error) {
	if err := ids.ValidateName("root filesystem", name); err != nil {
		return Stamp{}, err
	}
	var s Stamp
	if err := atomicfs.ReadJSON(stampPath(dir, name), &s); err != nil {
		if errors.Is(err, fs.ErrNotExist) {
			return Stamp{}, fmt.Errorf("root filesystem %s (run `make setup`): %w", name, errdefs.ErrNotFound)
		}
		return Stamp{}, fmt.Errorf("root filesystem %s: %w", name, err)
	}
	if st, err := os.Stat(Path(dir, name)); err != nil || !st.IsDir() {
		return Stamp{}, fmt.Errorf("root filesystem %s: directory missing: %w", name, errdefs.ErrNotFound)
	}
	return s, nil
}

// Spec describes a Debian root filesystem.
type Spec struct {
	Name     string
	Suite    string   // "bookworm"
	Variant  string   // "minbase"
	Packages []string // extra packages (--include)
	// Files are copied into the tree after debootstrap (destination path
	// inside the root filesystem -> source path on the host), e.g. the
	// in-sandbox daemon. Their content is part of the build's identity.
	Files map[string]string
	// Revision changes when prepareTree changes what it does to the tree.
	Revision int
}

// treeRevision is the revision of prepareTree's adjustments (3: the
// sandbox's own /etc/hosts, /etc/hostname and /etc/resolv.conf, and a file
// in /tmp that keeps it on the disk-backed overlay).
const treeRevision = 3

// Hostname is a sandbox's host name (the runtime's default, see
// runtime/gvisor), listed in the root filesystem's /etc/hosts.
const Hostname = "sandbox"

// etcFiles are the name-service files of every sandbox. debootstrap
// leaves the build host's resolv.conf (a resolver sandboxes cannot
// reach) and no hosts file (not even localhost resolves). Every sandbox
// and clone sees the same addresses (netns), so static files hold: the
// resolver is the gateway, where the node's DNS forwarder answers.
func etcFiles() map[string]string {
	return map[string]string{
		"etc/hosts": "127.0.0.1\tlocalhost\n" +
			"::1\tlocalhost ip6-localhost ip6-loopback\n" +
			"ff02::1\tip6-allnodes\n" +
			"ff02::2\tip6-allrouters\n" +
			netns.SandboxIP.String() + "\t" + Hostname + "\n",
		"etc/hostname":    Hostname + "\n",
		"etc/resolv.conf": "nameserver " + netns.GatewayIP.String() + "\n",
		// runsc mounts a tmpfs of its own (unsized, in the sandbox's
		// memory) over an empty /tmp: filling it would take the whole
		// sandbox to its memory limit. A non-empty /tmp stays on the root
		// overlay, whose size limit answers ENOSPC instead.
		TmpKeepFile: "Keeps /tmp on the sandbox's disk (its size limit applies) instead of a tmpfs in its memory.\n",
	}
}

// TmpKeepFile is the file that keeps a sandbox's /tmp off tmpfs.
const TmpKeepFile = "tmp/.spore-tmp-on-disk"

// BaseSpec is the `base` root filesystem: Debian bookworm minbase plus the
// tools agents expect, and every program the stock E2B SDK's ready helpers
// run inside a template's build sandbox (TestBaseHasWhatTheStockReadyHelpersRun
// pins that list against the SDK's own command strings).
func BaseSpec() Spec {
	return Spec{
		Name:    "base",
		Suite:   "bookworm",
		Variant: "minbase",
		Packages: []string{
			"bash",            // the shell of RUN steps, start and ready commands, and SDK commands (`bash -l -c`)
			"coreutils",       // sleep (waitForTimeout, and a Dockerfile's CMD as a start command), rm, mv, mkdir, ln
			"python3",         // the code interpreter's kernel (envd/interp)
			"procps",          // pgrep (waitForProcess), ps, kill
			"ca-certificates", // HTTPS for curl, git and apt-get in RUN steps
			"curl",            // waitForURL
			"git",             // gitClone
			"iproute2",        // ss (waitForPort)
			"grep",            // waitForURL pipes curl into grep (essential, so in every tree: named for the list above)
		},
		Revision: treeRevision,
	}
}

// UpToDate reports whether the named root filesystem exists and was built
// from spec.
func UpToDate(dir string, spec Spec) bool {
	s, err := Lookup(dir, spec.Name)
	if err != nil {
		return false
	}
	extra, err := filesHash(spec.Files)
	return err == nil && s.Suite == spec.Suite && s.Variant == spec.Variant &&
		slices.Equal(s.Packages, spec.Packages) && s.Extra == extra && s.Revision == spec.Revision
}

// Build runs debootstrap into a staging directory and installs it
// (Install: the build it replaces is kept), so a crash never leaves a
// half-built root filesystem under its name. Debootstrap's progress lines go to progress. The Debian mirror is
// the one apt on this host uses; downloaded packages are cached in
// cacheDir.
func Build(ctx context.Context, dir, cacheDir string, spec Spec, progress io.Writer) (Stamp, error) {
	if err := ids.ValidateName("root filesystem", spec.Name); err != nil {
		return Stamp{}, err
	}
	extra, err := filesHash(spec.Files)
	if err != nil {
		return Stamp{}, err
	}
	mirror, err := AptMirror()
	if err != nil {
		return Stamp{}, err
	}
	for _, d := range []string{dir, cacheDir} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			return Stamp{}, err
		}
	}
	staging := filepath.Join(dir, ".build-"+spec.Name)
	if err := os.RemoveAll(staging); err != nil {
		return Stamp{}, err
	}
	args := []string{"--variant=" + spec.Variant, "--cache-dir=" + cacheDir}
	if len(spec.Packages) > 0 {
		args = append(args, "--include="+strings.Join(spec.Packages, ","))
	}
	args = append(args, spec.Suite, staging, mirror)
	cmd := exec.CommandContext(ctx, "debootstrap", args...)
	pr, pw := io.Pipe()
	cmd.Stdout, cmd.Stderr = pw, pw
	done := make(chan struct{})
	var tail []string
	go func() {
		defer close(done)
		sc := bufio.NewScanner(pr)
		for sc.Scan() {
			line := sc.Text()
			if progress != nil {
				fmt.Fprintln(progress, line)
			}
			tail = append(tail, line)
			if len(tail) > 20 {
				tail = tail[1:]
			}
		}
	}()
	err = cmd.Run()
	pw.Close()
	<-done
	if err != nil {
		os.RemoveAll(staging)
		return Stamp{}, fmt.Errorf("debootstrap %s: %w\n%s", spec.Name, err, strings.Join(tail, "\n"))
	}
	if err := prepareTree(staging, spec.Files); err != nil {
		os.RemoveAll(staging)
		return Stamp{}, fmt.Errorf("root filesystem %s: %w", spec.Name, err)
	}
	// The build it replaces is kept (its snapshots still restore over
	// it) until nothing needs it (Prune).
	stamp := Stamp{ID: ids.New('r'), Suite: spec.Suite, Variant: spec.Variant, Packages: spec.Packages, Extra: extra, Revision: spec.Revision, Built: time.Now().UTC()}
	if err := Install(ctx, dir, spec.Name, staging, stamp); err != nil {
		os.RemoveAll(staging)
		return Stamp{}, err
	}
	return stamp, nil
}

// prepareTree makes a fresh debootstrap tree ready to be a sandbox root:
// the default user, and the extra files.
func prepareTree(root string, files map[string]string) error {
	// uid 1000 "user" with home /home/user, the default identity of
	// commands run in a sandbox.
	chroot := exec.Command("chroot", root, "/usr/sbin/useradd", "--create-home", "--uid", "1000", "--user-group", "--shell", "/bin/bash", "user")
	if out, err := chroot.CombinedOutput(); err != nil && !strings.Contains(string(out), "already exists") {
		return fmt.Errorf("add user: %v: %s", err, out)
	}
	// Login shells (every SDK command runs `bash -l -c`) ran `id -u` in a
	// subshell: a fork and exec, ~12 ms in gVisor. Bash knows $EUID.
	profile := filepath.Join(root, "etc", "profile")
	if b, err := os.ReadFile(profile); err == nil {
		fixed := strings.ReplaceAll(string(b), `"$(id -u)"`, `"${EUID:-$(id -u)}"`)
		if err := os.WriteFile(profile, []byte(fixed), 0o644); err != nil {
			return err
		}
	}
	if err := writeEtc(root); err != nil {
		return err
	}
	// Package caches are not needed at run time.
	os.RemoveAll(filepath.Join(root, "var", "cache", "apt", "archives"))
	os.MkdirAll(filepath.Join(root, "var", "cache", "apt", "archives", "partial"), 0o755)
	for dst, src := range files {
		target := filepath.Join(root, filepath.Clean("/"+dst))
		b, err := os.ReadFile(src)
		if err != nil {
			return err
		}
		if err := os.MkdirAll(filepath.Dir(target), 0o755); err != nil {
			return err
		}
		if err := os.WriteFile(target, b, 0o755); err != nil {
			return err
		}
	}
	return nil
}

// writeEtc writes the sandbox's name-service files into a tree.
func writeEtc(root string) error {
	for name, content := range etcFiles() {
		p := filepath.Join(root, name)
		// Replace, never write through: a symbolic link left by a package
		// must not send the write elsewhere.
		if err := os.Remove(p); err != nil && !errors.Is(err, fs.ErrNotExist) {
			return err
		}
		if err := os.WriteFile(p, []byte(content), 0o644); err != nil {
			return err
		}
	}
	return nil
}

func filesHash(files map[string]string) (string, error) {
	if len(files) == 0 {
		return "", nil
	}
	keys := make([]string, 0, len(files))
	for k := range files {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	h := sha256.New()
	for _, k := range keys {
		b, err := os.ReadFile(files[k])
		if err != nil {
			return "", err
		}
		fmt.Fprintf(h, "%s\x00%d\x00", k, len(b))
		h.Write(b)
	}
	return hex.EncodeToString(h.Sum(nil))[:16], nil
}

// AptMirror returns the Debian mirror apt on this host is configured with
// (never a hard-coded host).
func AptMirror() (string, error) {
	files, _ := filepath.Glob("/etc/apt/sources.list.d/*")
	files = append([]string{"/etc/apt/sources.list"}, files...)
	for _, f := range files {
		b, err := os.ReadFile(f)
		if err != nil {
			continue
		}
		if url := parseMirror(string(b)); url != "" {
			return url, nil
		}
	}
	return "", fmt.Errorf("no Debian mirror found in apt's sources: %w", errdefs.ErrUnavailable)
}

// parseMirror finds the Debian archive in an apt sources file, in the
// one-line ("deb [opts] URL suite") or deb822 ("URIs: URL") format.
func parseMirror(content string) string {
	{
		for _, line := range strings.Split(content, "\n") {
			line = strings.TrimSpace(line)
			if strings.HasPrefix(line, "#") {
				continue
			}
			var url string
			if rest, ok := strings.CutPrefix(line, "URIs:"); ok { // deb822
				url = strings.Fields(rest + " ")[0]
			} else if strings.HasPrefix(line, "deb ") {
				for _, f := range strings.Fields(line)[1:] {
					if !strings.HasPrefix(f, "[") && !strings.HasSuffix(f, "]") {
						url = f
						break
					}
				}
			}
			if url != "" && strings.HasSuffix(strings.TrimSuffix(url, "/"), "/debian") {
				return url
			}
		}
	}
	return ""
}

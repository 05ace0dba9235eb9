// Package setup installs what Spore needs on a host: Debian packages, the
// pinned gVisor runsc (built static from the Go module proxy) and the base
// root filesystem. Every step is idempotent: what is present and current
// is kept, downloads are cached outside the data directory.
package setup

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"time"

	"github.com/spore-run/spore/internal/progress"
	"github.com/spore-run/spore/internal/rootfs"
)

// RunscModule is the pinned gVisor build. A cgo build cannot boot
// sandboxes (runsc re-execs itself in an empty chroot), so it is built
// with CGO_ENABLED=0.
const RunscModule = "gvisor.dev/gvisor/runsc@v0.0.0-20260905035102-160fafc42237"

// Packages are the Debian packages the runtime and the tests need; nothing
// the tests or make targets use may come from elsewhere (scripts/fresh-root.sh
// proves it in a newly bootstrapped Debian root, see docs/reliability.md).
// Go, git and make are the prerequisites (what cloning and running make take).
//   - debootstrap: root filesystems; iproute2 (ip, ss), nftables (nft):
//     sandbox networks and the network tests; python3, curl: tests' peers.
//   - protobuf-compiler and libprotobuf-dev: a test regenerates the envd
//     protocol code, which imports google/protobuf/timestamp.proto, a file
//     only libprotobuf-dev ships.
//   - gcc and libc6-dev: cgo, which `go test -race` needs.
//   - Node.js and npm: see ensureNode (Debian's Node is older than the E2B
//     SDK allows).
//   - postgresql: the fleet's metadata store; the store tests start a
//     throwaway cluster from its binaries (testenv.Postgres).
//   - busybox-static: the node tests build OCI images from its static
//     binary (no registry on the internet here).
//   - patch: applies Spore's gVisor patches (patches/) to the source runsc
//     is built from.
//   - xfsprogs (mkfs.xfs): the node's volume pool, an XFS file system with
//     reflinks (internal/volume/pool; ext4 images inside need e2fsprogs,
//     which every Debian has).
var Packages = []string{"debootstrap", "iproute2", "nftables", "ca-certificates", "python3", "curl",
	"protobuf-compiler", "libprotobuf-dev", "gcc", "libc6-dev", "postgresql", "busybox-static", "patch", "xfsprogs"}

// Tools are the pinned code generators, built into <cache>/tools.
var Tools = []string{
	"google.golang.org/protobuf/cmd/protoc-gen-go@v1.36.12",
	"connectrpc.com/connect/cmd/protoc-gen-connect-go@v1.21.1",
}

// ToolsDir is where setup installs the code generators.
func ToolsDir(cacheDir string) string { return filepath.Join(cacheDir, "tools") }

// Config says where things go.
type Config struct {
	DataDir  string // /var/lib/spore: bin/runsc, rootfs/<name>
	CacheDir string // /var/cache/spore: runsc builds, debootstrap packages
	Out      io.Writer
}

// RunscPath is where setup installs runsc under a data directory.
func RunscPath(dataDir string) string { return filepath.Join(dataDir, "bin", "runsc") }

// RunscBuildsDir is where the runsc builds that snapshots and sandboxes
// need are kept by content, under a data directory (gvisor.KeepBuild):
// installing a new runsc keeps the old build there.
func RunscBuildsDir(dataDir string) string { return filepath.Join(dataDir, "runsc-builds") }

// RootFSDir is where setup builds root filesystems under a data directory.
func RootFSDir(dataDir string) string { return filepath.Join(dataDir, "rootfs") }

// Run performs every step.
func Run(ctx context.Context, cfg Config) error {
	if os.Geteuid() != 0 {
		return fmt.Errorf("setup needs root (it installs packages and builds a root filesystem)")
	}
	bar := progress.New(cfg.Out, 5, "spore setup")
	start := time.Now()

	bar.Step("Debian packages")
	note, err := ensurePackages(ctx, bar.Writer())
	if err != nil {
		return err
	}
	bar.StepDone(note)

	bar.Step("gVisor runsc " + RunscModule[strings.Index(RunscModule, "@")+1:])
	note, err = ensureRunsc(ctx, cfg, bar.Writer())
	if err != nil {
		return err
	}
	bar.StepDone(note)

	bar.Step("code generators")
	note, err = ensureTools(ctx, cfg, bar.Writer())
	if err != nil {
		return err
	}
	bar.StepDone(note)

	bar.Step("Node.js " + NodeVersion + " (for the E2B SDK tests)")
	note, err = ensureNode(ctx, cfg, bar.Writer())
	if err != nil {
		return err
	}
	bar.StepDone(note)

	bar.Step("base root filesystem")
	spec := rootfs.BaseSpec()
	if rootfs.UpToDate(RootFSDir(cfg.DataDir), spec) {
		bar.StepDone("up to date")
	} else {
		st, err := rootfs.Build(ctx, RootFSDir(cfg.DataDir), filepath.Join(cfg.CacheDir, "debootstrap"), spec, bar.Writer())
		if err != nil {
			return err
		}
		bar.StepDone("built " + st.ID)
	}
	fmt.Fprintf(outOrStderr(cfg.Out), "setup done in %v: runsc %s, root filesystems in %s\n",
		time.Since(start).Round(time.Millisecond), RunscPath(cfg.DataDir), RootFSDir(cfg.DataDir))
	return nil
}

func outOrStderr(w io.Writer) io.Writer {
	if w == nil {
		return os.Stderr
	}
	return w
}

func ensurePackages(ctx context.Context, log io.Writer) (string, error) {
	var missing []string
	for _, p := range Packages {
		out, err := exec.CommandContext(ctx, "dpkg-query", "-W", "-f=${Status}", p).Output()
		if err != nil || !bytes.Contains(out, []byte("install ok installed")) {
			missing = append(missing, p)
		}
	}
	if len(missing) == 0 {
		return "all present", nil
	}
	if err := aptInstall(ctx, log, missing...); err != nil {
		return "", err
	}
	return "installed " + strings.Join(missing, " "), nil
}

func aptInstall(ctx context.Context, log io.Writer, pkgs ...string) error {
	if err := run(ctx, log, nil, "apt-get", "update"); err != nil {
		return err
	}
	env := []string{"DEBIAN_FRONTEND=noninteractive"}
	return run(ctx, log, env, "apt-get", append([]string{"install", "-y", "--no-install-recommends"}, pkgs...)...)
}

func ensureTools(ctx context.Context, cfg Config, log io.Writer) (string, error) {
	dir := ToolsDir(cfg.CacheDir)
	stamp := filepath.Join(dir, ".versions")
	want := strings.Join(Tools, "\n")
	if b, err := os.ReadFile(stamp); err == nil && string(b) == want {
		return "up to date", nil
	}
	for _, t := range Tools {
		if err := run(ctx, log, []string{"GOBIN=" + dir}, "go", "install", t); err != nil {
			return "", err
		}
	}
	if err := os.WriteFile(stamp, []byte(want), 0o644); err != nil {
		return "", err
	}
	return "installed " + dir, nil
}

func run(ctx context.Context, log io.Writer, env []string, name string, args ...string) error {
	return runIn(ctx, os.TempDir(), log, env, name, args...) // never inside a module: go install must not see a go.mod
}

func runIn(ctx context.Context, dir string, log io.Writer, env []string, name string, args ...string) error {
	cmd := exec.CommandContext(ctx, name, args...)
	cmd.Env = append(os.Environ(), env...)
	var tail bytes.Buffer
	w := io.MultiWriter(log, &tail)
	cmd.Stdout, cmd.Stderr = w, w
	cmd.Dir = dir
	if err := cmd.Run(); err != nil {
		t := tail.String()
		if len(t) > 2000 {
			t = t[len(t)-2000:]
		}
		return fmt.Errorf("%s %s: %w\n%s", name, strings.Join(args, " "), err, t)
	}
	return nil
}

package setup

import (
	"bytes"
	"context"
	"embed"
	"encoding/json"
	"fmt"
	"io"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"strings"

	"github.com/spore-run/spore/internal/runtime/gvisor"
)

// RunscBuild names how setup builds runsc; bump it when the build changes.
// It is kept apart from the version (runsc.version), which snapshots
// record: the checkpoint format depends on the source, not on this.
//
// precompiled-seccomp-1: runsc's sandbox seccomp programs are precompiled
// into the binary (see seccompgen), as gVisor's release builds do; a plain
// `go install` leaves every start and restore to compile them (~16-25 ms).
// precompiled-seccomp-2: the gofer's too.
// pages-parallel-1: the page-file patch applied; save-holes-1: the pgalloc
// patch too; lazy-seccheck-1: the seccheck patch too; restore-gc-1: the
// restore's GC patch too; proc-umounter-1: the /proc umounter patch too
// (see Patches).
const RunscBuild = "precompiled-seccomp-2-pages-parallel-1-save-holes-1-lazy-seccheck-1-restore-gc-1-proc-umounter-1"

//go:embed seccompgen/main.go
var seccompGen []byte

// Patches are Spore's changes to the pinned gVisor source, each a small
// unified diff (patch -p1 from the module's root) that could go upstream
// as it is. TestGVisorPatchesApply fails when one stops applying to the
// pinned version.
//
//   - gvisor-pagesfile-parallel.patch: a checkpoint's pages file is read
//     and written by 128 workers, each raising GOMAXPROCS for the
//     duration; on a 2-CPU host that costs ~7 ms per restore and
//     checkpoint and starves the restored application of CPU while its
//     pages load (../shared/notes/restore-internals.md). Twice the CPUs,
//     at least 4 and at most 128, instead. Measured in docs/benchmarks.md.
//   - gvisor-pgalloc-save-skip-holes.patch: a checkpoint reads every
//     allocated page not known to be committed to find the zero ones, and
//     reading a page of the memory file that is a hole commits it, only
//     for the save to decommit it again. Most such pages are holes (every
//     save decommits the zero pages it finds, and a restore never loads
//     them), so a small sandbox's checkpoint spent ~25 ms faulting in and
//     punching out ~22 MB of them with the sandbox stopped. The patch asks
//     the host where the holes are (lseek SEEK_DATA/SEEK_HOLE) and reads
//     only data. Measured in docs/benchmarks.md.
//   - gvisor-seccheck-lazy-points.patch: every sandbox's boot registered
//     gVisor's ~1,000 trace points (seccheck), ~5 ms of CPU, though only
//     a trace session (--pod-init-config, `runsc trace`) looks them up.
//     They are registered when a session first needs them instead.
//   - gvisor-restore-gc-after-load.patch: a restore decodes the kernel's
//     state into objects that nearly all stay live, and the collector ran
//     a few cycles during the load, each marking them again as the heap
//     grew. It is held off for the load and runs once after: the GC's
//     share of a fork of 10's CPU went from ~7 % to ~4.5 % (perf), and
//     the restored sentry's RSS did not grow.
//   - gvisor-proc-umounter-memfd.patch: each sandbox and gofer start
//     runs a helper that waits, then unmounts /proc from the chroot once
//     the process that dropped its capabilities no longer needs it. The
//     helper was runsc itself (`runsc umount`): ~5 ms of CPU to start the
//     Go runtime and every package's init, for one umount2 call, on every
//     create, restore and restore target. On amd64 it is now an 80-byte
//     program (its assembly is in the patch) written to a memfd and run
//     from there; elsewhere, or if that fails, runsc's as before.
var Patches = []string{"gvisor-pagesfile-parallel.patch", "gvisor-pgalloc-save-skip-holes.patch", "gvisor-seccheck-lazy-points.patch", "gvisor-restore-gc-after-load.patch", "gvisor-proc-umounter-memfd.patch"}

//go:embed patches
var patches embed.FS

// PatchText returns one of Patches.
func PatchText(name string) ([]byte, error) { return patches.ReadFile("patches/" + name) }

// applyPatches applies Patches to the gVisor source tree at dir.
func applyPatches(ctx context.Context, dir string, log io.Writer, dryRun bool) error {
	for _, name := range Patches {
		b, err := PatchText(name)
		if err != nil {
			return err
		}
		args := []string{"-p1", "--forward", "--batch", "-d", dir}
		if dryRun {
			args = append(args, "--dry-run")
		}
		cmd := exec.CommandContext(ctx, "patch", args...)
		cmd.Stdin = bytes.NewReader(b)
		out, err := cmd.CombinedOutput()
		if err != nil {
			return fmt.Errorf("gVisor patch %s does not apply: %w: %s", name, err, bytes.TrimSpace(out))
		}
		fmt.Fprintf(log, "applied %s\n", name)
	}
	return nil
}

// ensureRunsc builds the pinned runsc once into the cache and installs it
// with a version file the gVisor driver reads (go-built binaries report no
// version of their own) and a build file naming RunscBuild.
func ensureRunsc(ctx context.Context, cfg Config, log io.Writer) (string, error) {
	dst := RunscPath(cfg.DataDir)
	version := RunscModule[strings.Index(RunscModule, "@")+1:]
	if readTrim(dst+".version") == version && readTrim(dst+".build") == RunscBuild {
		if _, err := os.Stat(dst); err == nil {
			return "up to date", nil
		}
	}
	cacheBin := filepath.Join(cfg.CacheDir, "runsc-"+version+"-"+RunscBuild)
	built := filepath.Join(cacheBin, "runsc")
	note := "cached build"
	if _, err := os.Stat(built); err != nil {
		if _, err := exec.LookPath("go"); err != nil {
			return "", fmt.Errorf("building runsc needs the go command: %w", err)
		}
		if err := buildRunsc(ctx, cfg.CacheDir, built, log); err != nil {
			return "", fmt.Errorf("build runsc: %w", err)
		}
		note = "built"
	}
	if err := os.MkdirAll(filepath.Dir(dst), 0o755); err != nil {
		return "", err
	}
	b, err := os.ReadFile(built)
	if err != nil {
		return "", err
	}
	// The build installed so far stays (snapshots it wrote restore only
	// with it), kept by content beside the new one, which is kept with its
	// version before it takes the installed path: a node starting
	// meanwhile finds either build whole and named right.
	builds := RunscBuildsDir(cfg.DataDir)
	if _, err := os.Stat(dst); err == nil {
		if _, err := gvisor.KeepBuild(ctx, builds, dst); err != nil {
			return "", fmt.Errorf("keep the installed runsc build (its snapshots need it; move %s away to drop it): %w", dst, err)
		}
	}
	tmp := dst + ".tmp"
	if err := os.WriteFile(tmp, b, 0o755); err != nil {
		return "", err
	}
	defer os.Remove(tmp + ".version")
	if err := os.WriteFile(tmp+".version", []byte(version+"\n"), 0o644); err != nil {
		return "", err
	}
	if _, err := gvisor.KeepBuild(ctx, builds, tmp); err != nil {
		return "", fmt.Errorf("keep the new runsc build: %w", err)
	}
	if err := os.Rename(tmp, dst); err != nil {
		return "", err
	}
	if err := os.WriteFile(dst+".version", []byte(version+"\n"), 0o644); err != nil {
		return "", err
	}
	if err := os.WriteFile(dst+".build", []byte(RunscBuild+"\n"), 0o644); err != nil {
		return "", err
	}
	return note + ", installed " + dst, nil
}

func readTrim(path string) string {
	b, _ := os.ReadFile(path)
	return strings.TrimSpace(string(b))
}

// GVisorSource downloads the pinned gVisor module (if the module cache
// lacks it) and returns its directory, read-only.
func GVisorSource(ctx context.Context) (string, error) {
	mod := RunscModule[:strings.Index(RunscModule, "/runsc@")] + RunscModule[strings.Index(RunscModule, "@"):]
	dl, err := exec.CommandContext(ctx, "go", "mod", "download", "-json", mod).Output()
	if err != nil {
		return "", fmt.Errorf("go mod download %s: %w", mod, err)
	}
	var info struct{ Dir, Error string }
	if err := json.Unmarshal(dl, &info); err != nil || info.Dir == "" {
		return "", fmt.Errorf("go mod download %s: %v %s", mod, err, info.Error)
	}
	return info.Dir, nil
}

// buildRunsc builds runsc static from a writable copy of the pinned gVisor
// module (the module cache is read-only and `go build -overlay` may not
// replace files in it) with Patches applied and its seccomp programs
// precompiled.
func buildRunsc(ctx context.Context, cacheDir, out string, log io.Writer) error {
	dir, err := GVisorSource(ctx)
	if err != nil {
		return err
	}
	src := filepath.Join(cacheDir, "runsc-src")
	if err := os.RemoveAll(src); err != nil {
		return err
	}
	defer os.RemoveAll(src)
	if err := copyTree(dir, src); err != nil {
		return fmt.Errorf("copy the gVisor module: %w", err)
	}
	if err := applyPatches(ctx, src, log, false); err != nil {
		return err
	}
	genDir := filepath.Join(src, "runsc", "sporeseccompgen")
	if err := os.MkdirAll(genDir, 0o755); err != nil {
		return err
	}
	// The generator's build tag keeps it out of Spore's own build; here
	// it is the only file of its package, built without the tag.
	gen := strings.Replace(string(seccompGen), "//go:build spore_seccompgen", "", 1)
	if err := os.WriteFile(filepath.Join(genDir, "main.go"), []byte(gen), 0o644); err != nil {
		return err
	}
	env := []string{"CGO_ENABLED=0", "GOFLAGS=-buildvcs=false"}
	target := filepath.Join(src, "runsc", "boot", "filter", "filter_precompiled.go")
	goferTarget := filepath.Join(src, "runsc", "fsgofer", "filter", "filter_precompiled.go")
	if err := runIn(ctx, src, log, env, "go", "run", "./runsc/sporeseccompgen", "-o", target, "-gofer-o", goferTarget); err != nil {
		return fmt.Errorf("precompile seccomp programs: %w", err)
	}
	if err := os.MkdirAll(filepath.Dir(out), 0o755); err != nil {
		return err
	}
	return runIn(ctx, src, log, env, "go", "build", "-trimpath", "-ldflags=-s -w", "-o", out, "./runsc")
}

// copyTree copies a directory tree of regular files, writable.
func copyTree(from, to string) error {
	return filepath.WalkDir(from, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(from, p)
		dst := filepath.Join(to, rel)
		if d.IsDir() {
			return os.MkdirAll(dst, 0o755)
		}
		if !d.Type().IsRegular() {
			return nil
		}
		b, err := os.ReadFile(p)
		if err != nil {
			return err
		}
		return os.WriteFile(dst, b, 0o644)
	})
}

// Package testenv locates the real runtime pieces tests run against (the
// runsc binary and the base root filesystem that `make setup` installs).
// A missing piece fails the test loudly: nothing skips, except that the
// fast tier (SPORE_TIER=fast, see scripts/test.sh) skips every test that
// needs the real runtime, so the fast tier runs without runsc or root
// filesystems.
package testenv

import (
	"fmt"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"sync"
	"testing"
	"time"
)

// DataDir is where `make setup` installs the runtime (SPORE_DATA_DIR
// overrides it).
func DataDir() string {
	if d := os.Getenv("SPORE_DATA_DIR"); d != "" {
		return d
	}
	return "/var/lib/spore"
}

// TierEnv names the test tier; "fast" skips the real-runtime tests.
const TierEnv = "SPORE_TIER"

// Fast reports whether this is the fast tier.
func Fast() bool { return os.Getenv(TierEnv) == "fast" }

// RealTier skips t in the fast tier: t needs the real runtime (runsc,
// root filesystems, root, a running server). In the real tier (SPORE_TIER
// unset) it does nothing, and a missing piece then fails the test. Every
// helper below that locates a real piece calls it first; a test that does
// real work before calling one of them calls it itself.
func RealTier(t testing.TB) {
	t.Helper()
	if Fast() {
		t.Skip("real tier: needs the real runtime (SPORE_TIER=fast)")
	}
}

// SeedEnv overrides the seed of Rand, to replay a failed run.
const SeedEnv = "SPORE_TEST_SEED"

// Rand returns the random source for a test's random delays and choices
// (crash and chaos tests), seeded from SPORE_TEST_SEED or else the clock.
// The seed is logged, so a failure can be replayed with the same delays
// and choices (the host's own timing still varies).
func Rand(t testing.TB) *rand.Rand {
	t.Helper()
	seed := uint64(time.Now().UnixNano())
	if s := os.Getenv(SeedEnv); s != "" {
		n, err := strconv.ParseUint(s, 10, 64)
		if err != nil {
			t.Fatalf("%s=%q is not a number", SeedEnv, s)
		}
		seed = n
	}
	t.Logf("seed %d (replay: %s=%d)", seed, SeedEnv, seed)
	return rand.New(rand.NewPCG(seed, seed^0x5eed))
}

// Runsc returns the runsc binary, failing t when it is missing.
func Runsc(t testing.TB) string {
	t.Helper()
	RealTier(t)
	p := os.Getenv("SPORE_RUNSC")
	if p == "" {
		p = filepath.Join(DataDir(), "bin", "runsc")
	}
	if _, err := os.Stat(p); err != nil {
		t.Fatalf("runsc not found at %s (run `make setup`): %v", p, err)
	}
	return p
}

// RootFSDir returns the directory holding the named root filesystems.
func RootFSDir(t testing.TB) string {
	t.Helper()
	RealTier(t)
	dir := filepath.Join(DataDir(), "rootfs")
	if _, err := os.Stat(filepath.Join(dir, "base", "usr", "bin", "python3")); err != nil {
		t.Fatalf("base root filesystem not found under %s (run `make setup`): %v", dir, err)
	}
	return dir
}

// PrivateRootFSDir is a root filesystem directory of the test's own,
// removed when the test ends: the shared base tree hard-linked into it
// (no file data copied; a root filesystem is only ever a read-only lower
// layer) with its stamp, on the shared directory's filesystem. What a node
// adds there (image trees pulled from a registry, their root filesystems,
// export layers: hundreds of MB each) goes with the test instead of
// piling up in the shared directory.
func PrivateRootFSDir(t testing.TB) string {
	t.Helper()
	shared := RootFSDir(t)
	dir, err := os.MkdirTemp(DataDir(), "test-rootfs-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	if out, err := exec.Command("cp", "-al", filepath.Join(shared, "base"), filepath.Join(dir, "base")).CombinedOutput(); err != nil {
		t.Fatalf("hard-link the base root filesystem: %v: %s", err, out)
	}
	stamp, err := os.ReadFile(filepath.Join(shared, "base.json"))
	if err == nil {
		err = os.WriteFile(filepath.Join(dir, "base.json"), stamp, 0o644)
	}
	if err != nil {
		t.Fatal(err)
	}
	return dir
}

// BaseRootFS returns the path of the base root filesystem.
func BaseRootFS(t testing.TB) string {
	return filepath.Join(RootFSDir(t), "base")
}

// RequireRoot fails t unless it runs as root (runsc needs it); real-tier
// tests only, so it skips in the fast tier.
func RequireRoot(t testing.TB) {
	t.Helper()
	RealTier(t)
	if os.Geteuid() != 0 {
		t.Fatalf("this test runs real sandboxes and needs root")
	}
}

var (
	envdOnce sync.Once
	envdPath string
	envdErr  error
)

// EnvdBinary builds spore-envd (static) once per test binary and returns
// its path.
func EnvdBinary(t testing.TB) string {
	t.Helper()
	envdOnce.Do(func() {
		dir, err := os.MkdirTemp("", "spore-envd-build-")
		if err != nil {
			envdErr = err
			return
		}
		envdPath = filepath.Join(dir, "spore-envd")
		cmd := exec.Command("go", "build", "-o", envdPath, "github.com/spore-run/spore/cmd/spore-envd")
		cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
		if out, err := cmd.CombinedOutput(); err != nil {
			envdErr = fmt.Errorf("build spore-envd: %v: %s", err, out)
		}
	})
	if envdErr != nil {
		t.Fatal(envdErr)
	}
	return envdPath
}

// Chromium is the headless browser the console tests drive (Debian's
// chromium, which `make sdk-deps` installs); missing, the test fails.
func Chromium(t testing.TB) string {
	t.Helper()
	RealTier(t)
	for _, p := range []string{os.Getenv("SPORE_CHROMIUM"), "/usr/bin/chromium"} {
		if p == "" {
			continue
		}
		if _, err := os.Stat(p); err == nil {
			return p
		}
	}
	t.Fatalf("chromium not found at /usr/bin/chromium (`make sdk-deps` installs Debian's chromium; SPORE_CHROMIUM names another)")
	return ""
}

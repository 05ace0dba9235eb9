package setup

import (
	"context"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/spore-run/spore/internal/runtime/gvisor"
)

// Installing a new runsc keeps the build it replaces: snapshots written by
// it restore only with it. Both builds are kept by content, each with its
// own version; the installed path holds the new one.
func TestInstallKeepsReplacedRunsc(t *testing.T) {
	ctx := context.Background()
	data, cache := t.TempDir(), t.TempDir()
	version := RunscModule[strings.Index(RunscModule, "@")+1:]
	dst := RunscPath(data)
	os.MkdirAll(filepath.Dir(dst), 0o755)
	os.WriteFile(dst, []byte("#!/bin/sh\necho old build\n"), 0o755)
	os.WriteFile(dst+".version", []byte("v-old\n"), 0o644)
	os.WriteFile(dst+".build", []byte("an-older-build\n"), 0o644)
	built := filepath.Join(cache, "runsc-"+version+"-"+RunscBuild, "runsc")
	os.MkdirAll(filepath.Dir(built), 0o755)
	os.WriteFile(built, []byte("#!/bin/sh\necho new build\n"), 0o755)
	oldBuild, err := gvisor.BuildOf(dst)
	if err != nil {
		t.Fatal(err)
	}

	if _, err := ensureRunsc(ctx, Config{DataDir: data, CacheDir: cache}, io.Discard); err != nil {
		t.Fatal(err)
	}
	if b, _ := os.ReadFile(dst); string(b) != "#!/bin/sh\necho new build\n" {
		t.Fatalf("installed binary holds %q", b)
	}
	newBuild, err := gvisor.BuildOf(dst)
	if err != nil {
		t.Fatal(err)
	}
	for build, want := range map[string][2]string{
		oldBuild: {"#!/bin/sh\necho old build\n", "v-old"},
		newBuild: {"#!/bin/sh\necho new build\n", version},
	} {
		dir := gvisor.BuildDir(RunscBuildsDir(data), build)
		b, err := os.ReadFile(filepath.Join(dir, "runsc"))
		if err != nil || string(b) != want[0] {
			t.Fatalf("kept build %s: %q, %v", build, b, err)
		}
		if v, _ := os.ReadFile(filepath.Join(dir, "runsc.version")); strings.TrimSpace(string(v)) != want[1] {
			t.Fatalf("kept build %s has version %q, want %q", build, v, want[1])
		}
	}
	if left, _ := filepath.Glob(dst + ".tmp*"); len(left) != 0 {
		t.Fatalf("left beside the binary: %v", left)
	}
}

package setup

import (
	"context"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/spore-run/spore/internal/testenv"
)

// Every gVisor patch applies to the pinned module's source (this fails
// when the pin moves and a patch no longer applies), and the patched files
// say what the patches mean them to.
func TestGVisorPatchesApply(t *testing.T) {
	testenv.RealTier(t) // downloads the gVisor module when the cache lacks it
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	dir, err := GVisorSource(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if err := applyPatches(ctx, dir, io.Discard, true); err != nil {
		t.Fatal(err)
	}
	// Applied for real to a copy of the files they change.
	tmp := t.TempDir()
	for _, name := range Patches {
		text, err := PatchText(name)
		if err != nil {
			t.Fatal(err)
		}
		for _, line := range strings.Split(string(text), "\n") {
			rel, ok := strings.CutPrefix(line, "+++ b/")
			if !ok {
				continue
			}
			b, err := os.ReadFile(filepath.Join(dir, rel))
			if err != nil {
				t.Fatal(err)
			}
			if err := os.MkdirAll(filepath.Dir(filepath.Join(tmp, rel)), 0o755); err != nil {
				t.Fatal(err)
			}
			if err := os.WriteFile(filepath.Join(tmp, rel), b, 0o644); err != nil {
				t.Fatal(err)
			}
		}
	}
	if err := applyPatches(ctx, tmp, io.Discard, false); err != nil {
		t.Fatal(err)
	}
	got, _ := os.ReadFile(filepath.Join(tmp, "pkg", "sentry", "state", "stateio", "pagesfile.go"))
	if !strings.Contains(string(got), "max(4, 2*runtime.NumCPU())") || strings.Contains(string(got), "pagesFileFDDefaultMaxParallel = 128") {
		t.Fatalf("the patched pagesfile.go does not bound the page workers by the CPUs:\n%s", got)
	}
	// What the pgalloc patch does is proven by the runtime's
	// TestCheckpointSkipsHoles, which reads runsc's log of it.
	got, _ = os.ReadFile(filepath.Join(tmp, "pkg", "sentry", "pgalloc", "save_restore.go"))
	if !strings.Contains(string(got), "holes.isHole(off)") {
		t.Fatal("the patched save_restore.go does not skip holes")
	}
	// ... and the seccheck patch's by TestTraceSessionAtBoot.
	got, _ = os.ReadFile(filepath.Join(tmp, "pkg", "sentry", "seccheck", "config.go"))
	if !strings.Contains(string(got), "\tInitialize()\n\tif desc, ok := Points[name]") {
		t.Fatal("the patched seccheck config.go does not register points on first use")
	}
	// ... and the restore's GC patch's by TestRestoreGCHeldForTheLoad.
	got, _ = os.ReadFile(filepath.Join(tmp, "runsc", "boot", "restore.go"))
	if !strings.Contains(string(got), "gcPercent := runtimedebug.SetGCPercent(-1)\n\terr = l.k.LoadFrom(") {
		t.Fatal("the patched restore.go does not hold the GC off for the kernel's load")
	}
	// ... and the /proc umounter patch's by TestProcUmounterFromMemfd.
	got, _ = os.ReadFile(filepath.Join(tmp, "runsc", "cmd", "sandboxsetup", "process.go"))
	if !strings.Contains(string(got), "if prog, err := procUmounterProgram(); err == nil {") {
		t.Fatal("the patched process.go does not start the /proc umounter from a memfd")
	}
	// A second application is refused (--forward): the build never
	// patches twice silently.
	if err := applyPatches(ctx, tmp, io.Discard, false); err == nil {
		t.Fatal("the patch applied twice")
	}
}

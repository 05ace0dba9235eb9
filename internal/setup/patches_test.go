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
// when the pin moves and a patch no longer applies), and the page-reader
// patch does what it says.
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
	// Applied for real to a copy of the file it changes.
	rel := filepath.Join("pkg", "sentry", "state", "stateio", "pagesfile.go")
	tmp := t.TempDir()
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
	if err := applyPatches(ctx, tmp, io.Discard, false); err != nil {
		t.Fatal(err)
	}
	got, _ := os.ReadFile(filepath.Join(tmp, rel))
	if !strings.Contains(string(got), "max(4, 2*runtime.NumCPU())") || strings.Contains(string(got), "pagesFileFDDefaultMaxParallel = 128") {
		t.Fatalf("the patched pagesfile.go does not bound the page workers by the CPUs:\n%s", got)
	}
	// A second application is refused (--forward): the build never
	// patches twice silently.
	if err := applyPatches(ctx, tmp, io.Discard, false); err == nil {
		t.Fatal("the patch applied twice")
	}
}

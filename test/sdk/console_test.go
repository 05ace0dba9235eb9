package sdk

import (
	"os"
	"strings"
	"testing"

	"github.com/spore-run/spore/internal/testenv"
)

// The web console in a real headless Chromium (console.mjs): sign in (a
// wrong key refused), a sandbox made through the stock SDK appears by
// itself, two snapshots, fork 2 shown in the lineage, the diff of the two
// snapshots, a rollback the SDK sees, bulk kill of the forks, the page on
// a phone's width, its security headers. SPORE_CONSOLE_SCREENSHOTS=DIR
// saves the main pages there (docs/console.md's pictures).
func TestConsole(t *testing.T) {
	chrome := testenv.Chromium(t)
	s := newServer(t)
	out := s.node("console.mjs", "CHROMIUM="+chrome, "SCREENSHOTS="+os.Getenv("SPORE_CONSOLE_SCREENSHOTS"))
	t.Log(out)
	if !strings.Contains(out, "console: 16 passed") {
		t.Fatalf("the console test did not pass: %s", out)
	}
}

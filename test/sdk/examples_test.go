package sdk

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/spore-run/spore/internal/testenv"
)

// Every script in examples/ runs to "ok" against a real spore up.
func TestExamples(t *testing.T) {
	testenv.RealTier(t)
	scripts, _ := filepath.Glob("../../examples/*.mjs")
	if len(scripts) < 3 {
		t.Fatalf("examples: %v", scripts)
	}
	if _, err := os.Stat("../../examples/node_modules/e2b"); err != nil {
		t.Fatal("examples/node_modules missing: `make test` installs it (npm ci --prefix examples)")
	}
	s := newServer(t)
	for _, script := range scripts {
		t.Run(filepath.Base(script), func(t *testing.T) {
			cmd := exec.Command("node", filepath.Base(script))
			cmd.Dir = "../../examples"
			cmd.Env = append(os.Environ(), "E2B_API_URL=http://"+s.addr, "E2B_SANDBOX_URL=http://"+s.addr, "E2B_API_KEY="+apiKey)
			out, err := cmd.CombinedOutput()
			t.Logf("%s", out)
			if err != nil || !strings.HasSuffix(strings.TrimSpace(string(out)), "ok") {
				t.Fatalf("%s: %v", script, err)
			}
		})
	}
	if code, body := s.rest("GET", "/v2/sandboxes", ""); code != 200 || string(body) != "[]\n" {
		t.Fatalf("examples left sandboxes: %s", body)
	}
}

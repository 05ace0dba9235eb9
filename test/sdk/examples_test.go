package sdk

import (
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

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
			start := time.Now()
			out, err := cmd.CombinedOutput()
			t.Logf("%s", out)
			if err != nil || !strings.HasSuffix(strings.TrimSpace(string(out)), "ok") {
				t.Logf("%s ran %v", script, time.Since(start).Round(time.Millisecond))
				s.probeSandboxes()
				t.Fatalf("%s: %v", script, err)
			}
		})
	}
	if code, body := s.rest("GET", "/v2/sandboxes", ""); code != 200 || string(body) != "[]\n" {
		t.Fatalf("examples left sandboxes: %s", body)
	}
}

// probeSandboxes logs, for each sandbox still listed, how its envd answers
// a health check through the server's proxy and how long that takes: after
// a failed example (a "fetch failed" once in CI, never reproduced), this
// says whether the server, the proxy and the sandbox still answer.
func (s *server) probeSandboxes() {
	code, body := s.rest("GET", "/v2/sandboxes", "")
	var list []struct {
		SandboxID string `json:"sandboxID"`
		State     string `json:"state"`
	}
	json.Unmarshal(body, &list)
	s.t.Logf("after the failure: GET /v2/sandboxes %d, %d sandboxes", code, len(list))
	c := &http.Client{Timeout: 15 * time.Second}
	for _, sb := range list {
		req, _ := http.NewRequest("GET", "http://"+s.addr+"/health", nil)
		req.Header.Set("E2b-Sandbox-Id", sb.SandboxID)
		t0 := time.Now()
		resp, err := c.Do(req)
		status := fmt.Sprint(err)
		if err == nil {
			resp.Body.Close()
			status = resp.Status
		}
		s.t.Logf("  %s (%s): envd /health through the proxy: %s in %v", sb.SandboxID, sb.State, status, time.Since(t0).Round(time.Millisecond))
	}
}

package k8s

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/spore-run/spore/internal/testenv"
)

// TestSystemdUnits checks deploy/systemd: systemd itself accepts both units (`systemd-analyze
// verify`, with the spore binary's path pointed at an existing executable, since none is installed
// here), and every variable the units expand is set in spore.env.example.
func TestSystemdUnits(t *testing.T) {
	testenv.RealTier(t)
	analyze, err := exec.LookPath("systemd-analyze")
	if err != nil {
		t.Fatalf("systemd-analyze (Debian package systemd) is needed to check the units: %v", err)
	}
	_, file, _, _ := runtime.Caller(0)
	src := filepath.Join(filepath.Dir(file), "..", "..", "deploy", "systemd")
	env, err := os.ReadFile(filepath.Join(src, "spore.env.example"))
	if err != nil {
		t.Fatal(err)
	}
	defined := map[string]bool{}
	for _, line := range strings.Split(string(env), "\n") {
		if k, _, ok := strings.Cut(strings.TrimSpace(line), "="); ok && !strings.HasPrefix(k, "#") {
			defined[k] = true
		}
	}
	dir := t.TempDir()
	var units []string
	for _, name := range []string{"spore-api.service", "spore-node.service"} {
		b, err := os.ReadFile(filepath.Join(src, name))
		if err != nil {
			t.Fatal(err)
		}
		for _, m := range regexp.MustCompile(`\$\{([A-Z_]+)\}`).FindAllStringSubmatch(string(b), -1) {
			if !defined[m[1]] {
				t.Errorf("%s uses ${%s}, which spore.env.example does not set", name, m[1])
			}
		}
		unit := filepath.Join(dir, name)
		if err := os.WriteFile(unit, []byte(strings.ReplaceAll(string(b), "/usr/local/bin/spore", "/bin/true")), 0o644); err != nil {
			t.Fatal(err)
		}
		units = append(units, unit)
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if out, err := exec.CommandContext(ctx, analyze, append([]string{"verify"}, units...)...).CombinedOutput(); err != nil || len(out) > 0 {
		t.Fatalf("systemd-analyze verify: %v\n%s", err, out)
	}
}

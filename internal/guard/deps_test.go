// Package guard holds the architecture's guardrails as tests.
package guard

import (
	"os/exec"
	"strings"
	"testing"
)

// The in-sandbox daemon is a separate static binary placed in every root
// filesystem: it must not pull in host-side packages (the runtime, the
// engine, networking, storage).
func TestEnvdImportsNothingHostSide(t *testing.T) {
	out, err := exec.Command("go", "list", "-deps", "github.com/spore-run/spore/cmd/spore-envd").CombinedOutput()
	if err != nil {
		t.Fatalf("go list: %v: %s", err, out)
	}
	allowed := []string{
		"github.com/spore-run/spore/cmd/spore-envd",
		"github.com/spore-run/spore/internal/envd",
		"github.com/spore-run/spore/proto/gen/",
		// Error kinds only: sentinel errors, no dependencies.
		"github.com/spore-run/spore/internal/errdefs",
	}
	for _, pkg := range strings.Fields(string(out)) {
		if !strings.HasPrefix(pkg, "github.com/spore-run/spore/") {
			continue
		}
		ok := false
		for _, a := range allowed {
			ok = ok || strings.HasPrefix(pkg, a)
		}
		if !ok {
			t.Errorf("spore-envd depends on host-side package %s", pkg)
		}
	}
}

// The engine works through the runtime contract: it must not reach into a
// runtime implementation.
func TestEngineUsesRuntimeContractOnly(t *testing.T) {
	out, err := exec.Command("go", "list", "-deps", "github.com/spore-run/spore/internal/engine").CombinedOutput()
	if err != nil {
		t.Fatalf("go list: %v: %s", err, out)
	}
	for _, pkg := range strings.Fields(string(out)) {
		if strings.HasPrefix(pkg, "github.com/spore-run/spore/internal/runtime/") {
			t.Errorf("engine depends on runtime implementation %s", pkg)
		}
	}
}

// The control plane reaches nodes only through the node contract
// (internal/nodeapi): the packages that run on an API replica import no
// engine, runtime, network, snapshot or node package, so the same code
// drives an in-process node and remote node agents.
func TestControlPlaneUsesNodeContractOnly(t *testing.T) {
	forbidden := []string{"engine", "runtime", "netns", "snapshot", "node", "nodeapi/local"}
	for _, pkg := range []string{"control", "api", "proxy", "scheduler"} {
		out, err := exec.Command("go", "list", "-deps", "github.com/spore-run/spore/internal/"+pkg).CombinedOutput()
		if err != nil {
			t.Fatalf("go list: %v: %s", err, out)
		}
		for _, dep := range strings.Fields(string(out)) {
			for _, f := range forbidden {
				p := "github.com/spore-run/spore/internal/" + f
				if dep == p || strings.HasPrefix(dep, p+"/") {
					t.Errorf("internal/%s depends on %s", pkg, dep)
				}
			}
		}
	}
}

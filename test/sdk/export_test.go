package sdk

import (
	"strings"
	"testing"

	"github.com/spore-run/spore/internal/testenv"
)

// TestExportAndColdStart: a sandbox's and a snapshot's filesystems
// exported as OCI images to a registry the test serves, then templates
// built from those images (a cold start from them) have the changes
// (export.mjs, the stock SDK and the export routes).
func TestExportAndColdStart(t *testing.T) {
	reg := testenv.NewRegistry(t, "", "")
	host := registryHost(t, reg.Push(t, "seed/busybox:1", testenv.BusyboxImage(t)))
	s := newServer(t, "--insecure-registry", host)
	out := s.node("export.mjs", "REGISTRY="+host)
	t.Log(out)
	if !strings.Contains(out, "4 passed, 0 failed") {
		t.Fatal("export flow did not pass")
	}
	// The CLI: a template's filesystem, then bad input.
	if got := s.ok("snapshot", "export", "base", host+"/exported/base:1"); !strings.Contains(got, host+"/exported/base:1@sha256:") {
		t.Fatalf("spore snapshot export: %s", got)
	}
	for _, args := range [][]string{
		{"snapshot", "export", "base", "Not A Ref"},
		{"snapshot", "export", "no-such-snapshot", host + "/x:1"},
		{"snapshot", "export", "--sandbox", "inosuchsandboxxxxxxx", host + "/x:1"},
		{"snapshot", "export", "--registry-user", "u", "base", host + "/x:1"},
	} {
		if o, e, code := s.cli("", args...); code == 0 || e == "" {
			t.Errorf("spore %v: exit %d, stdout %q, stderr %q", args, code, o, e)
		}
	}
}

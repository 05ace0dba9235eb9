package api_test

import (
	"strings"
	"testing"
)

// TestExportLayoutBadInput: the export routes refuse a ref with a format,
// an unknown format and credentials with a layout (400, before anything
// runs), and a layout from an API without a blob store to carry it
// (409, saying why).
func TestExportLayoutBadInput(t *testing.T) {
	f := newFnode(t)
	sb := f.create(`{"templateID":"base","timeout":60}`)
	for _, path := range []string{"/sandboxes/" + sb.SandboxID + "/export", "/snapshots/base/export"} {
		for body, want := range map[string]int{
			`{"ref":"registry.example.com/a:1","format":"oci-layout"}`: 400,
			`{"format":"docker-archive"}`:                              400,
			`{"format":"oci-layout","username":"u","password":"p"}`:    400,
			`{}`:                      400,
			`{"format":"oci-layout"}`: 409,
		} {
			code, b, _ := f.do("POST", path, body)
			if code != want || !strings.Contains(string(b), `"message"`) {
				t.Errorf("POST %s %s: %d %s, want %d", path, body, code, b, want)
			}
			if code == 409 && !strings.Contains(string(b), "blob store") {
				t.Errorf("POST %s %s: %s does not say why", path, body, b)
			}
		}
	}
}

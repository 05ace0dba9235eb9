package setup

import "testing"

// The E2B SDKs refuse Node.js older than 20.18.1: setup must tell 20.9 (older,
// though it sorts after as a string) from 20.18.1 and 22.
func TestVersionAtLeast(t *testing.T) {
	for _, c := range []struct {
		v    string
		want bool
	}{
		{"20.18.1", true}, {"20.20.2", true}, {"22.0.0", true}, {"20.19", true},
		{"20.9.0", false}, {"18.20.4", false}, {"20.18.0", false}, {"20.18", false}, {"x", false},
	} {
		if got := versionAtLeast(c.v, nodeMin); got != c.want {
			t.Errorf("versionAtLeast(%q, %q) = %v, want %v", c.v, nodeMin, got, c.want)
		}
	}
}

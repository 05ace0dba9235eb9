package node

import (
	"testing"

	"github.com/spore-run/spore/internal/errdefs"
)

// TestParseInsecureRegistries: host or host:port only; anything with a
// scheme, a path or nothing is refused (a typo must not silently allow
// nothing, or something else).
func TestParseInsecureRegistries(t *testing.T) {
	got, err := ParseInsecureRegistries([]string{"127.0.0.1:5000", "registry.lan", "[::1]:5000"})
	if err != nil || len(got) != 3 || !got["127.0.0.1:5000"] || !got["registry.lan"] || !got["[::1]:5000"] {
		t.Fatalf("valid list: %v, %v", got, err)
	}
	for _, bad := range []string{"", "http://127.0.0.1:5000", "127.0.0.1:5000/repo", "Registry.lan:x", " reg"} {
		if _, err := ParseInsecureRegistries([]string{bad}); !errdefs.IsInvalidArgument(err) {
			t.Errorf("%q: %v, want invalid argument", bad, err)
		}
	}
}

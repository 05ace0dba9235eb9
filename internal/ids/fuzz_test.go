package ids

import (
	"path/filepath"
	"strings"
	"testing"
)

// Whatever Validate or ValidateName accepts is safe to use as one path
// element: no separator, no dot-dot, no NUL, stays under its parent.
func FuzzValidate(f *testing.F) {
	for _, s := range []string{"base", "i0123456789abcdefghi", "../x", "a/b", "..", ".", "", "x\x00", "UPPER", "-x", "名前", strings.Repeat("a", 200)} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		for _, check := range []func(string, string) error{Validate, ValidateName} {
			if check("id", s) != nil {
				continue
			}
			if strings.ContainsAny(s, "/\\\x00") || s == "." || s == ".." || strings.HasPrefix(s, ".") {
				t.Fatalf("accepted %q", s)
			}
			if p := filepath.Join("/data/snapshots", s); filepath.Dir(p) != "/data/snapshots" {
				t.Fatalf("%q escapes its parent: %s", s, p)
			}
		}
	})
}

package sqlite

import (
	"testing"

	"github.com/spore-run/spore/internal/errdefs"
)

// A paging token is either refused as invalid input or names a position
// that encodes back to itself.
func FuzzCursor(f *testing.F) {
	for _, s := range []string{"", "c2VxOjE", encodeCursor(42), "garbage", "c2VxOi0x", "!!!", "c2VxOjk5OTk5OTk5OTk5OTk5OTk5OTk5OTk"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		n, err := decodeCursor(s)
		if err != nil {
			if !errdefs.IsInvalidArgument(err) {
				t.Fatalf("decodeCursor(%q) = %v, want invalid argument", s, err)
			}
			return
		}
		if n < 0 {
			t.Fatalf("decodeCursor(%q) = %d", s, n)
		}
		if s != "" {
			if m, err := decodeCursor(encodeCursor(n)); err != nil || m != n {
				t.Fatalf("round trip of %d: %d %v", n, m, err)
			}
		}
	})
}

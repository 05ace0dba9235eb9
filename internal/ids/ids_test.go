package ids

import (
	"testing"

	"github.com/spore-run/spore/internal/errdefs"
)

func TestValidate(t *testing.T) {
	good := []string{"a", "i0123456789abcdefghi", "base", "sb-1", New('i'), New('s')}
	for _, id := range good {
		if err := Validate("sandbox ID", id); err != nil {
			t.Errorf("Validate(%q) = %v, want nil", id, err)
		}
	}
	bad := []string{"", "../x", "a/b", "/abs", ".", "..", "-x", "A", "x y", "x\x00", "x\n",
		"0123456789012345678901234567890123456789012345678901234567890123"}
	for _, id := range bad {
		err := Validate("sandbox ID", id)
		if !errdefs.IsInvalidArgument(err) {
			t.Errorf("Validate(%q) = %v, want invalid argument", id, err)
		}
	}
}

func TestValidateName(t *testing.T) {
	for _, n := range []string{"base", "code-interpreter-v1", "My_Snap.2"} {
		if err := ValidateName("name", n); err != nil {
			t.Errorf("ValidateName(%q) = %v", n, err)
		}
	}
	for _, n := range []string{"", ".", "..", "../etc", "a/b", ".hidden", "-x", "a b", "ü"} {
		if err := ValidateName("name", n); !errdefs.IsInvalidArgument(err) {
			t.Errorf("ValidateName(%q) = %v, want invalid argument", n, err)
		}
	}
}

func TestNewIsUniqueAndValid(t *testing.T) {
	seen := map[string]bool{}
	for range 1000 {
		id := New('i')
		if id[0] != 'i' || len(id) != idLen || seen[id] {
			t.Fatalf("bad or repeated id %q", id)
		}
		seen[id] = true
	}
}

func TestDeriveIsStableAndValid(t *testing.T) {
	a := Derive('v', "iaaaa", "vbbbb")
	if a != Derive('v', "iaaaa", "vbbbb") {
		t.Fatal("Derive gave two IDs for the same parts")
	}
	if err := Validate("volume ID", a); err != nil || len(a) != idLen || a[0] != 'v' {
		t.Fatalf("Derive = %q (%v): want %d characters of New's shape, starting with v", a, err, idLen)
	}
	// Parts are kept apart: ("ab", "c") and ("a", "bc") differ.
	if Derive('v', "ab", "c") == Derive('v', "a", "bc") || Derive('v', "iaaaa", "vcccc") == a {
		t.Fatal("Derive gave one ID for different parts")
	}
}

package volume

import (
	"testing"

	"github.com/spore-run/spore/internal/errdefs"
)

func TestParseSize(t *testing.T) {
	for in, want := range map[string]int64{
		"512": 512 * MiB, "512M": 512 * MiB, "512MiB": 512 * MiB, "512mb": 512 * MiB, "10G": 10 * GiB, "1.5GiB": GiB + GiB/2,
		"1T": 1 << 40, "64K": 64 << 10, " 2 G ": 2 * GiB, "0": 0,
	} {
		if got, err := ParseSize(in); err != nil || got != want {
			t.Errorf("ParseSize(%q) = %d, %v; want %d", in, got, err, want)
		}
	}
	for _, in := range []string{"", "G", "-1G", "1X", "1..2G", "1e3", "99999999T", "1 GB extra"} {
		if got, err := ParseSize(in); !errdefs.IsInvalidArgument(err) {
			t.Errorf("ParseSize(%q) = %d, %v; want an invalid-argument error", in, got, err)
		}
	}
}

func TestFormatSize(t *testing.T) {
	for n, want := range map[int64]string{10 * GiB: "10 GiB", GiB + GiB/2: "1.5 GiB", 16 * MiB: "16 MiB", 1 << 40: "1 TiB", 100: "100 B"} {
		if got := FormatSize(n); got != want {
			t.Errorf("FormatSize(%d) = %q, want %q", n, got, want)
		}
	}
}

// Names never take an ID's shape, so a ref (ID or name) is never
// ambiguous; modes and sizes have defaults and bounds.
func TestValidate(t *testing.T) {
	for _, ok := range []string{"data", "Repo.v2", "a", "model_cache-1"} {
		if err := ValidateName(ok); err != nil {
			t.Errorf("ValidateName(%q): %v", ok, err)
		}
	}
	for _, bad := range []string{"", ".hidden", "-x", "a/b", "..", "a b", NewID(), string(make([]byte, 64))} {
		if err := ValidateName(bad); !errdefs.IsInvalidArgument(err) {
			t.Errorf("ValidateName(%q) = %v, want refused", bad, err)
		}
	}
	if id := NewID(); !IsID(id) || ValidateRef(id) != nil || ValidateRef("../x") == nil {
		t.Errorf("IDs and refs: %q", id)
	}
	if m, err := ValidateMode(""); m != "shared" || err != nil {
		t.Errorf("default mode %q %v", m, err)
	}
	if _, err := ValidateMode("Exclusive"); err == nil {
		t.Error("modes are exact")
	}
	if n, err := ValidateSize(0); n != DefaultSize || err != nil {
		t.Errorf("default size %d %v", n, err)
	}
	for _, bad := range []int64{-1, MinSize - 1, MaxSize + 1} {
		if _, err := ValidateSize(bad); !errdefs.IsInvalidArgument(err) {
			t.Errorf("ValidateSize(%d) = %v", bad, err)
		}
	}
}

// Mount paths: absolute, clean, outside the kernel's and Spore's trees and
// not a system directory itself; at most MaxMounts, none inside another.
func TestValidateMountPath(t *testing.T) {
	for _, ok := range []string{"/data", "/home/user/data", "/mnt/x", "/workspace", "/tmp/cache", "/var/lib/app", "/opt/models", "/etc/app"} {
		if err := ValidateMountPath(ok); err != nil {
			t.Errorf("ValidateMountPath(%q): %v", ok, err)
		}
	}
	for _, bad := range []string{"", "data", "/", "/data/", "/a/../b", "/a//b", "/proc", "/proc/x", "/sys/fs", "/dev/shm", "/run", "/run/spore/volumes/0",
		"/opt/spore", "/opt/spore/bin", "/etc", "/usr", "/home", "/tmp", "/a\nb", "/" + string(make([]byte, 300))} {
		if err := ValidateMountPath(bad); !errdefs.IsInvalidArgument(err) {
			t.Errorf("ValidateMountPath(%q) = %v, want refused", bad, err)
		}
	}
	if err := ValidateMounts([]string{"/a", "/b", "/c/d", "/ab"}); err != nil {
		t.Errorf("four separate paths: %v", err)
	}
	for _, bad := range [][]string{{"/a", "/a/b"}, {"/a/b", "/a"}, {"/a", "/a"}, {"/a", "/b", "/c", "/d", "/e"}} {
		if err := ValidateMounts(bad); !errdefs.IsInvalidArgument(err) {
			t.Errorf("ValidateMounts(%q) = %v, want refused", bad, err)
		}
	}
}

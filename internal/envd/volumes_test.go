package envd

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// A path becomes a link to its slot: made with its parents, an empty
// directory gives way, a link already there is kept; bad slots and paths,
// a full directory and a file are refused.
func TestLinkVolume(t *testing.T) {
	dir := t.TempDir()
	slot := SlotPrefix + "0"
	for _, p := range []string{filepath.Join(dir, "a", "b"), filepath.Join(dir, "empty")} {
		os.MkdirAll(filepath.Join(dir, "empty"), 0o755)
		if err := linkVolume(slot, p); err != nil {
			t.Fatal(err)
		}
		if got, err := os.Readlink(p); err != nil || got != slot {
			t.Fatalf("%s -> %q %v", p, got, err)
		}
		if err := linkVolume(slot, p); err != nil {
			t.Fatalf("again: %v", err)
		}
	}
	os.MkdirAll(filepath.Join(dir, "full", "x"), 0o755)
	os.WriteFile(filepath.Join(dir, "file"), []byte("x"), 0o644)
	for _, p := range []string{filepath.Join(dir, "full"), filepath.Join(dir, "file")} {
		if err := linkVolume(slot, p); err == nil {
			t.Fatalf("%s: linked over", p)
		}
	}
	if _, err := os.Stat(filepath.Join(dir, "full", "x")); err != nil {
		t.Fatalf("a refused link changed the directory: %v", err)
	}
	for _, m := range []VolumeMount{
		{Slot: "/etc", Path: "/data2"}, {Slot: SlotPrefix + "../../etc", Path: "/data2"},
		{Slot: slot, Path: "data"}, {Slot: slot, Path: "/"}, {Slot: slot, Path: "/a/../b"},
		{Slot: slot, Path: "/run/spore/volumes/1"},
	} {
		if err := mountVolumes([]VolumeMount{m}); err == nil || !strings.Contains(err.Error(), "volume") {
			t.Errorf("%+v: %v, want refused", m, err)
		}
	}
}

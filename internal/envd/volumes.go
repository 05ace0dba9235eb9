package envd

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
)

// VolumeMount (Spore's) asks the daemon to show the volume the host put
// behind Slot (one of the sandbox's volume slots, bound from the host)
// at Path.
type VolumeMount struct {
	Slot     string `json:"slot"`
	Path     string `json:"path"`
	ReadOnly bool   `json:"readOnly,omitempty"`
}

// SlotPrefix is where the host binds the sandbox's volume slots; a
// VolumeMount's Slot is under it.
const SlotPrefix = "/run/spore/volumes/"

// mountVolumes shows each slot at its path, as a symbolic link to the
// slot (a mount needs CAP_SYS_ADMIN, which sandboxes do not get): the
// path must not exist or be an empty directory. A path that already links
// to its slot is left alone: a sandbox restored from its own snapshot
// (rollback, resume, a fork child) has its links in its file system. The
// host enforces read-only (the slot's source is a read-only view).
func mountVolumes(mounts []VolumeMount) error {
	for _, m := range mounts {
		if !strings.HasPrefix(m.Slot, SlotPrefix) || filepath.Clean(m.Slot) != m.Slot {
			return fmt.Errorf("volume slot %q is not under %s", m.Slot, SlotPrefix)
		}
		if !filepath.IsAbs(m.Path) || filepath.Clean(m.Path) != m.Path || m.Path == "/" || strings.HasPrefix(m.Path+"/", SlotPrefix) {
			return fmt.Errorf("volume mount path %q: want a clean absolute path outside %s", m.Path, SlotPrefix)
		}
	}
	for _, m := range mounts {
		if err := linkVolume(m.Slot, m.Path); err != nil {
			return err
		}
	}
	return nil
}

func linkVolume(slot, path string) error {
	if target, err := os.Readlink(path); err == nil && target == slot {
		return nil
	}
	fi, err := os.Lstat(path)
	switch {
	case err == nil && fi.IsDir():
		// An empty directory gives way (rmdir fails on a full one).
		if err := os.Remove(path); err != nil {
			return fmt.Errorf("volume mount path %s exists and is not empty", path)
		}
	case err == nil:
		return fmt.Errorf("volume mount path %s exists and is not a directory", path)
	case !errors.Is(err, os.ErrNotExist):
		return fmt.Errorf("volume mount path %s: %w", path, err)
	}
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		return fmt.Errorf("volume mount path %s: %w", path, err)
	}
	if err := os.Symlink(slot, path); err != nil {
		return fmt.Errorf("volume mount path %s: %w", path, err)
	}
	return nil
}

package snapshot

import (
	"bytes"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"

	"github.com/spore-run/spore/internal/atomicfs"
	"github.com/spore-run/spore/internal/errdefs"
)

// A snapshot staged with StageUnsynced has a marker, <dir>/.unsynced/<id>,
// from before its image is written until Sync has made it durable (outside
// the snapshot's directory, which is copied whole to the blob store). The
// marker names the boot the snapshot was staged in: a process that crashed
// loses no data it wrote (the kernel's page cache still holds it), a host
// that lost power may have lost any of it.
const unsyncedDir = ".unsynced"

// bootIDFile names the running kernel's boot; it changes at every boot.
const bootIDFile = "/proc/sys/kernel/random/boot_id"

func readBootID() []byte {
	b, err := os.ReadFile(bootIDFile)
	if err != nil {
		return nil
	}
	return bytes.TrimSpace(b)
}

func (r *Repo) marker(id string) string { return filepath.Join(r.dir, unsyncedDir, id) }

// StageUnsynced is Stage for a snapshot committed before its image reaches
// the disk: the fsyncs after a large image is written are most of a
// snapshot's time (a 1 GB image: ~330 ms, and even a small fsync then waits
// behind the kernel's writeback of the image). Commit then syncs nothing;
// the snapshot is visible and restorable at once, and Sync makes it
// durable. Should the host lose power before, the next Open discards it:
// a snapshot is whole or lost, never half. Where the boot is unknown (no
// boot ID), it is Stage: a marker could not tell a crash from a reboot.
func (r *Repo) StageUnsynced(id string) (*Staging, error) {
	st, err := r.Stage(id)
	if err != nil || len(r.boot) == 0 {
		return st, err
	}
	// Durable before anything of the image is written, hence before the
	// commit's rename can be.
	st.unsynced = true
	if err := r.markUnsynced(id); err != nil {
		st.Abort()
		return nil, fmt.Errorf("stage snapshot %s: %w", id, err)
	}
	return st, nil
}

// markUnsynced writes snapshot id's unsynced marker, durably.
// Precondition: the boot ID is known (StageUnsynced).
func (r *Repo) markUnsynced(id string) error {
	f, err := os.OpenFile(r.marker(id), os.O_CREATE|os.O_TRUNC|os.O_WRONLY, 0o600)
	if err != nil {
		return err
	}
	_, err = f.Write(append(r.boot, '\n'))
	if err == nil {
		err = f.Sync()
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return err
	}
	return atomicfs.SyncDir(filepath.Dir(r.marker(id)))
}

// treeSize is the total size of the regular files under root.
func treeSize(root string) (int64, error) {
	var size int64
	err := filepath.WalkDir(root, func(_ string, d fs.DirEntry, err error) error {
		if err != nil || !d.Type().IsRegular() {
			return err
		}
		fi, err := d.Info()
		if err != nil {
			return err
		}
		size += fi.Size()
		return nil
	})
	return size, err
}

// Sync makes a snapshot staged with StageUnsynced durable. It is a no-op for a
// snapshot that is durable already, and ErrNotFound for one that is gone
// (deleted meanwhile).
func (r *Repo) Sync(id string) error {
	r.mu.Lock()
	_, ok := r.byID[id]
	r.mu.Unlock()
	if !ok {
		return fmt.Errorf("snapshot %s: %w", id, errdefs.ErrNotFound)
	}
	err := r.syncCommitted(id)
	if errors.Is(err, fs.ErrNotExist) {
		r.mu.Lock()
		_, ok = r.byID[id]
		r.mu.Unlock()
		if !ok {
			return fmt.Errorf("snapshot %s: %w", id, errdefs.ErrNotFound)
		}
	}
	if err != nil {
		return fmt.Errorf("sync snapshot %s: %w", id, err)
	}
	return nil
}

// syncCommitted syncs a committed snapshot's tree and its commit's
// rename, then drops its marker.
func (r *Repo) syncCommitted(id string) error {
	if _, err := os.Stat(r.marker(id)); errors.Is(err, fs.ErrNotExist) {
		return nil
	}
	if _, err := atomicfs.SyncTree(filepath.Join(r.dir, id)); err != nil {
		return err
	}
	if err := atomicfs.SyncDir(r.dir); err != nil {
		return err
	}
	if err := os.Remove(r.marker(id)); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return err
	}
	return atomicfs.SyncDir(filepath.Dir(r.marker(id)))
}

// Synced says whether a committed snapshot's image is durable.
func (r *Repo) Synced(id string) bool {
	_, err := os.Stat(r.marker(id))
	return errors.Is(err, fs.ErrNotExist)
}

// recoverUnsynced decides, when the repository is opened, the fate of a
// snapshot committed unsynced whose Sync never ended: synced now when this
// is still the boot it was committed in, else lost (its image may be
// partial: a half snapshot is never served). It reports whether the
// snapshot is kept.
func (r *Repo) recoverUnsynced(id string) (bool, error) {
	b, err := os.ReadFile(r.marker(id))
	if errors.Is(err, fs.ErrNotExist) {
		return true, nil
	}
	if err == nil && len(r.boot) > 0 && bytes.Equal(bytes.TrimSpace(b), r.boot) {
		return true, r.syncCommitted(id)
	}
	return false, nil
}

// dropStaleMarkers removes the markers of snapshots that are not committed
// (a crash between a marker and its commit, or a delete), once the
// repository is loaded.
func (r *Repo) dropStaleMarkers() {
	ents, _ := os.ReadDir(filepath.Join(r.dir, unsyncedDir))
	for _, e := range ents {
		if _, ok := r.byID[e.Name()]; !ok {
			os.Remove(filepath.Join(r.dir, unsyncedDir, e.Name()))
		}
	}
}

package node

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"

	"golang.org/x/sys/unix"

	"github.com/spore-run/spore/internal/engine"
	"github.com/spore-run/spore/internal/envd"
	"github.com/spore-run/spore/internal/errdefs"
	"github.com/spore-run/spore/internal/ids"
	"github.com/spore-run/spore/internal/nodeapi"
	"github.com/spore-run/spore/internal/runtime"
	"github.com/spore-run/spore/internal/snapshot"
	"github.com/spore-run/spore/internal/volume/pool"
)

// Volumes on a node (docs/volumes.md). Every template has
// nodeapi.MaxVolumeMounts volume slots: mounts at envd.SlotPrefix+N bound,
// when unused, to a read-only empty directory. A checkpoint restores only
// with the mounts it was taken with (same destinations and options, gVisor
// checks), but a mount's source may change: a sandbox that mounts a
// volume is restored with the volume's directory behind a slot, and its
// daemon binds the slot at the volume's path.
type volumes struct {
	dir      string // <data>/volumes
	empty    string // the read-only empty directory behind unused slots; "" if it could not be made
	err      error  // why there are no slots ("" empty)
	poolSize int64
	log      *slog.Logger

	mu   sync.Mutex
	pool *pool.Pool // opened by the first volume, or at start when it exists
}

// SlotPath is the sandbox path of volume slot i.
func SlotPath(i int) string { return envd.SlotPrefix + strconv.Itoa(i) }

// openVolumes sets up the empty slot directory and the volume pool. A
// failure is not the node's: its sandboxes run, with no slots (no empty
// directory) or no volumes (no pool), and a create that mounts one is
// refused with the reason.
func openVolumes(ctx context.Context, dataDir string, poolSize int64, log *slog.Logger) *volumes {
	v := &volumes{dir: filepath.Join(dataDir, "volumes"), log: log}
	empty := filepath.Join(v.dir, "empty")
	if err := roEmpty(ctx, empty); err != nil {
		v.err = fmt.Errorf("%w: this node cannot give sandboxes volume slots: %v", errdefs.ErrUnavailable, err)
		log.Warn("no volume slots in this node's templates", "err", err)
		return v
	}
	v.empty = empty
	if poolSize <= 0 {
		var st unix.Statfs_t
		if err := unix.Statfs(dataDir, &st); err == nil {
			poolSize = int64(st.Blocks) * st.Bsize
		}
	}
	v.poolSize = max(poolSize, pool.MinPool)
	// A pool made by an earlier run opens now, its volumes mounted, so
	// its sandboxes restore (rollback, resume) after a restart.
	if pool.Made(v.dir) {
		if p, err := v.open(ctx); err == nil {
			// Snapshots' copies stay unmounted: nothing restores from them
			// in place, and a mount would write to them.
			if err := p.MountAll(ctx, func(name string) bool { return !engine.IsVolumeCopy(name) }); err != nil {
				log.Warn("mount the volumes", "err", err)
			}
		}
	}
	return v
}

// open returns the pool, made and mounted the first time.
func (v *volumes) open(ctx context.Context) (*pool.Pool, error) {
	if v.err != nil {
		return nil, v.err
	}
	v.mu.Lock()
	defer v.mu.Unlock()
	if v.pool != nil {
		return v.pool, nil
	}
	p, err := pool.Open(ctx, v.dir, v.poolSize, v.log)
	if err != nil {
		v.log.Warn("no volumes on this node", "err", err)
		return nil, fmt.Errorf("%w: this node cannot store volumes: %v", errdefs.ErrUnavailable, err)
	}
	v.pool = p
	return p, nil
}

// roEmpty mounts a read-only, empty tmpfs at dir (kept if mounted): what
// an unused slot shows. A sandbox cannot write there, so nothing it puts
// in a slot reaches another.
func roEmpty(ctx context.Context, dir string) error {
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return err
	}
	if isMount(dir) {
		return nil
	}
	return unix.Mount("spore-empty", dir, "tmpfs", unix.MS_RDONLY|unix.MS_NOSUID|unix.MS_NODEV|unix.MS_NOEXEC, "size=4k,mode=0555")
}

func isMount(dir string) bool {
	var a, b unix.Stat_t
	if unix.Stat(dir, &a) != nil || unix.Stat(filepath.Dir(dir), &b) != nil {
		return false
	}
	return a.Dev != b.Dev
}

func (v *volumes) close() error {
	var errs []error
	v.mu.Lock()
	if v.pool != nil {
		errs = append(errs, v.pool.Close())
	}
	v.mu.Unlock()
	if v.empty != "" && isMount(v.empty) {
		// Detached even if an instance still holds it (a restore target
		// the runtime has yet to purge): it is empty and read-only, and
		// goes with the last holder.
		if err := unix.Unmount(v.empty, unix.MNT_DETACH); err != nil {
			errs = append(errs, fmt.Errorf("unmount %s: %w", v.empty, err))
		}
	}
	return errors.Join(errs...)
}

// slots are the templates' volume slot mounts (none when the node has no
// empty directory to put behind them).
func (v *volumes) slots() []runtime.Mount {
	if v.empty == "" {
		return nil
	}
	out := make([]runtime.Mount, nodeapi.MaxVolumeMounts)
	for i := range out {
		out[i] = runtime.Mount{Source: v.empty, Destination: SlotPath(i)}
	}
	return out
}

// localize points a fetched manifest's slots at this node's directories:
// the empty one, or the volume's mount (or read-only view) here.
func (v *volumes) localize(m *snapshot.Manifest) {
	for i, mt := range m.Run.Mounts {
		if !strings.HasPrefix(mt.Destination, envd.SlotPrefix) {
			continue
		}
		if filepath.Base(filepath.Dir(mt.Source)) == "mounts" {
			// The volume's mount (or read-only view) on this node.
			m.Run.Mounts[i].Source = filepath.Join(v.dir, "mounts", filepath.Base(mt.Source))
		} else {
			m.Run.Mounts[i].Source = v.empty
		}
	}
}

// The engine keeps exclusive volumes' content with snapshots in the pool
// (engine.VolumeImages).

// Capture implements engine.VolumeImages.
func (v *volumes) Capture(ctx context.Context, image, copy string) error {
	p, err := v.open(ctx)
	if err != nil {
		return err
	}
	return p.Capture(ctx, image, copy)
}

// Flush implements engine.VolumeImages.
func (v *volumes) Flush(ctx context.Context, image string) error {
	p, err := v.open(ctx)
	if err != nil {
		return err
	}
	return p.Flush(ctx, image)
}

// Clone implements engine.VolumeImages.
func (v *volumes) Clone(ctx context.Context, src, dst string) (string, error) {
	p, err := v.open(ctx)
	if err != nil {
		return "", err
	}
	if err := p.Copy(ctx, src, dst); err != nil {
		return "", err
	}
	return p.Mount(ctx, dst, false)
}

// Remove implements engine.VolumeImages.
func (v *volumes) Remove(ctx context.Context, image string) error {
	if !v.made() {
		return nil
	}
	p, err := v.open(ctx)
	if err != nil {
		return err
	}
	return p.Remove(ctx, image)
}

// Settle implements engine.VolumeImages.
func (v *volumes) Settle(ctx context.Context, image, volume string) error {
	p, err := v.open(ctx)
	if err != nil {
		return err
	}
	return p.Rename(ctx, image, volume)
}

// Images implements engine.VolumeImages.
func (v *volumes) Images(ctx context.Context) ([]string, error) {
	if !v.made() {
		return nil, nil
	}
	p, err := v.open(ctx)
	if err != nil {
		return nil, err
	}
	return p.Images()
}

// made reports whether this node has a volume pool (made by a volume).
func (v *volumes) made() bool {
	return v.err == nil && pool.Made(v.dir)
}

// imageOf is the image that holds a volume's content here now: the one
// the sandbox that rolled it back runs with (its holder; a reader made
// before keeps the image it was given), else the volume's own.
func (n *Node) imageOf(ctx context.Context, volumeID string) string {
	for _, sb := range n.Engine.List(ctx) {
		for _, m := range sb.Run.Volumes {
			if m.Volume == volumeID && m.Image != "" && m.Captured() {
				return m.Image
			}
		}
	}
	return volumeID
}

// PrepareVolumes makes (the first time) and mounts each volume here, and
// returns what the engine puts behind the slots: volume i in slot i.
func (n *Node) PrepareVolumes(ctx context.Context, mounts []nodeapi.VolumeMount) ([]engine.Volume, error) {
	v := n.vols
	p, err := v.open(ctx)
	if err != nil {
		return nil, err
	}
	if len(mounts) > nodeapi.MaxVolumeMounts {
		return nil, errdefs.Invalidf("%d volume mounts: at most %d", len(mounts), nodeapi.MaxVolumeMounts)
	}
	out := make([]engine.Volume, 0, len(mounts))
	for i, m := range mounts {
		if err := ids.Validate("volume ID", m.VolumeID); err != nil {
			return nil, err
		}
		img := n.imageOf(ctx, m.VolumeID)
		if !p.Exists(img) {
			if err := makeImage(ctx, p, img, m.SizeBytes); err != nil {
				return nil, err
			}
		}
		var src string
		if m.ReadOnly {
			src, err = p.View(ctx, img)
		} else {
			src, err = p.Mount(ctx, img, false)
		}
		if err != nil {
			return nil, err
		}
		vm := snapshot.VolumeMount{Volume: m.VolumeID, Slot: SlotPath(i), Path: m.Path, ReadOnly: m.ReadOnly, Exclusive: m.Exclusive}
		if img != m.VolumeID {
			vm.Image = img
		}
		out = append(out, engine.Volume{Source: src, VolumeMount: vm})
	}
	return out, nil
}

// makeImage makes a volume's image: its root open to every user of the
// sandbox (the sandbox decides who writes where inside).
func makeImage(ctx context.Context, p *pool.Pool, id string, size int64) error {
	if err := p.Create(ctx, id, size, 0, 0); err != nil && !errdefs.IsAlreadyExists(err) {
		return err
	}
	mp, err := p.Mount(ctx, id, false)
	if err != nil {
		return err
	}
	// mkfs's lost+found is no file of the user's (fsck makes it again
	// when it needs it).
	if err := os.Remove(filepath.Join(mp, "lost+found")); err != nil && !os.IsNotExist(err) {
		return err
	}
	return os.Chmod(mp, 0o1777)
}

// DeleteVolume removes a volume's image (and its mounts) from the node.
// A volume a sandbox here shows (running, paused or hibernated) is
// ErrConflict; an unknown one is not an error.
func (n *Node) DeleteVolume(ctx context.Context, volumeID string) error {
	for _, sb := range n.Engine.List(ctx) {
		for _, m := range sb.Run.Volumes {
			if m.Volume == volumeID {
				return errdefs.Conflictf("volume %s is shown by sandbox %s on this node", volumeID, sb.ID)
			}
		}
	}
	v := n.vols
	if v.err != nil {
		return nil // no pool: nothing stored
	}
	if _, err := os.Stat(filepath.Join(v.dir, "pool.img")); err != nil {
		return nil // no pool made yet
	}
	p, err := v.open(ctx)
	if err != nil {
		return err
	}
	return p.Remove(ctx, volumeID)
}

// VolumeUsage is a volume's bytes in use and its capacity, as the file
// system of its image counts them (the image is mounted for it when it
// is not). ErrNotFound when the node holds no image of the volume.
func (n *Node) VolumeUsage(ctx context.Context, volumeID string) (nodeapi.VolumeUsage, error) {
	if err := ids.Validate("volume ID", volumeID); err != nil {
		return nodeapi.VolumeUsage{}, err
	}
	if n.vols.err != nil {
		return nodeapi.VolumeUsage{}, errdefs.NotFoundf("volume %s: this node stores no volumes", volumeID)
	}
	if _, err := os.Stat(filepath.Join(n.vols.dir, "pool.img")); err != nil {
		return nodeapi.VolumeUsage{}, errdefs.NotFoundf("volume %s is not on this node", volumeID)
	}
	p, err := n.vols.open(ctx)
	if err != nil {
		return nodeapi.VolumeUsage{}, err
	}
	img := n.imageOf(ctx, volumeID)
	if !p.Exists(img) {
		return nodeapi.VolumeUsage{}, errdefs.NotFoundf("volume %s is not on this node", volumeID)
	}
	if _, err := p.Mount(ctx, img, false); err != nil {
		return nodeapi.VolumeUsage{}, err
	}
	used, capacity, err := p.Usage(img)
	if err != nil {
		return nodeapi.VolumeUsage{}, err
	}
	return nodeapi.VolumeUsage{UsedBytes: used, CapacityBytes: capacity}, nil
}

// VolumeRoot opens a volume's directory on this node (its image made and
// mounted the first time), for the volume content API.
func (n *Node) VolumeRoot(ctx context.Context, volumeID string, size int64) (*os.Root, error) {
	if err := ids.Validate("volume ID", volumeID); err != nil {
		return nil, err
	}
	p, err := n.vols.open(ctx)
	if err != nil {
		return nil, err
	}
	img := n.imageOf(ctx, volumeID)
	if !p.Exists(img) {
		if err := makeImage(ctx, p, img, size); err != nil {
			return nil, err
		}
	}
	mp, err := p.Mount(ctx, img, false)
	if err != nil {
		return nil, err
	}
	return os.OpenRoot(mp)
}

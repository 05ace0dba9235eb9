// Package snapshot is Spore's snapshot repository on local disk.
//
// A snapshot is a checkpoint image (processes, memory, root overlay) plus a
// manifest. It is built in a staging directory and committed by one rename,
// so a crash at any point leaves either a whole snapshot or none: the
// staging area is emptied when the repository is opened. A snapshot
// outlives the sandbox it came from and is deleted only explicitly.
//
// Layout:
//
//	<dir>/<id>/manifest.json   committed snapshots
//	<dir>/<id>/image/          the checkpoint image
//	<dir>/.staging/<id>/       snapshots being written
//	<dir>/.trash/              snapshots being deleted
//	<dir>/.unsynced/<id>       snapshots staged or committed before their
//	                           image was synced (see StageUnsynced)
package snapshot

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strings"
	"sync"
	"time"

	"github.com/spore-run/spore/internal/atomicfs"
	"github.com/spore-run/spore/internal/errdefs"
	"github.com/spore-run/spore/internal/ids"
	"github.com/spore-run/spore/internal/runtime"
)

// Kind says what a snapshot is for.
type Kind string

const (
	KindSnapshot    Kind = "snapshot"    // taken by a user
	KindTemplate    Kind = "template"    // a built template; creating a sandbox restores it
	KindHibernation Kind = "hibernation" // a hibernated sandbox's state, removed when it resumes
)

// RunConfig is what a restore needs besides the image: the resources and
// process defaults the sandbox ran with.
type RunConfig struct {
	Args     []string       `json:"args"`
	Env      []string       `json:"env,omitempty"`
	Cwd      string         `json:"cwd,omitempty"`
	User     runtime.User   `json:"user"`
	Hostname string         `json:"hostname,omitempty"`
	Limits   runtime.Limits `json:"limits"`
	// Mounts are host directories bound into the sandbox (the in-sandbox
	// daemon); a restore needs the same ones.
	Mounts []runtime.Mount `json:"mounts,omitempty"`
	// Volumes are the volumes behind the sandbox's volume slots (each
	// slot's host directory is its mount's Source): a snapshot records
	// the mounts, and whatever restores it mounts the same volumes
	// (docs/volumes.md).
	Volumes []VolumeMount `json:"volumes,omitempty"`
	// MemoryAlertSignal is sent to the init when memory rises
	// (runtime.Spec.MemoryAlertSignal); absent in images whose init may not
	// handle it.
	MemoryAlertSignal string `json:"memory_alert_signal,omitempty"`
	// AccessToken is the in-sandbox daemon's access token held in the
	// image's memory: whoever restores the image needs it to re-initialise
	// the daemon with a new one.
	AccessToken string `json:"access_token,omitempty"`
}

// VolumeMount is a volume shown in the sandbox: the host directory
// bound at Slot (one of the template's mounts) is seen at Path.
type VolumeMount struct {
	Volume   string `json:"volume"` // the volume's ID
	Slot     string `json:"slot"`
	Path     string `json:"path"`
	ReadOnly bool   `json:"read_only,omitempty"`
	// Exclusive: the volume's content is captured with every snapshot
	// (when mounted read-write), and restored with it (docs/volumes.md).
	Exclusive bool `json:"exclusive,omitempty"`
	// Image is the node's volume image behind the slot when it is not the
	// one named Volume (a rollback gives the sandbox a new image of the
	// volume, made from the snapshot's copy).
	Image string `json:"image,omitempty"`
	// Copy, in a snapshot's manifest, is the volume image that holds the
	// volume's content at the snapshot's instant.
	Copy string `json:"copy,omitempty"`
}

// ImageName is the node's volume image behind the slot.
func (v VolumeMount) ImageName() string {
	if v.Image != "" {
		return v.Image
	}
	return v.Volume
}

// Captured reports whether the volume's content is captured with
// snapshots: an exclusive volume mounted read-write.
func (v VolumeMount) Captured() bool { return v.Exclusive && !v.ReadOnly }

// Manifest describes a committed snapshot.
type Manifest struct {
	ID       string   `json:"id"`
	Names    []string `json:"names,omitempty"`
	Kind     Kind     `json:"kind"`
	Parent   string   `json:"parent,omitempty"`   // snapshot the origin sandbox was restored from
	Origin   string   `json:"origin,omitempty"`   // sandbox the snapshot was taken of
	Template string   `json:"template,omitempty"` // template the lineage started from
	RootFS   string   `json:"rootfs"`             // name of the lower root filesystem
	RootFSID string   `json:"rootfs_id"`          // build identity of that root filesystem
	Runtime  string   `json:"runtime"`            // runtime (and version) that wrote the image
	// RuntimeBuild is the build of the runtime that wrote the image (its
	// content's identity, see runtime.Builds): a restore runs with it.
	// Empty in images from before builds were kept, and from runtimes
	// without builds: those restore with the runtime's current build, if
	// it is Runtime.
	RuntimeBuild string    `json:"runtime_build,omitempty"`
	CreatedAt    time.Time `json:"created_at"`
	SizeBytes    int64     `json:"size_bytes"`
	Run          RunConfig `json:"run"`
	// Copy: fetched from the blob store, not taken on this node.
	Copy bool `json:"copy,omitempty"`
}

// Repo is a snapshot repository in one directory. One process owns a
// repository at a time (the engine holds a lock on its data directory).
type Repo struct {
	dir string

	boot []byte // this boot's ID (see StageUnsynced)

	mu    sync.Mutex
	byID  map[string]Manifest
	names map[string]string // name -> ID
	// lost are the snapshots Open discarded: committed unsynced before the
	// host rebooted (see StageUnsynced).
	lost []string
}

const (
	stagingDir   = ".staging"
	trashDir     = ".trash"
	manifestFile = "manifest.json"
	imageDir     = "image"
)

// Open opens (creating if needed) the repository in dir, discarding every
// snapshot left half-written or half-deleted by a crash.
func Open(dir string) (*Repo, error) {
	if !filepath.IsAbs(dir) {
		return nil, errdefs.Invalidf("snapshot repository %q must be an absolute path", dir)
	}
	for _, d := range []string{dir, filepath.Join(dir, stagingDir), filepath.Join(dir, trashDir), filepath.Join(dir, unsyncedDir)} {
		if err := os.MkdirAll(d, 0o700); err != nil {
			return nil, fmt.Errorf("snapshot repository: %w", err)
		}
	}
	for _, d := range []string{stagingDir, trashDir} {
		if err := emptyDir(filepath.Join(dir, d)); err != nil {
			return nil, fmt.Errorf("snapshot repository: clear %s: %w", d, err)
		}
	}
	r := &Repo{dir: dir, boot: readBootID(), byID: map[string]Manifest{}, names: map[string]string{}}
	if err := r.load(); err != nil {
		return nil, err
	}
	return r, nil
}

func emptyDir(dir string) error {
	ents, err := os.ReadDir(dir)
	if err != nil {
		return err
	}
	for _, e := range ents {
		if err := os.RemoveAll(filepath.Join(dir, e.Name())); err != nil {
			return err
		}
	}
	return nil
}

func (r *Repo) load() error {
	ents, err := os.ReadDir(r.dir)
	if err != nil {
		return fmt.Errorf("snapshot repository: %w", err)
	}
	var all []Manifest
	for _, e := range ents {
		if !e.IsDir() || strings.HasPrefix(e.Name(), ".") {
			continue
		}
		var m Manifest
		err := atomicfs.ReadJSON(filepath.Join(r.dir, e.Name(), manifestFile), &m)
		if err != nil || m.ID != e.Name() || ids.Validate("snapshot ID", m.ID) != nil {
			// Not something Commit wrote: a committed directory always
			// holds its manifest. Move it aside rather than guess.
			if errors.Is(err, fs.ErrNotExist) || err == nil {
				_ = os.Rename(filepath.Join(r.dir, e.Name()), filepath.Join(r.dir, trashDir, e.Name()))
			}
			continue
		}
		keep, err := r.recoverUnsynced(m.ID)
		if err != nil {
			return fmt.Errorf("snapshot repository: snapshot %s: sync: %w", m.ID, err)
		}
		if !keep {
			_ = os.Rename(filepath.Join(r.dir, e.Name()), filepath.Join(r.dir, trashDir, e.Name()))
			r.lost = append(r.lost, m.ID)
			continue
		}
		all = append(all, m)
	}
	// A name belongs to its newest holder (a crash while moving a name can
	// leave it on two snapshots for a moment).
	sort.Slice(all, func(i, j int) bool { return all[i].CreatedAt.Before(all[j].CreatedAt) })
	for _, m := range all {
		r.byID[m.ID] = m
		for _, n := range m.Names {
			r.names[n] = m.ID
		}
	}
	r.dropStaleMarkers()
	_ = emptyDir(filepath.Join(r.dir, trashDir))
	return nil
}

// Lost lists the snapshots Open discarded because the host lost power
// before they were synced (see StageUnsynced).
func (r *Repo) Lost() []string {
	r.mu.Lock()
	defer r.mu.Unlock()
	return slices.Clone(r.lost)
}

// Dir returns the repository's directory.
func (r *Repo) Dir() string { return r.dir }

// Staging is a snapshot being written.
type Staging struct {
	repo     *Repo
	id       string
	done     bool
	unsynced bool // see StageUnsynced
}

// Stage starts a new snapshot with the given ID; the caller writes the
// checkpoint image into ImageDir and then calls Commit or Abort.
func (r *Repo) Stage(id string) (*Staging, error) {
	if err := ids.Validate("snapshot ID", id); err != nil {
		return nil, err
	}
	r.mu.Lock()
	_, taken := r.byID[id]
	r.mu.Unlock()
	if taken {
		return nil, fmt.Errorf("snapshot %s: %w", id, errdefs.ErrAlreadyExists)
	}
	dir := filepath.Join(r.dir, stagingDir, id)
	if err := os.Mkdir(dir, 0o700); err != nil {
		if errors.Is(err, fs.ErrExist) {
			return nil, fmt.Errorf("snapshot %s: %w (being written)", id, errdefs.ErrAlreadyExists)
		}
		return nil, fmt.Errorf("stage snapshot %s: %w", id, err)
	}
	if err := os.Mkdir(filepath.Join(dir, imageDir), 0o700); err != nil {
		os.RemoveAll(dir)
		return nil, fmt.Errorf("stage snapshot %s: %w", id, err)
	}
	return &Staging{repo: r, id: id}, nil
}

// ID returns the staged snapshot's ID.
func (s *Staging) ID() string { return s.id }

// ImageDir is where the checkpoint image goes.
func (s *Staging) ImageDir() string {
	return filepath.Join(s.repo.dir, stagingDir, s.id, imageDir)
}

// Abort discards the staged snapshot. It is safe after Commit (a no-op).
func (s *Staging) Abort() {
	if s.done {
		return
	}
	s.done = true
	os.RemoveAll(filepath.Join(s.repo.dir, stagingDir, s.id))
	if s.unsynced {
		os.Remove(s.repo.marker(s.id))
	}
}

// CommitOptions tune Commit.
type CommitOptions struct {
	// MoveNames takes the manifest's names from the snapshots holding them
	// (a rebuilt template takes over its name); otherwise a taken name is
	// an error.
	MoveNames bool
}

// Commit makes the staged snapshot durable (unless staged with
// StageUnsynced) and visible. m.ID, the size and (when zero) the creation
// time are filled in.
func (s *Staging) Commit(m Manifest, opts CommitOptions) (Manifest, error) {
	r := s.repo
	if s.done {
		return Manifest{}, fmt.Errorf("snapshot %s: %w: already committed or aborted", s.id, errdefs.ErrConflict)
	}
	for _, n := range m.Names {
		if err := ids.ValidateName("snapshot name", n); err != nil {
			return Manifest{}, err
		}
	}
	m.ID = s.id
	if m.CreatedAt.IsZero() {
		m.CreatedAt = time.Now().UTC()
	}
	staged := filepath.Join(r.dir, stagingDir, s.id)
	var size int64
	var err error
	writeManifest := atomicfs.WriteJSON
	if s.unsynced {
		size, err = treeSize(filepath.Join(staged, imageDir))
		writeManifest = atomicfs.WriteJSONNoSync
	} else {
		size, err = atomicfs.SyncTree(staged)
	}
	if err != nil {
		return Manifest{}, fmt.Errorf("commit snapshot %s: sync image: %w", s.id, err)
	}
	m.SizeBytes = size

	r.mu.Lock()
	defer r.mu.Unlock()
	var losers []string
	for _, n := range m.Names {
		if holder, ok := r.names[n]; ok {
			if !opts.MoveNames {
				return Manifest{}, fmt.Errorf("snapshot name %q: %w (held by %s)", n, errdefs.ErrAlreadyExists, holder)
			}
			losers = append(losers, holder)
		}
	}
	if err := writeManifest(filepath.Join(staged, manifestFile), m); err != nil {
		return Manifest{}, fmt.Errorf("commit snapshot %s: %w", s.id, err)
	}
	// The commit point.
	if err := os.Rename(staged, filepath.Join(r.dir, s.id)); err != nil {
		return Manifest{}, fmt.Errorf("commit snapshot %s: %w", s.id, err)
	}
	s.done = true
	// Unsynced, not a single fsync: after a large image is written one
	// waits behind the kernel's writeback of it (tens of ms). Sync does it.
	if !s.unsynced {
		if err := atomicfs.SyncDir(r.dir); err != nil {
			return Manifest{}, fmt.Errorf("commit snapshot %s: %w", s.id, err)
		}
	}
	r.byID[m.ID] = m
	for _, n := range m.Names {
		r.names[n] = m.ID
	}
	for _, id := range losers {
		old := r.byID[id]
		old.Names = slices.DeleteFunc(slices.Clone(old.Names), func(n string) bool { return slices.Contains(m.Names, n) })
		if err := atomicfs.WriteJSON(filepath.Join(r.dir, id, manifestFile), old); err != nil {
			// The new snapshot holds the name already (newest wins on load).
			continue
		}
		r.byID[id] = old
	}
	return m, nil
}

// Get returns the snapshot whose ID or name is ref.
func (r *Repo) Get(ref string) (Manifest, error) {
	if ids.Validate("snapshot ID", ref) != nil && ids.ValidateName("snapshot name", ref) != nil {
		return Manifest{}, errdefs.Invalidf("snapshot reference %q is neither an ID nor a name", ref)
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	if m, ok := r.byID[ref]; ok {
		return m, nil
	}
	if id, ok := r.names[ref]; ok {
		return r.byID[id], nil
	}
	return Manifest{}, fmt.Errorf("snapshot %s: %w", ref, errdefs.ErrNotFound)
}

// ImageDir returns the image directory of a committed snapshot.
func (r *Repo) ImageDir(id string) string {
	return filepath.Join(r.dir, id, imageDir)
}

// List returns every committed snapshot, oldest first.
func (r *Repo) List() []Manifest {
	r.mu.Lock()
	defer r.mu.Unlock()
	out := make([]Manifest, 0, len(r.byID))
	for _, m := range r.byID {
		out = append(out, m)
	}
	sort.Slice(out, func(i, j int) bool {
		if !out[i].CreatedAt.Equal(out[j].CreatedAt) {
			return out[i].CreatedAt.Before(out[j].CreatedAt)
		}
		return out[i].ID < out[j].ID
	})
	return out
}

// Delete removes a committed snapshot: it disappears at once (one rename)
// and its files are removed after.
func (r *Repo) Delete(id string) error {
	if err := ids.Validate("snapshot ID", id); err != nil {
		return err
	}
	r.mu.Lock()
	m, ok := r.byID[id]
	if !ok {
		r.mu.Unlock()
		return fmt.Errorf("snapshot %s: %w", id, errdefs.ErrNotFound)
	}
	trash := filepath.Join(r.dir, trashDir, id+"-"+ids.New('d'))
	if err := os.Rename(filepath.Join(r.dir, id), trash); err != nil {
		r.mu.Unlock()
		return fmt.Errorf("delete snapshot %s: %w", id, err)
	}
	_ = atomicfs.SyncDir(r.dir)
	os.Remove(r.marker(id))
	delete(r.byID, id)
	for _, n := range m.Names {
		if r.names[n] == id {
			delete(r.names, n)
		}
	}
	r.mu.Unlock()
	if err := os.RemoveAll(trash); err != nil {
		return fmt.Errorf("delete snapshot %s: remove files: %w", id, err)
	}
	return nil
}

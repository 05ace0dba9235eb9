package node

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"os"
	"strconv"
	"strings"

	"github.com/spore-run/spore/internal/chunk"
	"github.com/spore-run/spore/internal/errdefs"
	"github.com/spore-run/spore/internal/rootfs"
	"github.com/spore-run/spore/internal/snapsync"
)

// metaStamp holds a published root filesystem's stamp (JSON) in its chunk
// manifest's metadata.
const metaStamp = "spore.rootfs.stamp"

// rootfsManifestID names the blob store's pointer to the fleet's build of
// root filesystem name: an empty tree whose metadata holds the build's
// stamp and which refers to the build's own copy (snapsync's held
// "tree-<build>" manifest), so the store keeps that copy while the
// pointer names it.
func rootfsManifestID(name string) string { return "rootfs-" + name }

// sameSpec reports whether two stamps were built from the same
// specification (the build IDs aside).
func sameSpec(a, b rootfs.Stamp) bool { return specKey(a) == specKey(b) }

func specKey(s rootfs.Stamp) string {
	h := sha256.New()
	fmt.Fprintf(h, "%s\x00%s\x00%s\x00%s\x00%d\x00%s", s.Suite, s.Variant, strings.Join(s.Packages, ","), s.Extra, s.Revision, s.Image)
	return hex.EncodeToString(h.Sum(nil))
}

// ShareRootFS makes the node's root filesystem name the one the fleet
// shares through the blob store, so that a template built on any node
// restores on every other without a copy of its tree (a checkpoint
// restores only over the very tree it was taken over; a snapshot of
// another build fetches that build's tree, see versions.go). The first
// node to start publishes its build; a node that built its own from the
// same specification takes the published one instead (its own is kept
// while its snapshots and sandboxes need it); a node whose build is of a
// newer specification (an upgrade: a package added, a tree revision)
// publishes its own in place of the older one, and a node of an older
// specification keeps its own. Templates built over a replaced tree are
// rebuilt by EnsureTemplates. Concurrent first starts may each publish;
// the last pointer wins, and the others adopt it at their next start.
func (n *Node) ShareRootFS(ctx context.Context, name string) (adopted bool, err error) {
	if n.Sync == nil {
		return false, nil
	}
	release := n.versions.Hold() // what it publishes or fetches stays until committed
	defer release()
	local, err := rootfs.Lookup(n.rootfsDir, name)
	if err != nil {
		return false, err
	}
	store := n.Sync.Store()
	id := rootfsManifestID(name)
	cm, err := chunk.ReadManifest(ctx, store, id)
	if errdefs.IsNotFound(err) {
		return false, n.publishRootFS(ctx, name, local)
	}
	if err != nil {
		return false, fmt.Errorf("root filesystem %s in the blob store: %w", name, err)
	}
	var pub rootfs.Stamp
	if err := json.Unmarshal([]byte(cm.Metadata[metaStamp]), &pub); err != nil || pub.ID == "" {
		return false, fmt.Errorf("%w: the blob store's root filesystem %s has no stamp", errdefs.ErrDataLoss, id)
	}
	switch {
	case pub.ID == local.ID:
		return false, nil
	case !sameSpec(pub, local) && local.Built.After(pub.Built):
		n.log.Info("publishing this node's root filesystem in place of the fleet's older one", "rootfs", name, "build", local.ID, "fleet_build", pub.ID)
		return false, n.publishRootFS(ctx, name, local)
	case !sameSpec(pub, local):
		n.log.Warn("keeping this node's root filesystem: the fleet's is of a newer specification (upgrade this node)",
			"rootfs", name, "build", local.ID, "fleet_build", pub.ID)
		return false, nil
	}
	if err := n.Sync.InstallDep(ctx, snapsync.Dep{Kind: snapsync.DepTree, ID: pub.ID}); err != nil {
		return false, fmt.Errorf("fetch the fleet's root filesystem %s: %w", name, err)
	}
	// The fetched build becomes the name's; this node's own is kept while
	// its snapshots and sandboxes need it (PruneVersions).
	if err := rootfs.Promote(ctx, n.rootfsDir, name, pub.ID); err != nil {
		return false, err
	}
	n.log.Info("root filesystem taken from the fleet", "rootfs", name, "was", local.ID, "build", pub.ID)
	return true, nil
}

// publishRootFS makes this node's build of name the fleet's: its copy (a
// held manifest, published first) and the pointer naming it.
func (n *Node) publishRootFS(ctx context.Context, name string, local rootfs.Stamp) error {
	dep := snapsync.Dep{Kind: snapsync.DepTree, ID: local.ID}
	stamp, err := json.Marshal(local)
	if err != nil {
		return err
	}
	empty, err := os.MkdirTemp("", "spore-rootfs-pointer-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(empty)
	_, _, err = chunk.Pack(ctx, empty, n.Sync.Store(), chunk.PackOptions{ID: rootfsManifestID(name), Log: n.log,
		Metadata: map[string]string{metaStamp: string(stamp)}, Refs: []string{dep.ManifestID()},
		EnsureRefs: func(ctx context.Context) error { return n.Sync.PublishDeps(ctx, []snapsync.Dep{dep}) }})
	if err != nil {
		return fmt.Errorf("publish root filesystem %s: %w", name, err)
	}
	// The pointers older Spore builds published, one per tree revision,
	// would keep their trees in the store for ever.
	for r := 1; r <= local.Revision; r++ {
		_ = chunk.DeleteManifest(ctx, n.Sync.Store(), "rootfs-"+name+"-r"+strconv.Itoa(r))
	}
	n.log.Info("root filesystem published", "rootfs", name, "build", local.ID)
	return nil
}

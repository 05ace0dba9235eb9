package node

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strconv"

	"github.com/spore-run/spore/internal/atomicfs"
	"github.com/spore-run/spore/internal/chunk"
	"github.com/spore-run/spore/internal/errdefs"
	"github.com/spore-run/spore/internal/rootfs"
)

// metaStamp holds a published root filesystem's stamp (JSON) in its chunk
// manifest's metadata.
const metaStamp = "spore.rootfs.stamp"

// rootfsManifestID names the blob store's copy of a root filesystem of
// one revision.
func rootfsManifestID(name string, revision int) string {
	return "rootfs-" + name + "-r" + strconv.Itoa(revision)
}

// ShareRootFS makes the node's root filesystem name the one the fleet
// shares through the blob store, so that a snapshot taken on any node
// restores here (a checkpoint restores only over the very root filesystem
// it was taken over: the build ID in its manifest must match). The first
// node to start publishes its build (chunked, deduplicated); a node that
// built its own later takes the published one instead, unless sandboxes
// or snapshots here already depend on its own (then it keeps it, and
// snapshots of the others' build are refused here with a clear error).
// Templates built over the replaced one are rebuilt by EnsureTemplates.
// Concurrent first starts may each publish; the last manifest wins, and
// the others adopt it at their next start.
func (n *Node) ShareRootFS(ctx context.Context, name string) (adopted bool, err error) {
	if n.Sync == nil {
		return false, nil
	}
	dir := n.rootfsDir
	local, err := rootfs.Lookup(dir, name)
	if err != nil {
		return false, err
	}
	store := n.Sync.Store()
	id := rootfsManifestID(name, local.Revision)
	cm, err := chunk.ReadManifest(ctx, store, id)
	if errdefs.IsNotFound(err) {
		stamp, _ := json.Marshal(local)
		_, st, perr := chunk.Pack(ctx, rootfs.Path(dir, name), store, chunk.PackOptions{ID: id, Metadata: map[string]string{metaStamp: string(stamp)}, Log: n.log})
		if perr != nil {
			return false, fmt.Errorf("publish root filesystem %s: %w", name, perr)
		}
		n.log.Info("root filesystem published", "rootfs", name, "build", local.ID, "bytes", st.TotalBytes, "stored", st.StoredBytes)
		cm, err = chunk.ReadManifest(ctx, store, id)
	}
	if err != nil {
		return false, fmt.Errorf("root filesystem %s in the blob store: %w", name, err)
	}
	var pub rootfs.Stamp
	if err := json.Unmarshal([]byte(cm.Metadata[metaStamp]), &pub); err != nil || pub.ID == "" {
		return false, fmt.Errorf("%w: the blob store's root filesystem %s has no stamp", errdefs.ErrDataLoss, id)
	}
	if pub.ID == local.ID {
		return false, nil
	}
	if users := n.rootfsUsers(local.ID); users > 0 {
		n.log.Warn("keeping this node's own root filesystem: sandboxes or snapshots here use it; snapshots of the fleet's build will be refused here",
			"rootfs", name, "build", local.ID, "fleet_build", pub.ID, "users", users)
		return false, nil
	}
	fetched := filepath.Join(dir, "."+name+".fetch")
	os.RemoveAll(fetched)
	src := &chunk.Tiered{Cache: n.Sync.Cache(), Store: store, Log: n.log}
	if _, err := chunk.Unpack(ctx, cm, fetched, src, chunk.UnpackOptions{}); err != nil {
		return false, fmt.Errorf("fetch the fleet's root filesystem %s: %w", name, err)
	}
	// The tree's top directory is not in the manifest (Unpack makes it
	// 0700): give it the mode of the one it replaces (0755), or nobody but
	// root could reach anything in the sandboxes.
	if fi, err := os.Stat(rootfs.Path(dir, name)); err == nil {
		if err := os.Chmod(fetched, fi.Mode().Perm()); err != nil {
			os.RemoveAll(fetched)
			return false, err
		}
	}
	// Swap: the old tree aside, the fetched one in, then its stamp (the
	// commit point for Lookup), then the old tree goes.
	old := filepath.Join(dir, "."+name+".old-"+local.ID)
	if err := os.Rename(rootfs.Path(dir, name), old); err != nil {
		os.RemoveAll(fetched)
		return false, err
	}
	if err := os.Rename(fetched, rootfs.Path(dir, name)); err != nil {
		os.Rename(old, rootfs.Path(dir, name))
		return false, err
	}
	if err := atomicfs.WriteJSON(filepath.Join(dir, name+".json"), pub); err != nil {
		return false, err
	}
	os.RemoveAll(old)
	n.log.Info("root filesystem taken from the fleet", "rootfs", name, "was", local.ID, "build", pub.ID)
	return true, nil
}

// rootfsUsers counts what on this node may depend on root filesystem
// build id: every sandbox (running or hibernated), and the snapshots
// other than templates taken over it.
func (n *Node) rootfsUsers(id string) int {
	users := len(n.Engine.List(context.Background()))
	for _, m := range n.Engine.Snapshots().List() {
		if m.RootFSID == id && m.Kind != "template" {
			users++
		}
	}
	return users
}

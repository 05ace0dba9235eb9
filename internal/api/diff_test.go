package api_test

import (
	"context"
	"encoding/json"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/spore-run/spore/internal/api"
	"github.com/spore-run/spore/internal/control"
	"github.com/spore-run/spore/internal/control/controltest"
	"github.com/spore-run/spore/internal/nodeapi"
)

// treeNode is the fast node with files: each sandbox's filesystem is the
// one given for the snapshot it was created from (the fake runtime has
// none of its own).
type treeNode struct {
	nodeapi.Node
	mu    sync.Mutex
	trees map[string][]nodeapi.FileEntry // by snapshot ID
	files map[string]map[string]string   // by snapshot ID, path
	reads int
}

func (n *treeNode) snapshotOf(ctx context.Context, id string) (string, error) {
	sb, err := n.Get(ctx, id)
	return sb.Parent, err
}

func (n *treeNode) FileTree(ctx context.Context, id string) ([]nodeapi.FileEntry, error) {
	snap, err := n.snapshotOf(ctx, id)
	if err != nil {
		return nil, err
	}
	n.mu.Lock()
	defer n.mu.Unlock()
	return n.trees[snap], nil
}

func (n *treeNode) ReadFiles(ctx context.Context, id string, paths []string) ([]nodeapi.FileData, error) {
	snap, err := n.snapshotOf(ctx, id)
	if err != nil {
		return nil, err
	}
	n.mu.Lock()
	defer n.mu.Unlock()
	n.reads++
	out := make([]nodeapi.FileData, len(paths))
	for i, p := range paths {
		c, ok := n.files[snap][p]
		out[i] = nodeapi.FileData{Path: p, Size: int64(len(c)), Data: []byte(c), Missing: !ok}
	}
	return out, nil
}

// GET /snapshots/{a}/diff/{b}: the changes by path with text diffs of
// small text files, both sandboxes it started killed after; malformed
// references are 400, unknown ones 404, a node that reads no files 409,
// and none of them leaves a sandbox behind.
func TestSnapshotDiffRoute(t *testing.T) { controltest.Each(t, testSnapshotDiffRoute) }

func testSnapshotDiffRoute(t *testing.T, _ controltest.Config) {
	var tn *treeNode
	f := newFnode(t, func(c *control.Config) {
		nodes := c.Nodes.(control.Nodes)
		tn = &treeNode{Node: nodes[controltest.NodeID], trees: map[string][]nodeapi.FileEntry{}, files: map[string]map[string]string{}}
		nodes[controltest.NodeID] = tn
	})
	sb := f.create(`{"templateID":"base","timeout":60}`)
	var a, b api.SnapshotInfo
	json.Unmarshal(f.want(201, "POST", "/sandboxes/"+sb.SandboxID+"/snapshots", `{"name":"before"}`), &a)
	json.Unmarshal(f.want(201, "POST", "/sandboxes/"+sb.SandboxID+"/snapshots", `{}`), &b)
	f.want(204, "DELETE", "/sandboxes/"+sb.SandboxID, "")

	t0, t1 := time.Unix(1000, 0), time.Unix(2000, 0)
	file := func(p string, size int, mt time.Time) nodeapi.FileEntry {
		return nodeapi.FileEntry{Path: p, Type: nodeapi.FileRegular, Mode: 0o644, UID: 1000, GID: 1000, Size: int64(size), Mtime: mt}
	}
	tn.trees[a.SnapshotID] = []nodeapi.FileEntry{
		{Path: "/home", Type: nodeapi.FileDir, Mode: 0o755, Mtime: t0},
		file("/home/conf", 4, t0), file("/home/gone", 3, t0), file("/home/same", 2, t0), file("/home/bin", 3, t0),
	}
	tn.trees[b.SnapshotID] = []nodeapi.FileEntry{
		{Path: "/home", Type: nodeapi.FileDir, Mode: 0o755, Mtime: t1},
		file("/home/conf", 4, t1), file("/home/same", 2, t0), file("/home/new", 6, t1), file("/home/bin", 3, t1),
	}
	tn.files[a.SnapshotID] = map[string]string{"/home/conf": "a=1\n", "/home/gone": "x\n\n", "/home/same": "s\n", "/home/bin": "\x00\x01\x02"}
	tn.files[b.SnapshotID] = map[string]string{"/home/conf": "a=2\n", "/home/same": "s\n", "/home/new": "hello\n", "/home/bin": "\x00\x01\x03"}

	var d api.SnapshotDiff
	if err := json.Unmarshal(f.want(200, "GET", "/snapshots/before/diff/"+b.SnapshotID, ""), &d); err != nil {
		t.Fatal(err)
	}
	if d.From != a.SnapshotID || d.To != b.SnapshotID || d.Added != 1 || d.Removed != 1 || d.Changed != 2 || d.Truncated || len(d.Changes) != 4 {
		t.Fatalf("diff = %+v", d)
	}
	byPath := map[string]api.FileChange{}
	for _, c := range d.Changes {
		byPath[c.Path] = c
	}
	if c := byPath["/home/conf"]; c.Change != "changed" || !strings.Contains(c.Diff, "-a=1\n+a=2\n") || c.From.Mode != "0644" || c.To.ModifiedAt == "" {
		t.Fatalf("conf = %+v", c)
	}
	if c := byPath["/home/new"]; c.Change != "added" || c.From != nil || !strings.Contains(c.Diff, "+hello\n") {
		t.Fatalf("new = %+v", c)
	}
	if c := byPath["/home/gone"]; c.Change != "removed" || c.To != nil || !strings.Contains(c.Diff, "-x\n") {
		t.Fatalf("gone = %+v", c)
	}
	if c := byPath["/home/bin"]; !c.Binary || c.Diff != "" {
		t.Fatalf("bin = %+v", c)
	}
	if tn.reads != 2 {
		t.Fatalf("files read in %d calls, want one a side", tn.reads)
	}
	noneLeft := func(what string) {
		t.Helper()
		var list []api.SandboxDetail
		json.Unmarshal(f.want(200, "GET", "/v2/sandboxes", ""), &list)
		if len(list) != 0 {
			t.Fatalf("after %s: %d sandboxes left: %+v", what, len(list), list)
		}
	}
	noneLeft("a diff")

	f.want(400, "GET", "/snapshots/bad!ref/diff/"+b.SnapshotID, "")
	f.want(400, "GET", "/snapshots/"+a.SnapshotID+"/diff/bad!ref", "")
	f.want(404, "GET", "/snapshots/"+a.SnapshotID+"/diff/nosuchsnapshot", "")
	noneLeft("refused diffs")

	// A node that cannot read a sandbox's files: 409, nothing left.
	f2 := newFnode(t)
	sb2 := f2.create(`{"templateID":"base","timeout":60}`)
	var c api.SnapshotInfo
	json.Unmarshal(f2.want(201, "POST", "/sandboxes/"+sb2.SandboxID+"/snapshots", `{}`), &c)
	f2.want(204, "DELETE", "/sandboxes/"+sb2.SandboxID, "")
	f2.want(409, "GET", "/snapshots/"+c.SnapshotID+"/diff/"+c.SnapshotID, "")
	var list []api.SandboxDetail
	json.Unmarshal(f2.want(200, "GET", "/v2/sandboxes", ""), &list)
	if len(list) != 0 {
		t.Fatalf("a failed diff left %d sandboxes", len(list))
	}
}

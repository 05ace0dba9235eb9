package node

import (
	"archive/tar"
	"context"
	"fmt"
	"io"
	"path"
	"strings"
	"time"

	"github.com/spore-run/spore/internal/engine"
	"github.com/spore-run/spore/internal/envd/export"
	"github.com/spore-run/spore/internal/errdefs"
	"github.com/spore-run/spore/internal/ids"
	"github.com/spore-run/spore/internal/nodeapi"
)

// The files of a running sandbox, read through its daemon as root (its
// writes live in gVisor's overlay, visible only from inside): what a
// snapshot diff compares (docs/templates.md, "Snapshot diff").

// FileTree lists a running sandbox's filesystem (nodeapi.Node.FileTree).
func (n *Node) FileTree(ctx context.Context, id string) ([]nodeapi.FileEntry, error) {
	sb, err := n.runningSandbox(ctx, id, "list the files of")
	if err != nil {
		return nil, err
	}
	ents, err := daemonOf(sb).manifest(ctx, nodeapi.MaxTreeEntries)
	if err != nil {
		return nil, fmt.Errorf("files of %s: %w", id, err)
	}
	out := make([]nodeapi.FileEntry, len(ents))
	for i, e := range ents {
		out[i] = FileEntry(e)
	}
	return out, nil
}

// FileEntry is e as the node contract gives it.
func FileEntry(e export.Entry) nodeapi.FileEntry {
	fe := nodeapi.FileEntry{Path: "/" + e.Path, Type: fileTypes[e.Type], Mode: e.Mode, UID: e.UID, GID: e.GID, Link: e.Link}
	if e.Type == export.TypeFile {
		fe.Size = e.Size
	}
	if e.Mtime != 0 {
		fe.Mtime = time.Unix(0, e.Mtime).UTC()
	}
	return fe
}

var fileTypes = map[byte]string{
	export.TypeFile: nodeapi.FileRegular, export.TypeDir: nodeapi.FileDir, export.TypeSymlink: nodeapi.FileSymlink,
	export.TypeChar: nodeapi.FileChar, export.TypeBlock: nodeapi.FileBlock, export.TypeFIFO: nodeapi.FileFIFO,
	export.TypeSocket: nodeapi.FileSocket, export.TypeMount: nodeapi.FileMount,
}

// CheckReadPaths refuses a ReadFiles list that is empty, too long, or
// has a path that is not absolute and clean, or twice.
func CheckReadPaths(paths []string) error {
	if len(paths) == 0 || len(paths) > nodeapi.MaxReadFiles {
		return errdefs.Invalidf("read files: give 1 to %d paths, not %d", nodeapi.MaxReadFiles, len(paths))
	}
	seen := make(map[string]bool, len(paths))
	for _, p := range paths {
		if !path.IsAbs(p) || p == "/" || export.CheckPath(p[1:]) != nil {
			return errdefs.Invalidf("read files: path %.100q is not absolute and clean", p)
		}
		if seen[p] {
			return errdefs.Invalidf("read files: path %.100q is asked for twice", p)
		}
		seen[p] = true
	}
	return nil
}

// ReadFiles reads regular files of a running sandbox
// (nodeapi.Node.ReadFiles), in the order asked.
func (n *Node) ReadFiles(ctx context.Context, id string, paths []string) ([]nodeapi.FileData, error) {
	if err := CheckReadPaths(paths); err != nil {
		return nil, err
	}
	sb, err := n.runningSandbox(ctx, id, "read the files of")
	if err != nil {
		return nil, err
	}
	rel := make([]string, len(paths))
	for i, p := range paths {
		rel[i] = p[1:]
	}
	got := make(map[string]nodeapi.FileData, len(paths))
	if err := daemonOf(sb).tar(ctx, rel, func(tr *tar.Reader) error { return readTar(tr, got) }); err != nil {
		return nil, fmt.Errorf("read the files of %s: %w", id, err)
	}
	out := make([]nodeapi.FileData, len(paths))
	for i, p := range paths {
		d, ok := got[p[1:]]
		if !ok {
			d = nodeapi.FileData{Missing: true}
		}
		d.Path = p
		out[i] = d
	}
	return out, nil
}

// readTar keeps the regular files of the daemon's tar (a hard link gets
// its target's data), at most MaxReadBytes of content each.
func readTar(tr *tar.Reader, got map[string]nodeapi.FileData) error {
	for {
		h, err := tr.Next()
		if err == io.EOF {
			return nil
		}
		if err != nil {
			return fmt.Errorf("%w: the sandbox's tar: %v", errdefs.ErrInternal, err)
		}
		p := strings.TrimSuffix(h.Name, "/")
		switch h.Typeflag {
		case tar.TypeReg:
			d := nodeapi.FileData{Size: h.Size}
			if h.Size <= nodeapi.MaxReadBytes {
				d.Data = make([]byte, h.Size)
				if _, err := io.ReadFull(tr, d.Data); err != nil {
					return fmt.Errorf("%w: the sandbox's tar: %v", errdefs.ErrInternal, err)
				}
			}
			got[p] = d
		case tar.TypeLink:
			if first, ok := got[h.Linkname]; ok {
				got[p] = first
			}
		}
	}
}

// runningSandbox is sandbox id, refused unless it runs here with an
// address (its daemon answers there).
func (n *Node) runningSandbox(ctx context.Context, id, what string) (engine.Sandbox, error) {
	if err := ids.Validate("sandbox ID", id); err != nil {
		return engine.Sandbox{}, err
	}
	sb, err := n.Engine.Get(ctx, id)
	if err != nil {
		return engine.Sandbox{}, err
	}
	if sb.State != engine.StateRunning || !sb.Addr.IsValid() {
		return engine.Sandbox{}, errdefs.Conflictf("%s %s: sandbox is %s, not running", what, id, sb.State)
	}
	return sb, nil
}

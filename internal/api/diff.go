package api

import (
	"fmt"
	"net/http"

	"github.com/spore-run/spore/internal/control"
	"github.com/spore-run/spore/internal/nodeapi"
)

// SnapshotDiff is GET /snapshots/{a}/diff/{b}: what changed in the
// filesystem from snapshot a to snapshot b (docs/templates.md, "Snapshot
// diff").
type SnapshotDiff struct {
	From    string `json:"from"`
	To      string `json:"to"`
	Added   int    `json:"added"`
	Removed int    `json:"removed"`
	Changed int    `json:"changed"`
	// Truncated: more changes than listed (the counts are of all).
	Truncated bool `json:"truncated"`
	// TextDiffsOmitted counts small files shown without a text diff
	// (past the number read).
	TextDiffsOmitted int          `json:"textDiffsOmitted"`
	Changes          []FileChange `json:"changes"`
}

// FileChange is one path that differs.
type FileChange struct {
	Path   string    `json:"path"`
	Change string    `json:"change"` // added, removed, changed
	From   *FileStat `json:"from,omitempty"`
	To     *FileStat `json:"to,omitempty"`
	// Diff is a unified diff of a small text file's content.
	Diff string `json:"diff,omitempty"`
	// Binary: the content differs and is not text.
	Binary bool `json:"binary,omitempty"`
}

// FileStat is a file's metadata on one side of a diff.
type FileStat struct {
	Type       string `json:"type"` // file, dir, symlink, char, block, fifo
	Mode       string `json:"mode"` // octal permission bits, "0644"
	UID        uint32 `json:"uid"`
	GID        uint32 `json:"gid"`
	Size       int64  `json:"size"`
	ModifiedAt string `json:"modifiedAt,omitempty"`
	Link       string `json:"link,omitempty"`
}

func fileStat(e *nodeapi.FileEntry) *FileStat {
	if e == nil {
		return nil
	}
	fs := &FileStat{Type: e.Type, Mode: fmt.Sprintf("%04o", e.Mode), UID: e.UID, GID: e.GID, Size: e.Size, Link: e.Link}
	if !e.Mtime.IsZero() {
		fs.ModifiedAt = rfc3339(e.Mtime)
	}
	return fs
}

func (s *Server) diffRoutes() []route {
	return []route{{"GET /snapshots/{snapshotID}/diff/{otherID}", s.diffSnapshots, user}}
}

func (s *Server) diffSnapshots(w http.ResponseWriter, r *http.Request) {
	var refs [2]string
	for i, v := range []string{"snapshotID", "otherID"} {
		var ok bool
		if refs[i], ok = s.snapshotRef(w, r, v); !ok {
			return
		}
	}
	d, err := s.c.DiffSnapshots(r.Context(), teamOf(r), refs[0], refs[1])
	if err != nil {
		s.fail(w, r, err)
		return
	}
	writeJSON(w, http.StatusOK, snapshotDiff(d))
}

func snapshotDiff(d control.SnapshotDiff) SnapshotDiff {
	out := SnapshotDiff{From: d.From, To: d.To, Added: d.Added, Removed: d.Removed, Changed: d.Changed, Truncated: d.Truncated,
		TextDiffsOmitted: d.TextDiffsOmitted, Changes: make([]FileChange, len(d.Changes))}
	for i, c := range d.Changes {
		out.Changes[i] = FileChange{Path: c.Path, Change: c.Kind, From: fileStat(c.From), To: fileStat(c.To), Diff: c.Diff, Binary: c.Binary}
	}
	return out
}

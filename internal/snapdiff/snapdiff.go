// Package snapdiff compares two listings of a sandbox's filesystem (two
// snapshots restored side by side) and shows what changed: the files
// added, removed and changed, with a unified diff for small text files.
// It only compares; reading the listings and files is the caller's
// (control.DiffSnapshots, through the node contract).
package snapdiff

import (
	"bytes"
	"slices"
	"strings"
	"unicode/utf8"

	udiff "github.com/aymanbagabas/go-udiff"

	"github.com/spore-run/spore/internal/nodeapi"
)

// Kinds of change.
const (
	Added   = "added"
	Removed = "removed"
	Changed = "changed"
)

// MaxTextBytes is the largest file (on either side) shown as a text diff.
const MaxTextBytes = nodeapi.MaxReadBytes

// Change is one path that differs.
type Change struct {
	Path string
	Kind string // Added, Removed, Changed
	// From and To are the entry on each side (From nil when Added, To
	// nil when Removed).
	From, To *nodeapi.FileEntry
	// Diff is the unified diff of a small text file's content ("" when
	// the content is the same, not read, or not text).
	Diff string
	// Binary: the content was read and is not text.
	Binary bool
}

// Compare returns what differs from one listing to the other, by path.
// A regular file differs in type, mode, owner, size or modification
// time; a symbolic link in its target too; a directory only in type,
// mode or owner (its time changes with any entry inside it, which is
// listed itself). Mount points and sockets are not compared: neither is
// the snapshot's root filesystem (a volume is mounted there; a socket
// is a process's).
func Compare(from, to []nodeapi.FileEntry) []Change {
	old := make(map[string]*nodeapi.FileEntry, len(from))
	for i := range from {
		if compared(from[i]) {
			old[from[i].Path] = &from[i]
		}
	}
	var out []Change
	seen := make(map[string]bool, len(to))
	for i := range to {
		e := &to[i]
		if !compared(*e) {
			continue
		}
		seen[e.Path] = true
		o, ok := old[e.Path]
		switch {
		case !ok:
			out = append(out, Change{Path: e.Path, Kind: Added, To: e})
		case differ(*o, *e):
			out = append(out, Change{Path: e.Path, Kind: Changed, From: o, To: e})
		}
	}
	for i := range from {
		e := &from[i]
		if compared(*e) && !seen[e.Path] {
			out = append(out, Change{Path: e.Path, Kind: Removed, From: e})
		}
	}
	slices.SortFunc(out, func(a, b Change) int { return strings.Compare(a.Path, b.Path) })
	return out
}

func compared(e nodeapi.FileEntry) bool {
	return e.Type != nodeapi.FileMount && e.Type != nodeapi.FileSocket
}

func differ(a, b nodeapi.FileEntry) bool {
	if a.Type != b.Type || a.Mode != b.Mode || a.UID != b.UID || a.GID != b.GID {
		return true
	}
	switch a.Type {
	case nodeapi.FileDir:
		return false
	case nodeapi.FileSymlink:
		return a.Link != b.Link
	}
	return a.Size != b.Size || !a.Mtime.Equal(b.Mtime)
}

// Readable reports whether a change's content is worth reading for a
// text diff: a regular file on each side it exists, none over
// MaxTextBytes.
func (c Change) Readable() bool {
	for _, e := range []*nodeapi.FileEntry{c.From, c.To} {
		if e != nil && (e.Type != nodeapi.FileRegular || e.Size > MaxTextBytes) {
			return false
		}
	}
	return true
}

// SetContent sets the change's Diff (or Binary) from the content on each
// side (nil for the side it does not exist on).
func (c *Change) SetContent(from, to []byte) {
	if !Text(from) || !Text(to) {
		c.Binary = !bytes.Equal(from, to)
		return
	}
	if bytes.Equal(from, to) {
		return
	}
	a, b := "a"+c.Path, "b"+c.Path
	if c.From == nil {
		a = "/dev/null"
	}
	if c.To == nil {
		b = "/dev/null"
	}
	c.Diff = udiff.Unified(a, b, string(from), string(to))
}

// Text reports whether b reads as text: valid UTF-8 with no NUL byte.
func Text(b []byte) bool {
	return bytes.IndexByte(b, 0) < 0 && utf8.Valid(b)
}

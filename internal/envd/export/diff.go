package export

import (
	"path"
	"strings"
)

// Diff compares the entries seen inside a sandbox (upper: the merged view
// of its root overlay, in Walk order) with those of its lower layer, and
// returns what an image layer over the lower layer needs: the entries
// changed or added (in upper's order, parents first), and the topmost
// lower paths deleted (one whiteout deletes a whole directory).
//
// A lower entry is deleted when upper lacks it while its parent is in
// upper as a directory (a parent replaced by a file, or deleted itself,
// already removes it). Nothing under a mount point is compared: what is
// mounted there hides the lower layer's entries, it did not delete them.
func Diff(lower, upper []Entry) (changed []Entry, deleted []string) {
	low := make(map[string]Entry, len(lower))
	for _, e := range lower {
		low[e.Path] = e
	}
	up := make(map[string]Entry, len(upper))
	var mounts []string
	for _, e := range upper {
		up[e.Path] = e
		if e.Type == TypeMount {
			mounts = append(mounts, e.Path+"/")
			continue
		}
		if e.Type == TypeSocket {
			continue
		}
		if l, ok := low[e.Path]; !ok || !l.Same(e) {
			changed = append(changed, e)
		}
	}
	under := func(p string) bool {
		for _, m := range mounts {
			if strings.HasPrefix(p, m) {
				return true
			}
		}
		return false
	}
	for _, e := range lower {
		if _, ok := up[e.Path]; ok || under(e.Path) {
			continue
		}
		if dir := path.Dir(e.Path); dir != "." {
			if pe, ok := up[dir]; !ok || pe.Type != TypeDir {
				continue
			}
		}
		deleted = append(deleted, e.Path)
	}
	return changed, deleted
}

package dockerfile

import (
	"archive/tar"
	"compress/gzip"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"slices"
	"strconv"
	"strings"
	"syscall"

	"github.com/moby/patternmatcher"
	"github.com/moby/patternmatcher/ignorefile"

	"github.com/spore-run/spore/internal/errdefs"
)

// ListFiles is what a COPY of src takes from the build context ctxDir:
// the paths (relative, slash separated, sorted) src names, a glob's
// matches, and everything beneath a directory, directories included,
// minus what .dockerignore excludes. Symlinks are listed, never
// followed, and every path is resolved inside ctxDir (os.Root), so none
// leaves it.
func ListFiles(ctxDir, src string) ([]string, error) {
	rel, err := cleanSrc(src)
	if err != nil {
		return nil, err
	}
	root, err := os.OpenRoot(ctxDir)
	if err != nil {
		return nil, errdefs.Invalidf("build context %s: %v", ctxDir, err)
	}
	defer root.Close()
	ign, err := readIgnore(root)
	if err != nil {
		return nil, err
	}
	fsys := root.FS()
	var matches []string
	if strings.ContainsAny(rel, "*?[") {
		if matches, err = fs.Glob(fsys, rel); err != nil {
			return nil, errdefs.Invalidf("source %q: %v", src, err)
		}
	} else if _, err := root.Lstat(rel); err == nil {
		matches = []string{rel}
	}
	seen := map[string]bool{}
	for _, m := range matches {
		if m != "." && ign.excluded(m) {
			continue
		}
		// WalkDir would stat (follow) its root: a symlink is listed as
		// itself, never walked through.
		fi, err := root.Lstat(m)
		if err != nil {
			return nil, errdefs.Invalidf("source %q: %v", src, err)
		}
		if !fi.IsDir() {
			seen[m] = true
			continue
		}
		err = fs.WalkDir(fsys, m, func(p string, d fs.DirEntry, err error) error {
			if err != nil {
				return err
			}
			if p != "." && ign.excluded(p) {
				if d.IsDir() && !ign.hasExceptions {
					return fs.SkipDir
				}
				return nil
			}
			if p != "." {
				seen[p] = true
			}
			return nil
		})
		if err != nil {
			return nil, fmt.Errorf("%w: source %q: %v", errdefs.ErrInvalidArgument, src, err)
		}
	}
	if len(seen) == 0 {
		return nil, errdefs.Invalidf("source %q: no files found in the build context", src)
	}
	files := make([]string, 0, len(seen))
	for p := range seen {
		files = append(files, p)
	}
	slices.Sort(files)
	return files, nil
}

type ignorer struct {
	pm            *patternmatcher.PatternMatcher
	hasExceptions bool
}

func readIgnore(root *os.Root) (ignorer, error) {
	f, err := root.Open(".dockerignore")
	if errors.Is(err, fs.ErrNotExist) {
		return ignorer{}, nil
	}
	if err != nil {
		return ignorer{}, errdefs.Invalidf(".dockerignore: %v", err)
	}
	defer f.Close()
	patterns, err := ignorefile.ReadAll(f)
	if err != nil {
		return ignorer{}, errdefs.Invalidf(".dockerignore: %v", err)
	}
	pm, err := patternmatcher.New(patterns)
	if err != nil {
		return ignorer{}, errdefs.Invalidf(".dockerignore: %v", err)
	}
	return ignorer{pm: pm, hasExceptions: pm.Exclusions()}, nil
}

func (i ignorer) excluded(p string) bool {
	if i.pm == nil {
		return false
	}
	// MatchesOrParentMatches: a path is out when it or a parent is
	// matched (Docker's rule); exceptions (!pattern) can bring it back.
	ok, err := i.pm.MatchesOrParentMatches(p)
	return err == nil && ok
}

// HashFiles is the FilesHash of "COPY src dest" from ctxDir: SHA-256
// (hex) over the instruction, then, for each file ListFiles gives in
// order, its path, mode (st_mode, type bits included), size and
// contents (a symlink: its target). It follows the SDK's
// calculateFilesHash except that a directory's size is left out (it
// depends on the filesystem, not on what is copied). uid, gid and
// mtimes are left out, as the SDK does, so the hash is stable across
// checkouts.
func HashFiles(ctxDir, src, dest string) (string, error) {
	files, err := ListFiles(ctxDir, src)
	if err != nil {
		return "", err
	}
	root, err := os.OpenRoot(ctxDir)
	if err != nil {
		return "", errdefs.Invalidf("build context %s: %v", ctxDir, err)
	}
	defer root.Close()
	h := sha256.New()
	io.WriteString(h, "COPY "+src+" "+dest)
	for _, p := range files {
		fi, err := root.Lstat(p)
		if err != nil {
			return "", errdefs.Invalidf("source %q: %v", src, err)
		}
		io.WriteString(h, p)
		io.WriteString(h, strconv.FormatUint(uint64(rawMode(fi)), 10))
		switch {
		case fi.Mode()&fs.ModeSymlink != 0:
			target, err := root.Readlink(p)
			if err != nil {
				return "", errdefs.Invalidf("source %q: %v", src, err)
			}
			io.WriteString(h, strconv.Itoa(len(target)))
			io.WriteString(h, target)
		case fi.Mode().IsRegular():
			io.WriteString(h, strconv.FormatInt(fi.Size(), 10))
			if err := copyFile(h, root, p, fi.Size()); err != nil {
				return "", err
			}
		}
	}
	return hex.EncodeToString(h.Sum(nil)), nil
}

func rawMode(fi fs.FileInfo) uint32 {
	if st, ok := fi.Sys().(*syscall.Stat_t); ok {
		return st.Mode
	}
	return uint32(fi.Mode())
}

// copyFile copies exactly size bytes of p: a file that changed size
// since it was stat'ed is an error, not a silently inconsistent hash or
// archive.
func copyFile(w io.Writer, root *os.Root, p string, size int64) error {
	f, err := root.Open(p)
	if err != nil {
		return errdefs.Invalidf("%s: %v", p, err)
	}
	defer f.Close()
	n, err := io.Copy(w, io.LimitReader(f, size+1))
	if err != nil {
		return fmt.Errorf("%s: %w", p, err)
	}
	if n != size {
		return errdefs.Conflictf("%s changed while being read (%d bytes, expected %d)", p, n, size)
	}
	return nil
}

// TarFiles writes to w a tar (gzipped if gz) of the files ListFiles
// gives for src, named by their paths relative to ctxDir (as the SDK's
// tar.create({cwd: ctx}, paths)); directories are entries of their own,
// symlinks are archived as symlinks. Owners are 0 (the COPY step's user
// decides them).
func TarFiles(w io.Writer, ctxDir, src string, gz bool) error {
	files, err := ListFiles(ctxDir, src)
	if err != nil {
		return err
	}
	root, err := os.OpenRoot(ctxDir)
	if err != nil {
		return errdefs.Invalidf("build context %s: %v", ctxDir, err)
	}
	defer root.Close()
	out := w
	var zw *gzip.Writer
	if gz {
		zw = gzip.NewWriter(w)
		out = zw
	}
	tw := tar.NewWriter(out)
	for _, p := range files {
		fi, err := root.Lstat(p)
		if err != nil {
			return errdefs.Invalidf("%s: %v", p, err)
		}
		var link string
		if fi.Mode()&fs.ModeSymlink != 0 {
			if link, err = root.Readlink(p); err != nil {
				return errdefs.Invalidf("%s: %v", p, err)
			}
		}
		hdr, err := tar.FileInfoHeader(fi, link)
		if err != nil {
			return errdefs.Invalidf("%s: %v", p, err)
		}
		hdr.Name = p
		if fi.IsDir() {
			hdr.Name = p + "/"
		}
		hdr.Uid, hdr.Gid, hdr.Uname, hdr.Gname = 0, 0, "", ""
		hdr.Format = tar.FormatPAX
		if err := tw.WriteHeader(hdr); err != nil {
			return fmt.Errorf("tar %s: %w", p, err)
		}
		if fi.Mode().IsRegular() {
			if err := copyFile(tw, root, p, fi.Size()); err != nil {
				return err
			}
		}
	}
	if err := tw.Close(); err != nil {
		return err
	}
	if zw != nil {
		return zw.Close()
	}
	return nil
}

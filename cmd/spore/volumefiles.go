package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path"
	"path/filepath"
	"strings"
	"time"

	"github.com/spf13/cobra"

	"github.com/spore-run/spore/internal/client"
	"github.com/spore-run/spore/internal/volume"
	"github.com/spore-run/spore/internal/volume/content"
)

// volumePath is a VOLUME:/path argument: a volume's name or ID, and a
// path from its root.
type volumePath struct {
	ref, path string
}

// parseVolumePath reads a VOLUME:/path argument; ok is false for a local
// path (no colon before the first slash).
func parseVolumePath(arg string) (volumePath, bool, error) {
	ref, p, found := strings.Cut(arg, ":")
	if !found || ref == "" || strings.Contains(ref, "/") {
		return volumePath{}, false, nil
	}
	if err := volume.ValidateRef(ref); err != nil {
		return volumePath{}, true, fmt.Errorf("%s: %w", arg, err)
	}
	if p == "" {
		p = "/"
	}
	if !strings.HasPrefix(p, "/") {
		return volumePath{}, true, fmt.Errorf("%s: the path in the volume must start with / (NAME:/dir/file)", arg)
	}
	return volumePath{ref: ref, path: p}, true, nil
}

func (v volumePath) String() string { return v.ref + ":" + v.path }

func newVolumeCpCmd(f *cliFlags) *cobra.Command {
	var recursive bool
	cmd := &cobra.Command{
		Use:   "cp [-r] SRC DST",
		Short: "Copy files into or out of a volume (one side is VOLUME:/path)",
		Long: `Copy a file or, with -r, a directory tree between this machine and a volume,
through the volume content API (the volume's token is fetched with your key).
One side is VOLUME:/path (a volume's name or ID, then a path from its root);
"-" is standard input or output (one file).

  spore volume cp ./notes.txt repo:/docs/notes.txt   upload (parent directories made)
  spore volume cp -r ./src repo:/src                  upload a tree
  spore volume cp repo:/docs/notes.txt .              download into a directory
  spore volume cp -r repo:/src ./src-copy             download a tree
  spore volume cp repo:/docs/notes.txt -              print a file

As cp does, a destination that is an existing directory (or ends with /)
receives the source under its own name. Uploads replace a file whole (a cut
upload leaves the old content); symbolic links are skipped, and named.`,
		Args: cobra.ExactArgs(2),
		RunE: func(cmd *cobra.Command, args []string) error {
			src, srcVol, err := parseVolumePath(args[0])
			if err != nil {
				return err
			}
			dst, dstVol, err := parseVolumePath(args[1])
			if err != nil {
				return err
			}
			if srcVol && dstVol {
				return fmt.Errorf("both SRC and DST are volumes: copy out to a local path, then in")
			}
			if !srcVol && !dstVol {
				return fmt.Errorf("one of SRC and DST must be a volume (NAME:/path), the other a local path")
			}
			c, err := f.client()
			if err != nil {
				return err
			}
			cp := &copier{ctx: cmd.Context(), recursive: recursive, errOut: cmd.ErrOrStderr(), stdin: cmd.InOrStdin(), stdout: cmd.OutOrStdout()}
			if dstVol {
				if cp.files, err = c.VolumeFiles(cmd.Context(), dst.ref); err != nil {
					return err
				}
				return cp.upload(args[0], dst)
			}
			if cp.files, err = c.VolumeFiles(cmd.Context(), src.ref); err != nil {
				return err
			}
			return cp.download(src, args[1])
		},
	}
	cmd.Flags().BoolVarP(&recursive, "recursive", "r", false, "copy directories and what they hold")
	return cmd
}

type copier struct {
	ctx       context.Context
	files     *client.VolumeFiles
	recursive bool
	errOut    io.Writer // what was copied, what was skipped
	stdin     io.Reader // "-" as the source
	stdout    io.Writer // "-" as the destination
	n         int       // files copied
	bytes     int64     // their bytes
}

func (c *copier) done(what string) {
	fmt.Fprintf(c.errOut, "%s %d file(s), %s\n", what, c.n, volume.FormatSize(c.bytes))
}

// upload copies the local src (a file, "-", or a tree with -r) to dst.
func (c *copier) upload(src string, dst volumePath) error {
	if src == "-" {
		if strings.HasSuffix(dst.path, "/") {
			return fmt.Errorf("%s: standard input needs a file name in the volume", dst)
		}
		if err := c.files.Write(c.ctx, dst.path, c.stdin, -1, 0o644); err != nil {
			return fmt.Errorf("write %s: %w", dst, err)
		}
		return nil
	}
	fi, err := os.Stat(src)
	if err != nil {
		return err
	}
	target := dst.path
	if fi.IsDir() && !c.recursive {
		return fmt.Errorf("%s is a directory: copy it with -r", src)
	}
	if strings.HasSuffix(target, "/") {
		target = path.Join(target, filepath.Base(src))
	} else if st, err := c.files.Stat(c.ctx, target); err == nil && st.Type == "directory" {
		target = path.Join(target, filepath.Base(src))
	} else if err != nil && !isNotFound(err) {
		return err
	}
	if !fi.IsDir() {
		if err := c.uploadFile(src, fi, target); err != nil {
			return err
		}
		c.done("uploaded")
		return nil
	}
	err = filepath.WalkDir(src, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, err := filepath.Rel(src, p)
		if err != nil {
			return err
		}
		to := path.Join(target, filepath.ToSlash(rel))
		switch {
		case d.IsDir():
			if err := c.files.MakeDir(c.ctx, to); err != nil {
				return fmt.Errorf("make %s:%s: %w", dst.ref, to, err)
			}
		case d.Type().IsRegular():
			fi, err := d.Info()
			if err != nil {
				return err
			}
			return c.uploadFile(p, fi, to)
		default:
			fmt.Fprintf(c.errOut, "skipped %s (not a file or directory)\n", p)
		}
		return nil
	})
	if err != nil {
		return err
	}
	c.done("uploaded")
	return nil
}

func (c *copier) uploadFile(src string, fi fs.FileInfo, to string) error {
	f, err := os.Open(src)
	if err != nil {
		return err
	}
	defer f.Close()
	if err := c.files.Write(c.ctx, to, f, fi.Size(), uint32(fi.Mode().Perm())); err != nil {
		return fmt.Errorf("write %s: %w", to, err)
	}
	c.n++
	c.bytes += fi.Size()
	return nil
}

// download copies src (a file, or a tree with -r) to the local dst (a
// path, or "-" for one file). Everything is written inside the
// destination's directory (os.Root): no name from the volume reaches
// outside it.
func (c *copier) download(src volumePath, dst string) error {
	st, err := c.files.Stat(c.ctx, src.path)
	if err != nil {
		return fmt.Errorf("%s: %w", src, err)
	}
	if dst == "-" {
		if st.Type != "file" {
			return fmt.Errorf("%s is a %s: only a file goes to standard output", src, st.Type)
		}
		return c.readInto(src.path, func() (io.WriteCloser, func() error, error) {
			return nopWriteCloser{c.stdout}, func() error { return nil }, nil
		})
	}
	switch st.Type {
	case "file":
	case "directory":
		if !c.recursive {
			return fmt.Errorf("%s is a directory: copy it with -r", src)
		}
	default:
		return fmt.Errorf("%s is a %s: only files and directories are copied", src, st.Type)
	}
	target := dst
	if fi, err := os.Stat(dst); (err == nil && fi.IsDir()) || strings.HasSuffix(dst, "/") {
		target = filepath.Join(dst, st.Name)
	}
	if st.Type == "file" {
		dir, base := filepath.Split(target)
		if dir == "" {
			dir = "."
		}
		root, err := os.OpenRoot(dir)
		if err != nil {
			return err
		}
		defer root.Close()
		if err := c.downloadFile(root, src.path, base, st); err != nil {
			return err
		}
		c.done("downloaded")
		return nil
	}
	if err := os.Mkdir(target, 0o755); err != nil && !errors.Is(err, fs.ErrExist) {
		return err
	}
	root, err := os.OpenRoot(target)
	if err != nil {
		return err
	}
	defer root.Close()
	if err := c.downloadTree(root, src, src.path, "."); err != nil {
		return err
	}
	c.done("downloaded")
	return nil
}

// downloadTree copies the volume's directory dir into root's local dir.
func (c *copier) downloadTree(root *os.Root, src volumePath, dir, local string) error {
	entries, err := c.files.List(c.ctx, dir, 1)
	if err != nil {
		return fmt.Errorf("list %s:%s: %w", src.ref, dir, err)
	}
	for _, e := range entries {
		if e.Name == "" || e.Name == "." || e.Name == ".." || strings.ContainsAny(e.Name, "/\x00") {
			return fmt.Errorf("list %s:%s: an entry named %q", src.ref, dir, e.Name)
		}
		to := filepath.Join(local, e.Name)
		switch e.Type {
		case "directory":
			if err := root.Mkdir(to, fs.FileMode(e.Mode&0o777)|0o700); err != nil && !errors.Is(err, fs.ErrExist) {
				return err
			}
			if err := c.downloadTree(root, src, path.Join(dir, e.Name), to); err != nil {
				return err
			}
		case "file":
			if err := c.downloadFile(root, path.Join(dir, e.Name), to, e); err != nil {
				return err
			}
		default:
			fmt.Fprintf(c.errOut, "skipped %s:%s (a %s)\n", src.ref, path.Join(dir, e.Name), e.Type)
		}
	}
	return nil
}

// downloadFile writes the volume's file p to name in root, through a
// temporary file renamed over it once whole.
func (c *copier) downloadFile(root *os.Root, p, name string, st content.EntryStat) error {
	tmp := filepath.Join(filepath.Dir(name), fmt.Sprintf(".spore-download-%d", time.Now().UnixNano()))
	return c.readInto(p, func() (io.WriteCloser, func() error, error) {
		f, err := root.OpenFile(tmp, os.O_CREATE|os.O_EXCL|os.O_WRONLY, fs.FileMode(st.Mode&0o777)|0o600)
		if err != nil {
			return nil, nil, err
		}
		commit := func() error {
			if err := root.Rename(tmp, name); err != nil {
				root.Remove(tmp)
				return err
			}
			return nil
		}
		return &removeOnFail{File: f, root: root, name: tmp}, commit, nil
	})
}

// readInto reads the volume's file p into the writer open makes, and
// commits it when the whole file came.
func (c *copier) readInto(p string, open func() (io.WriteCloser, func() error, error)) error {
	body, size, err := c.files.Read(c.ctx, p)
	if err != nil {
		return fmt.Errorf("read %s: %w", p, err)
	}
	defer body.Close()
	w, commit, err := open()
	if err != nil {
		return err
	}
	n, err := io.Copy(w, body)
	if err == nil && size >= 0 && n != size {
		err = fmt.Errorf("read %s: %d of %d bytes", p, n, size)
	}
	if cerr := w.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		if r, ok := w.(*removeOnFail); ok {
			r.root.Remove(r.name)
		}
		return err
	}
	c.n++
	c.bytes += n
	return commit()
}

type removeOnFail struct {
	*os.File
	root *os.Root
	name string
}

type nopWriteCloser struct{ io.Writer }

func (nopWriteCloser) Close() error { return nil }

func isNotFound(err error) bool {
	var e *client.Error
	return errors.As(err, &e) && e.Status == 404
}

func newVolumeFilesCmd(f *cliFlags) *cobra.Command {
	var recursive bool
	cmd := &cobra.Command{
		Use:   "files VOLUME[:/dir]",
		Short: "List what a volume holds (a directory of it; -r: all below)",
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			arg := args[0]
			if !strings.Contains(arg, ":") {
				arg += ":/"
			}
			vp, ok, err := parseVolumePath(arg)
			if err != nil {
				return err
			}
			if !ok {
				return fmt.Errorf("%s: want VOLUME or VOLUME:/dir", args[0])
			}
			c, err := f.client()
			if err != nil {
				return err
			}
			files, err := c.VolumeFiles(cmd.Context(), vp.ref)
			if err != nil {
				return err
			}
			depth := 1
			if recursive {
				depth = content.MaxDepth
			}
			list, err := files.List(cmd.Context(), vp.path, depth)
			if err != nil {
				return fmt.Errorf("%s: %w", vp, err)
			}
			if f.json {
				return printJSON(cmd.OutOrStdout(), list)
			}
			var rows [][]string
			for _, e := range list {
				name := e.Path
				if e.Type == "directory" {
					name += "/"
				}
				if e.Target != "" {
					name += " -> " + e.Target
				}
				rows = append(rows, []string{e.Type, volume.FormatSize(e.Size), fmt.Sprintf("%04o", e.Mode&0o7777), e.Mtime, name})
			}
			table(cmd.OutOrStdout(), "TYPE\tSIZE\tMODE\tMODIFIED\tPATH", rows)
			return nil
		},
	}
	cmd.Flags().BoolVarP(&recursive, "recursive", "r", false, fmt.Sprintf("list everything below (up to %d levels)", content.MaxDepth))
	return cmd
}

package node

import (
	"archive/tar"
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"time"

	"github.com/spore-run/spore/internal/blob"
	"github.com/spore-run/spore/internal/errdefs"
)

// PutLayoutTar stores the OCI image layout in dir (oci-layout,
// index.json, blobs/sha256/...) as one tar under key: directories and
// regular files only, names relative to the layout, in walk order. The
// tar is streamed to the store (no second copy on disk): its size is
// known before it is written, since every entry is a USTAR header and its
// content padded to 512 bytes. It returns the tar's size.
func PutLayoutTar(ctx context.Context, store blob.Store, key, dir string) (int64, error) {
	if err := blob.CheckKey(key); err != nil {
		return 0, err
	}
	type entry struct {
		name string
		dir  bool
		size int64
	}
	var entries []entry
	size := int64(1024) // the end: two zero blocks
	err := filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if err != nil || p == dir {
			return err
		}
		rel, err := filepath.Rel(dir, p)
		if err != nil {
			return err
		}
		e := entry{name: filepath.ToSlash(rel), dir: d.IsDir()}
		switch {
		case d.IsDir():
			e.name += "/"
		case d.Type().IsRegular():
			fi, err := d.Info()
			if err != nil {
				return err
			}
			e.size = fi.Size()
		default:
			return fmt.Errorf("%w: OCI layout %s: %s is neither a file nor a directory", errdefs.ErrInternal, dir, rel)
		}
		entries = append(entries, e)
		size += 512 + (e.size+511)/512*512
		return nil
	})
	if err != nil {
		return 0, err
	}
	pr, pw := io.Pipe()
	written := make(chan error, 1)
	go func() {
		err := func() error {
			tw := tar.NewWriter(pw)
			for _, e := range entries {
				h := &tar.Header{Name: e.name, Mode: 0o644, Size: e.size, Typeflag: tar.TypeReg, ModTime: time.Unix(0, 0), Format: tar.FormatUSTAR}
				if e.dir {
					h.Mode, h.Typeflag = 0o755, tar.TypeDir
				}
				if err := tw.WriteHeader(h); err != nil {
					return err
				}
				if e.dir {
					continue
				}
				f, err := os.Open(filepath.Join(dir, filepath.FromSlash(e.name)))
				if err != nil {
					return err
				}
				// CopyN: a file that changed size fails the tar, whose
				// length was promised to the store.
				_, err = io.CopyN(tw, f, e.size)
				f.Close()
				if err != nil {
					return err
				}
			}
			return tw.Close()
		}()
		pw.CloseWithError(err)
		written <- err
	}()
	err = store.Put(ctx, key, pr, size)
	pr.CloseWithError(errors.New("the store stopped reading"))
	if werr := <-written; err == nil && werr != nil {
		err = werr
	}
	if err != nil {
		return 0, fmt.Errorf("OCI layout to blob %s: %w", key, err)
	}
	return size, nil
}

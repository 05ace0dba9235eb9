// Package atomicfs holds the crash-safe file primitives every on-disk
// record in Spore is written with: write to a temporary name, fsync,
// rename over the final name, fsync the directory.
package atomicfs

import (
	"encoding/json"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
)

// WriteFile atomically replaces path with data: after a crash the file holds
// either its old content or data, never a mix.
func WriteFile(path string, data []byte, perm os.FileMode) error {
	return writeFile(path, data, perm, true)
}

// WriteFileNoSync replaces path atomically (rename) without fsync: readers
// and a restarted process see the old or the new content, never a mix,
// but a power loss may keep the old one.
func WriteFileNoSync(path string, data []byte, perm os.FileMode) error {
	return writeFile(path, data, perm, false)
}

func writeFile(path string, data []byte, perm os.FileMode, durable bool) error {
	dir := filepath.Dir(path)
	f, err := os.CreateTemp(dir, "."+filepath.Base(path)+".tmp-*")
	if err != nil {
		return err
	}
	tmp := f.Name()
	defer os.Remove(tmp) // no-op after a successful rename
	if _, err := f.Write(data); err != nil {
		f.Close()
		return err
	}
	if err := f.Chmod(perm); err != nil {
		f.Close()
		return err
	}
	if durable {
		if err := f.Sync(); err != nil {
			f.Close()
			return err
		}
	}
	if err := f.Close(); err != nil {
		return err
	}
	if err := os.Rename(tmp, path); err != nil {
		return err
	}
	if !durable {
		return nil
	}
	return SyncDir(dir)
}

// WriteJSON atomically and durably writes v as indented JSON.
func WriteJSON(path string, v any) error { return writeJSON(path, v, true) }

// WriteJSONNoSync is WriteJSON without fsync (see WriteFileNoSync).
func WriteJSONNoSync(path string, v any) error { return writeJSON(path, v, false) }

func writeJSON(path string, v any, durable bool) error {
	b, err := json.MarshalIndent(v, "", "  ")
	if err != nil {
		return fmt.Errorf("encode %s: %w", filepath.Base(path), err)
	}
	return writeFile(path, append(b, '\n'), 0o600, durable)
}

// ReadJSON decodes the JSON file at path into v.
func ReadJSON(path string, v any) error {
	b, err := os.ReadFile(path)
	if err != nil {
		return err
	}
	if err := json.Unmarshal(b, v); err != nil {
		return fmt.Errorf("decode %s: %w", path, err)
	}
	return nil
}

// SyncDir fsyncs a directory so that entries created, renamed or removed in
// it are durable.
func SyncDir(dir string) error {
	d, err := os.Open(dir)
	if err != nil {
		return err
	}
	defer d.Close()
	return d.Sync()
}

// SyncTree fsyncs every regular file and directory under root, deepest
// first, and returns the total size of the regular files.
func SyncTree(root string) (int64, error) {
	var size int64
	var dirs []string
	err := filepath.WalkDir(root, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() {
			dirs = append(dirs, p)
			return nil
		}
		if !d.Type().IsRegular() {
			return nil
		}
		f, err := os.Open(p)
		if err != nil {
			return err
		}
		defer f.Close()
		st, err := f.Stat()
		if err != nil {
			return err
		}
		size += st.Size()
		return f.Sync()
	})
	if err != nil {
		return 0, err
	}
	for i := len(dirs) - 1; i >= 0; i-- {
		if err := SyncDir(dirs[i]); err != nil {
			return 0, err
		}
	}
	return size, nil
}

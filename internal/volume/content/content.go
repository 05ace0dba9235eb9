// Package content serves E2B's volume content API (the stock SDK's
// Volume.list, makeDir, getInfo, updateMetadata, remove, readFile,
// writeFile) over a volume's directory. Every path is resolved inside
// the volume with os.Root: no "..", absolute symbolic link or link
// leading out of it reaches anything else. The caller authenticates the
// request (the volume's token) before it gets here.
package content

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"net/http"
	"os"
	"path"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/spore-run/spore/internal/errdefs"
)

// Opener opens a volume's directory (ErrNotFound-kinded errors answer
// 404; the caller closes the root).
type Opener func(r *http.Request, volumeID string) (*os.Root, error)

// EntryStat is E2B's VolumeEntryStat.
type EntryStat struct {
	Name   string `json:"name"`
	Type   string `json:"type"` // file | directory | symlink | unknown
	Path   string `json:"path"` // from the volume's root, starting with "/"
	Size   int64  `json:"size"`
	Mode   uint32 `json:"mode"` // permission bits
	UID    uint32 `json:"uid"`
	GID    uint32 `json:"gid"`
	Atime  string `json:"atime"`
	Mtime  string `json:"mtime"`
	Ctime  string `json:"ctime"`
	Target string `json:"target,omitempty"` // a symbolic link's
}

// SizeHeader carries, from a fleet's replica to the node that holds a
// volume, the volume's size: the node makes its image with it the first
// time (the replica checked the request's token; only replicas reach
// the node's content routes).
const SizeHeader = "Spore-Volume-Size"

// MaxDepth bounds a listing's depth.
const MaxDepth = 32

// Routes are the API's routes (ServeMux patterns), each served by Handler.
var Routes = []string{
	"GET /volumecontent/{volumeID}/dir",
	"POST /volumecontent/{volumeID}/dir",
	"GET /volumecontent/{volumeID}/path",
	"PATCH /volumecontent/{volumeID}/path",
	"DELETE /volumecontent/{volumeID}/path",
	"GET /volumecontent/{volumeID}/file",
	"PUT /volumecontent/{volumeID}/file",
}

// Handler serves one of Routes for the volume named in the path.
func Handler(open Opener) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		name, err := relPath(r.URL.Query().Get("path"))
		if err != nil {
			fail(w, err)
			return
		}
		// The volume and the kind from the path itself: the handler is
		// also served behind a prefix, not a ServeMux pattern (a node's).
		parts := strings.Split(strings.TrimPrefix(r.URL.Path, "/volumecontent/"), "/")
		if len(parts) != 2 || parts[0] == "" {
			fail(w, notFound("no route %s %s", r.Method, r.URL.Path))
			return
		}
		root, err := open(r, parts[0])
		if err != nil {
			fail(w, err)
			return
		}
		defer root.Close()
		kind := parts[1]
		switch r.Method + " " + kind {
		case "GET dir":
			err = list(w, r, root, name)
		case "POST dir":
			err = makeDir(w, r, root, name)
		case "GET path":
			err = writeStat(w, http.StatusOK, root, name)
		case "PATCH path":
			err = update(w, r, root, name)
		case "DELETE path":
			err = remove(w, root, name)
		case "GET file":
			err = read(w, root, name)
		case "PUT file":
			err = write(w, r, root, name)
		default:
			err = notFound("no route %s %s", r.Method, r.URL.Path)
		}
		if err != nil {
			fail(w, err)
		}
	}
}

// Errors and their statuses.
type httpError struct {
	status int
	msg    string
}

func (e *httpError) Error() string { return e.msg }

func badRequest(f string, a ...any) error {
	return &httpError{http.StatusBadRequest, fmt.Sprintf(f, a...)}
}
func notFound(f string, a ...any) error { return &httpError{http.StatusNotFound, fmt.Sprintf(f, a...)} }

// StatusError lets an Opener's error choose its status.
func StatusError(status int, msg string) error { return &httpError{status, msg} }

// Fail answers err as the content API does (a JSON {code, message}).
func Fail(w http.ResponseWriter, err error) { fail(w, err) }

func fail(w http.ResponseWriter, err error) {
	status, msg := http.StatusInternalServerError, "internal error"
	var he *httpError
	switch {
	case errors.As(err, &he):
		status, msg = he.status, he.msg
	case errdefs.IsInvalidArgument(err):
		status, msg = http.StatusBadRequest, err.Error()
	case errdefs.IsNotFound(err):
		status, msg = http.StatusNotFound, err.Error()
	case errdefs.IsConflict(err) || errdefs.IsAlreadyExists(err):
		status, msg = http.StatusConflict, err.Error()
	case errdefs.IsUnavailable(err):
		status, msg = http.StatusServiceUnavailable, "the volume is not available now; retry later"
	case errors.Is(err, fs.ErrNotExist):
		status, msg = http.StatusNotFound, "path not found"
	case errors.Is(err, fs.ErrExist):
		status, msg = http.StatusConflict, "path exists"
	case errors.Is(err, syscall.ENOSPC) || errors.Is(err, syscall.EDQUOT):
		status, msg = http.StatusInsufficientStorage, "the volume is full (its size is its quota)"
	case errors.Is(err, syscall.ENOTDIR):
		status, msg = http.StatusBadRequest, "a path component is not a directory"
	case errors.Is(err, syscall.EISDIR):
		status, msg = http.StatusBadRequest, "the path is a directory"
	case errors.Is(err, syscall.ENOTEMPTY):
		status, msg = http.StatusConflict, "the directory is not empty"
	case errors.Is(err, syscall.EROFS):
		status, msg = http.StatusConflict, "the volume is read-only"
	case strings.Contains(err.Error(), "path escapes"):
		status, msg = http.StatusBadRequest, "the path leads out of the volume"
	}
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	json.NewEncoder(w).Encode(map[string]any{"code": status, "message": msg})
}

// relPath turns a request's path ("/a/b", "a/b", "/" or "") into a name
// relative to the volume's root ("." for the root). ".." is refused
// outright (os.Root would refuse an escape, but a clear 400 is better).
func relPath(p string) (string, error) {
	if strings.ContainsRune(p, 0) || len(p) > 4096 {
		return "", badRequest("path %q is malformed", p)
	}
	for _, part := range strings.Split(p, "/") {
		if part == ".." {
			return "", badRequest("path %q: '..' is not allowed", p)
		}
	}
	clean := strings.TrimPrefix(path.Clean("/"+p), "/")
	if clean == "" {
		return ".", nil
	}
	return clean, nil
}

func apiPath(name string) string {
	if name == "." {
		return "/"
	}
	return "/" + name
}

func stat(root *os.Root, name string) (EntryStat, error) {
	fi, err := root.Lstat(name)
	if err != nil {
		return EntryStat{}, err
	}
	e := EntryStat{Name: fi.Name(), Path: apiPath(name), Size: fi.Size(), Mode: uint32(fi.Mode().Perm()), Type: "unknown"}
	if name == "." {
		e.Name = "/"
	}
	switch {
	case fi.Mode().IsRegular():
		e.Type = "file"
	case fi.IsDir():
		e.Type = "directory"
	case fi.Mode()&fs.ModeSymlink != 0:
		e.Type = "symlink"
		e.Target, _ = root.Readlink(name)
	}
	ts := func(t time.Time) string { return t.UTC().Format(time.RFC3339Nano) }
	e.Mtime, e.Atime, e.Ctime = ts(fi.ModTime()), ts(fi.ModTime()), ts(fi.ModTime())
	if st, ok := fi.Sys().(*syscall.Stat_t); ok {
		e.UID, e.GID = st.Uid, st.Gid
		e.Atime = ts(time.Unix(st.Atim.Sec, st.Atim.Nsec))
		e.Ctime = ts(time.Unix(st.Ctim.Sec, st.Ctim.Nsec))
	}
	return e, nil
}

func writeJSON(w http.ResponseWriter, status int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	json.NewEncoder(w).Encode(v)
}

func writeStat(w http.ResponseWriter, status int, root *os.Root, name string) error {
	e, err := stat(root, name)
	if err != nil {
		return err
	}
	writeJSON(w, status, e)
	return nil
}

// list answers a directory's entries, depth levels down (default 1).
func list(w http.ResponseWriter, r *http.Request, root *os.Root, name string) error {
	depth := 1
	if d := r.URL.Query().Get("depth"); d != "" {
		n, err := strconv.Atoi(d)
		if err != nil || n < 1 || n > MaxDepth {
			return badRequest("depth %q: want 1 to %d", d, MaxDepth)
		}
		depth = n
	}
	fi, err := root.Lstat(name)
	if err != nil {
		return err
	}
	if !fi.IsDir() {
		return badRequest("%s is not a directory", apiPath(name))
	}
	out := []EntryStat{}
	var walk func(dir string, left int) error
	walk = func(dir string, left int) error {
		f, err := root.Open(dir)
		if err != nil {
			return err
		}
		names, err := f.Readdirnames(-1)
		f.Close()
		if err != nil {
			return err
		}
		for _, n := range names {
			child := path.Join(dir, n)
			e, err := stat(root, child)
			if err != nil {
				continue // gone meanwhile
			}
			out = append(out, e)
			if e.Type == "directory" && left > 1 {
				if err := walk(child, left-1); err != nil {
					return err
				}
			}
		}
		return nil
	}
	if err := walk(name, depth); err != nil {
		return err
	}
	writeJSON(w, http.StatusOK, out)
	return nil
}

// owner reads uid, gid and mode from a query (or a JSON body's fields).
type owner struct {
	UID  *int    `json:"uid"`
	GID  *int    `json:"gid"`
	Mode *uint32 `json:"mode"`
}

func ownerOf(r *http.Request) (owner, error) {
	var o owner
	q := r.URL.Query()
	for key, dst := range map[string]**int{"uid": &o.UID, "gid": &o.GID} {
		if v := q.Get(key); v != "" {
			n, err := strconv.Atoi(v)
			if err != nil || n < 0 || n > 1<<31-1 {
				return o, badRequest("%s %q: want a number", key, v)
			}
			*dst = &n
		}
	}
	if v := q.Get("mode"); v != "" {
		n, err := strconv.ParseUint(v, 0, 32)
		if err != nil || n > 0o7777 {
			return o, badRequest("mode %q: want permission bits (0 to 0o7777)", v)
		}
		m := uint32(n)
		o.Mode = &m
	}
	return o, nil
}

func (o owner) apply(root *os.Root, name string) error {
	if o.Mode != nil {
		if *o.Mode > 0o7777 {
			return badRequest("mode %o: want permission bits", *o.Mode)
		}
		if err := root.Chmod(name, fs.FileMode(*o.Mode)&fs.ModePerm|modeBits(*o.Mode)); err != nil {
			return err
		}
	}
	if o.UID != nil || o.GID != nil {
		uid, gid := -1, -1
		if o.UID != nil {
			uid = *o.UID
		}
		if o.GID != nil {
			gid = *o.GID
		}
		if uid < -1 || gid < -1 {
			return badRequest("uid and gid must not be negative")
		}
		if err := root.Lchown(name, uid, gid); err != nil {
			return err
		}
	}
	return nil
}

// modeBits carries setuid, setgid and sticky from permission bits.
func modeBits(m uint32) fs.FileMode {
	var out fs.FileMode
	if m&0o4000 != 0 {
		out |= fs.ModeSetuid
	}
	if m&0o2000 != 0 {
		out |= fs.ModeSetgid
	}
	if m&0o1000 != 0 {
		out |= fs.ModeSticky
	}
	return out
}

func force(r *http.Request) bool {
	v := r.URL.Query().Get("force")
	return v == "true" || v == "1"
}

// makeDir makes a directory (its parents too with force; an existing
// directory with force is no error).
func makeDir(w http.ResponseWriter, r *http.Request, root *os.Root, name string) error {
	if name == "." {
		return badRequest("the volume's root exists")
	}
	o, err := ownerOf(r)
	if err != nil {
		return err
	}
	if force(r) {
		err = root.MkdirAll(name, 0o755)
	} else {
		err = root.Mkdir(name, 0o755)
	}
	if err != nil {
		return err
	}
	if err := o.apply(root, name); err != nil {
		return err
	}
	return writeStat(w, http.StatusCreated, root, name)
}

func update(w http.ResponseWriter, r *http.Request, root *os.Root, name string) error {
	var o owner
	dec := json.NewDecoder(io.LimitReader(r.Body, 1<<16))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&o); err != nil && err != io.EOF {
		return badRequest("body: %v", err)
	}
	if _, err := root.Lstat(name); err != nil {
		return err
	}
	if err := o.apply(root, name); err != nil {
		return err
	}
	return writeStat(w, http.StatusOK, root, name)
}

func remove(w http.ResponseWriter, root *os.Root, name string) error {
	if name == "." {
		return badRequest("the volume's root cannot be removed")
	}
	if _, err := root.Lstat(name); err != nil {
		return err
	}
	if err := root.RemoveAll(name); err != nil {
		return err
	}
	w.WriteHeader(http.StatusNoContent)
	return nil
}

func read(w http.ResponseWriter, root *os.Root, name string) error {
	f, err := root.Open(name)
	if err != nil {
		return err
	}
	defer f.Close()
	fi, err := f.Stat()
	if err != nil {
		return err
	}
	if !fi.Mode().IsRegular() {
		return badRequest("%s is not a file", apiPath(name))
	}
	w.Header().Set("Content-Type", "application/octet-stream")
	w.Header().Set("Content-Length", strconv.FormatInt(fi.Size(), 10))
	w.WriteHeader(http.StatusOK)
	io.Copy(w, f)
	return nil
}

// write writes the body to the file (made, or truncated), through a
// temporary file renamed over it once whole: a failed or cut upload
// leaves the old content.
func write(w http.ResponseWriter, r *http.Request, root *os.Root, name string) error {
	if name == "." {
		return badRequest("the volume's root is a directory")
	}
	o, err := ownerOf(r)
	if err != nil {
		return err
	}
	dir := path.Dir(name)
	if force(r) {
		if err := root.MkdirAll(dir, 0o755); err != nil {
			return err
		}
	}
	if fi, err := root.Lstat(name); err == nil && fi.IsDir() {
		return badRequest("%s is a directory", apiPath(name))
	}
	tmp := path.Join(dir, fmt.Sprintf(".spore-upload-%d", time.Now().UnixNano()))
	f, err := root.OpenFile(tmp, os.O_CREATE|os.O_EXCL|os.O_WRONLY, 0o644)
	if err != nil {
		return err
	}
	_, err = io.Copy(f, r.Body)
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		err = root.Rename(tmp, name)
	}
	if err != nil {
		root.Remove(tmp)
		return err
	}
	if err := o.apply(root, name); err != nil {
		return err
	}
	return writeStat(w, http.StatusOK, root, name)
}

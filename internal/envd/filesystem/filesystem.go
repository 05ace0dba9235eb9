// Package filesystem implements the envd filesystem service: stat, list
// (with depth), make directories, move, remove, and watch directories.
//
// envd runs as root; entries it creates are owned by the request's user.
// Relative paths are relative to that user's home.
package filesystem

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"os"
	"os/user"
	"path/filepath"
	"strconv"
	"sync"
	"syscall"
	"time"

	"connectrpc.com/connect"
	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/spore-run/spore/internal/envd/identity"
	fspb "github.com/spore-run/spore/proto/gen/filesystem"
	"github.com/spore-run/spore/proto/gen/filesystem/filesystempbconnect"
)

// Service implements filesystem.Filesystem.
type Service struct {
	keepalive time.Duration
	log       *slog.Logger

	mu       sync.Mutex
	watchers map[string]*watcher // polling watchers by ID
	nextID   int
}

var _ filesystempbconnect.FilesystemHandler = (*Service)(nil)

// New returns the service.
func New(keepalive time.Duration, log *slog.Logger) *Service {
	return &Service{keepalive: keepalive, log: log, watchers: map[string]*watcher{}}
}

func userOf(ctx context.Context) (identity.User, error) {
	u, ok := identity.FromContext(ctx)
	if !ok {
		return identity.User{}, connect.NewError(connect.CodeUnauthenticated, errors.New("no user resolved for the request"))
	}
	return u, nil
}

func (s *Service) path(ctx context.Context, p string) (identity.User, string, error) {
	u, err := userOf(ctx)
	if err != nil {
		return u, "", err
	}
	if p == "" {
		return u, "", connect.NewError(connect.CodeInvalidArgument, errors.New("path is required"))
	}
	return u, identity.Resolve(u, p), nil
}

// FSError maps a filesystem error to the protocol's codes.
func FSError(op, path string, err error) error {
	switch {
	case errors.Is(err, fs.ErrNotExist):
		return connect.NewError(connect.CodeNotFound, fmt.Errorf("%s %s: no such file or directory", op, path))
	case errors.Is(err, fs.ErrExist):
		return connect.NewError(connect.CodeAlreadyExists, fmt.Errorf("%s %s: already exists", op, path))
	case errors.Is(err, fs.ErrPermission):
		return connect.NewError(connect.CodePermissionDenied, fmt.Errorf("%s %s: permission denied", op, path))
	case errors.Is(err, syscall.ENOSPC):
		return connect.NewError(connect.CodeResourceExhausted, fmt.Errorf("%s %s: no space left on device", op, path))
	case errors.Is(err, syscall.ENOTDIR), errors.Is(err, syscall.EISDIR), errors.Is(err, syscall.ENOTEMPTY), errors.Is(err, syscall.EINVAL):
		return connect.NewError(connect.CodeInvalidArgument, fmt.Errorf("%s %s: %v", op, path, unwrapErrno(err)))
	default:
		return connect.NewError(connect.CodeInternal, fmt.Errorf("%s %s: %v", op, path, err))
	}
}

func unwrapErrno(err error) error {
	var errno syscall.Errno
	if errors.As(err, &errno) {
		return errno
	}
	return err
}

// Entry describes path (without following a final symlink).
func Entry(path string) (*fspb.EntryInfo, error) {
	st, err := os.Lstat(path)
	if err != nil {
		return nil, err
	}
	return entryOf(path, st), nil
}

func entryOf(path string, st fs.FileInfo) *fspb.EntryInfo {
	e := &fspb.EntryInfo{
		Name:         filepath.Base(path),
		Path:         path,
		Size:         st.Size(),
		Mode:         uint32(st.Mode().Perm()),
		Permissions:  st.Mode().String(),
		ModifiedTime: timestamppb.New(st.ModTime()),
		Type:         fspb.FileType_FILE_TYPE_FILE,
	}
	switch {
	case st.IsDir():
		e.Type = fspb.FileType_FILE_TYPE_DIRECTORY
	case st.Mode()&fs.ModeSymlink != 0:
		e.Type = fspb.FileType_FILE_TYPE_SYMLINK
		if t, err := os.Readlink(path); err == nil {
			e.SymlinkTarget = &t
		}
	}
	if sys, ok := st.Sys().(*syscall.Stat_t); ok {
		e.Owner = nameOfUID(sys.Uid)
		e.Group = nameOfGID(sys.Gid)
	}
	return e
}

func nameOfUID(uid uint32) string {
	if u, err := user.LookupId(strconv.Itoa(int(uid))); err == nil {
		return u.Username
	}
	return strconv.Itoa(int(uid))
}

func nameOfGID(gid uint32) string {
	if g, err := user.LookupGroupId(strconv.Itoa(int(gid))); err == nil {
		return g.Name
	}
	return strconv.Itoa(int(gid))
}

// Stat implements the Stat RPC.
func (s *Service) Stat(ctx context.Context, req *connect.Request[fspb.StatRequest]) (*connect.Response[fspb.StatResponse], error) {
	_, p, err := s.path(ctx, req.Msg.GetPath())
	if err != nil {
		return nil, err
	}
	e, err := Entry(p)
	if err != nil {
		return nil, FSError("stat", p, err)
	}
	return connect.NewResponse(&fspb.StatResponse{Entry: e}), nil
}

// ListDir implements the ListDir RPC. Depth 0 and 1 list the directory's
// own entries; depth n descends n levels.
func (s *Service) ListDir(ctx context.Context, req *connect.Request[fspb.ListDirRequest]) (*connect.Response[fspb.ListDirResponse], error) {
	_, p, err := s.path(ctx, req.Msg.GetPath())
	if err != nil {
		return nil, err
	}
	depth := int(req.Msg.GetDepth())
	if depth < 1 {
		depth = 1
	}
	// Follow a symlink given as the directory itself.
	root, err := filepath.EvalSymlinks(p)
	if err != nil {
		return nil, FSError("list", p, err)
	}
	st, err := os.Stat(root)
	if err != nil {
		return nil, FSError("list", p, err)
	}
	if !st.IsDir() {
		return nil, connect.NewError(connect.CodeInvalidArgument, fmt.Errorf("list %s: not a directory", p))
	}
	var entries []*fspb.EntryInfo
	var walk func(dir, shown string, level int) error
	walk = func(dir, shown string, level int) error {
		ents, err := os.ReadDir(dir)
		if err != nil {
			return err
		}
		for _, d := range ents {
			info, err := d.Info()
			if err != nil {
				continue // removed meanwhile
			}
			full := filepath.Join(dir, d.Name())
			e := entryOf(full, info)
			e.Path = filepath.Join(shown, d.Name())
			entries = append(entries, e)
			if d.IsDir() && level < depth {
				if err := walk(full, e.Path, level+1); err != nil {
					return err
				}
			}
		}
		return nil
	}
	if err := walk(root, p, 1); err != nil {
		return nil, FSError("list", p, err)
	}
	return connect.NewResponse(&fspb.ListDirResponse{Entries: entries}), nil
}

// MakeDir implements the MakeDir RPC: creates the directory and missing
// parents, owned by the user; already_exists when it exists.
func (s *Service) MakeDir(ctx context.Context, req *connect.Request[fspb.MakeDirRequest]) (*connect.Response[fspb.MakeDirResponse], error) {
	u, p, err := s.path(ctx, req.Msg.GetPath())
	if err != nil {
		return nil, err
	}
	if st, err := os.Stat(p); err == nil {
		if st.IsDir() {
			return nil, connect.NewError(connect.CodeAlreadyExists, fmt.Errorf("directory %s already exists", p))
		}
		return nil, connect.NewError(connect.CodeInvalidArgument, fmt.Errorf("%s exists and is not a directory", p))
	}
	if err := MkdirAllOwned(p, u); err != nil {
		return nil, FSError("mkdir", p, err)
	}
	e, err := Entry(p)
	if err != nil {
		return nil, FSError("mkdir", p, err)
	}
	return connect.NewResponse(&fspb.MakeDirResponse{Entry: e}), nil
}

// MkdirAllOwned creates p and its missing parents, owned by u.
func MkdirAllOwned(p string, u identity.User) error {
	var missing []string
	for d := p; d != "/" && d != "."; d = filepath.Dir(d) {
		if _, err := os.Lstat(d); err == nil {
			break
		}
		missing = append(missing, d)
	}
	for i := len(missing) - 1; i >= 0; i-- {
		if err := os.Mkdir(missing[i], 0o755); err != nil && !errors.Is(err, fs.ErrExist) {
			return err
		}
		os.Lchown(missing[i], int(u.UID), int(u.GID))
	}
	return nil
}

// Move implements the Move RPC (rename; creates the destination's parent).
func (s *Service) Move(ctx context.Context, req *connect.Request[fspb.MoveRequest]) (*connect.Response[fspb.MoveResponse], error) {
	u, src, err := s.path(ctx, req.Msg.GetSource())
	if err != nil {
		return nil, err
	}
	_, dst, err := s.path(ctx, req.Msg.GetDestination())
	if err != nil {
		return nil, err
	}
	if _, err := os.Lstat(src); err != nil {
		return nil, FSError("move", src, err)
	}
	if err := MkdirAllOwned(filepath.Dir(dst), u); err != nil {
		return nil, FSError("move", dst, err)
	}
	if err := os.Rename(src, dst); err != nil {
		return nil, FSError("move", src, err)
	}
	e, err := Entry(dst)
	if err != nil {
		return nil, FSError("move", dst, err)
	}
	return connect.NewResponse(&fspb.MoveResponse{Entry: e}), nil
}

// Remove implements the Remove RPC (files and whole directories).
func (s *Service) Remove(ctx context.Context, req *connect.Request[fspb.RemoveRequest]) (*connect.Response[fspb.RemoveResponse], error) {
	_, p, err := s.path(ctx, req.Msg.GetPath())
	if err != nil {
		return nil, err
	}
	if p == "/" {
		return nil, connect.NewError(connect.CodeInvalidArgument, errors.New("refusing to remove /"))
	}
	if _, err := os.Lstat(p); err != nil {
		return nil, FSError("remove", p, err)
	}
	if err := os.RemoveAll(p); err != nil {
		return nil, FSError("remove", p, err)
	}
	return connect.NewResponse(&fspb.RemoveResponse{}), nil
}

package filesystem

import (
	"context"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strconv"
	"sync"
	"time"

	"connectrpc.com/connect"
	"github.com/fsnotify/fsnotify"

	fspb "github.com/spore-run/spore/proto/gen/filesystem"
)

// watcher follows one directory (and, when recursive, every directory
// created below it) with inotify and turns its events into protocol events.
type watcher struct {
	root      string
	recursive bool
	entries   bool
	w         *fsnotify.Watcher

	mu      sync.Mutex
	pending []*fspb.FilesystemEvent // polling watchers buffer here
	closed  bool
}

const maxPending = 10000

func newWatcher(root string, recursive, entries bool) (*watcher, error) {
	st, err := os.Stat(root)
	if err != nil {
		return nil, FSError("watch", root, err)
	}
	if !st.IsDir() {
		return nil, connect.NewError(connect.CodeInvalidArgument, fmt.Errorf("watch %s: not a directory", root))
	}
	fw, err := fsnotify.NewWatcher()
	if err != nil {
		return nil, connect.NewError(connect.CodeInternal, fmt.Errorf("watch %s: %w", root, err))
	}
	w := &watcher{root: root, recursive: recursive, entries: entries, w: fw}
	if err := w.add(root); err != nil {
		fw.Close()
		return nil, FSError("watch", root, err)
	}
	return w, nil
}

// add watches dir, and every directory below it when recursive.
func (w *watcher) add(dir string) error {
	if !w.recursive {
		return w.w.Add(dir)
	}
	return filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			if p == dir {
				return err
			}
			return nil
		}
		if d.IsDir() {
			return w.w.Add(p)
		}
		return nil
	})
}

// convert turns an inotify event into zero or more protocol events.
func (w *watcher) convert(ev fsnotify.Event) []*fspb.FilesystemEvent {
	rel, err := filepath.Rel(w.root, ev.Name)
	if err != nil {
		rel = ev.Name
	}
	var out []*fspb.FilesystemEvent
	emit := func(t fspb.EventType) {
		fe := &fspb.FilesystemEvent{Name: rel, Type: t}
		if w.entries && t != fspb.EventType_EVENT_TYPE_REMOVE && t != fspb.EventType_EVENT_TYPE_RENAME {
			if e, err := Entry(ev.Name); err == nil {
				fe.Entry = e
			}
		}
		out = append(out, fe)
	}
	if ev.Has(fsnotify.Create) {
		emit(fspb.EventType_EVENT_TYPE_CREATE)
		if w.recursive {
			if st, err := os.Lstat(ev.Name); err == nil && st.IsDir() {
				w.add(ev.Name)
			}
		}
	}
	if ev.Has(fsnotify.Write) {
		emit(fspb.EventType_EVENT_TYPE_WRITE)
	}
	if ev.Has(fsnotify.Remove) {
		emit(fspb.EventType_EVENT_TYPE_REMOVE)
	}
	if ev.Has(fsnotify.Rename) {
		emit(fspb.EventType_EVENT_TYPE_RENAME)
	}
	if ev.Has(fsnotify.Chmod) {
		emit(fspb.EventType_EVENT_TYPE_CHMOD)
	}
	return out
}

func (w *watcher) close() {
	w.mu.Lock()
	defer w.mu.Unlock()
	if !w.closed {
		w.closed = true
		w.w.Close()
	}
}

// WatchDir implements the WatchDir RPC: a start event, then events as they
// happen, with keepalives, until the client leaves.
func (s *Service) WatchDir(ctx context.Context, req *connect.Request[fspb.WatchDirRequest], stream *connect.ServerStream[fspb.WatchDirResponse]) error {
	_, p, err := s.path(ctx, req.Msg.GetPath())
	if err != nil {
		return err
	}
	w, err := newWatcher(p, req.Msg.GetRecursive(), req.Msg.GetIncludeEntry())
	if err != nil {
		return err
	}
	defer w.close()
	if err := stream.Send(&fspb.WatchDirResponse{Event: &fspb.WatchDirResponse_Start{Start: &fspb.WatchDirResponse_StartEvent{}}}); err != nil {
		return err
	}
	tick := time.NewTicker(s.keepalive)
	defer tick.Stop()
	for {
		select {
		case ev, ok := <-w.w.Events:
			if !ok {
				return nil
			}
			for _, fe := range w.convert(ev) {
				if err := stream.Send(&fspb.WatchDirResponse{Event: &fspb.WatchDirResponse_Filesystem{Filesystem: fe}}); err != nil {
					return err
				}
			}
		case err, ok := <-w.w.Errors:
			if !ok {
				return nil
			}
			return connect.NewError(connect.CodeInternal, fmt.Errorf("watch %s: %w", p, err))
		case <-tick.C:
			if err := stream.Send(&fspb.WatchDirResponse{Event: &fspb.WatchDirResponse_Keepalive{Keepalive: &fspb.WatchDirResponse_KeepAlive{}}}); err != nil {
				return err
			}
		case <-ctx.Done():
			return nil
		}
	}
}

// CreateWatcher implements the CreateWatcher RPC: a watcher whose events
// are fetched with GetWatcherEvents.
func (s *Service) CreateWatcher(ctx context.Context, req *connect.Request[fspb.CreateWatcherRequest]) (*connect.Response[fspb.CreateWatcherResponse], error) {
	_, p, err := s.path(ctx, req.Msg.GetPath())
	if err != nil {
		return nil, err
	}
	w, err := newWatcher(p, req.Msg.GetRecursive(), req.Msg.GetIncludeEntry())
	if err != nil {
		return nil, err
	}
	s.mu.Lock()
	s.nextID++
	id := "w" + strconv.Itoa(s.nextID)
	s.watchers[id] = w
	s.mu.Unlock()
	go func() {
		for {
			select {
			case ev, ok := <-w.w.Events:
				if !ok {
					return
				}
				evs := w.convert(ev)
				w.mu.Lock()
				if len(w.pending)+len(evs) <= maxPending {
					w.pending = append(w.pending, evs...)
				}
				w.mu.Unlock()
			case _, ok := <-w.w.Errors:
				if !ok {
					return
				}
			}
		}
	}()
	return connect.NewResponse(&fspb.CreateWatcherResponse{WatcherId: id}), nil
}

func (s *Service) watcher(id string) (*watcher, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	w, ok := s.watchers[id]
	if !ok {
		return nil, connect.NewError(connect.CodeNotFound, fmt.Errorf("watcher %q not found", id))
	}
	return w, nil
}

// GetWatcherEvents implements the GetWatcherEvents RPC: the events since
// the last call.
func (s *Service) GetWatcherEvents(ctx context.Context, req *connect.Request[fspb.GetWatcherEventsRequest]) (*connect.Response[fspb.GetWatcherEventsResponse], error) {
	w, err := s.watcher(req.Msg.GetWatcherId())
	if err != nil {
		return nil, err
	}
	w.mu.Lock()
	evs := w.pending
	w.pending = nil
	w.mu.Unlock()
	return connect.NewResponse(&fspb.GetWatcherEventsResponse{Events: evs}), nil
}

// RemoveWatcher implements the RemoveWatcher RPC.
func (s *Service) RemoveWatcher(ctx context.Context, req *connect.Request[fspb.RemoveWatcherRequest]) (*connect.Response[fspb.RemoveWatcherResponse], error) {
	w, err := s.watcher(req.Msg.GetWatcherId())
	if err != nil {
		return nil, err
	}
	s.mu.Lock()
	delete(s.watchers, req.Msg.GetWatcherId())
	s.mu.Unlock()
	w.close()
	return connect.NewResponse(&fspb.RemoveWatcherResponse{}), nil
}

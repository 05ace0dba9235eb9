package server

import (
	"context"
	"log/slog"
	"net/http"
	"sync/atomic"

	"github.com/spore-run/spore/internal/blob"
	"github.com/spore-run/spore/internal/blob/blobconf"
	"github.com/spore-run/spore/internal/build"
	"github.com/spore-run/spore/internal/control"
	"github.com/spore-run/spore/internal/store"
)

// builds is an API server's template build service. Build sandboxes'
// daemons are reached through this server's own sandbox proxy, at the
// address it listens on (set once listening).
type builds struct {
	*build.Service
	addr atomic.Pointer[string]
}

// newBuilds opens the blob store uploads go to ("" or "none": none, and
// COPY steps are refused) and returns the build service.
func newBuilds(ctx context.Context, ctl *control.Service, st store.Store, blobStore, holder string, log *slog.Logger) (*builds, error) {
	var blobs blob.Store
	if blobStore != "" && blobStore != "none" {
		var err error
		if blobs, err = blobconf.Open(ctx, blobStore); err != nil {
			return nil, err
		}
	}
	b := &builds{}
	p := &build.Control{C: ctl, Blobs: blobs, HTTP: &http.Client{}, Base: func() string {
		if a := b.addr.Load(); a != nil {
			return "http://" + *a
		}
		return ""
	}}
	b.Service = &build.Service{St: st, Blobs: blobs, Builder: &build.Builder{P: p, Log: log}, Holder: holder, Log: log}
	return b, nil
}

// listening records the address build sandboxes are reached through.
func (b *builds) listening(addr string) { b.addr.Store(&addr) }

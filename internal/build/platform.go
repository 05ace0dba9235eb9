package build

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"time"

	"github.com/spore-run/spore/internal/blob"
	"github.com/spore-run/spore/internal/control"
	"github.com/spore-run/spore/internal/errdefs"
	"github.com/spore-run/spore/internal/nodeapi"
)

// Control is the Platform of a Spore API replica: sandboxes and snapshots
// through its control plane, build sandboxes' daemons through its own
// sandbox proxy (Base), uploaded files in the blob store.
type Control struct {
	C     *control.Service
	Blobs blob.Store // nil: no uploads (COPY steps fail)
	// Base returns the address this replica serves on (its proxy).
	Base func() string
	HTTP *http.Client
}

// FilesKey is where the archive uploaded under hash is in the blob store.
// Content-addressed by the SDK's hash of the files (not of the archive),
// shared by every template.
func FilesKey(hash string) string { return "template-files/" + hash }

// ImageName is the template an image base is kept as: one per reference
// and registry identity (user name, or GCP service account).
func ImageName(ref string, reg *Registry) string {
	return "image-" + key(ref, reg.identity())[:16]
}

func (p *Control) ImageBase(ctx context.Context, ref string, reg *Registry, force bool) (string, error) {
	name := ImageName(ref, reg)
	if !force {
		if _, err := p.C.ResolveStored(ctx, "", name); err == nil { // BuildImage stored its row (a template)
			return name, nil
		} else if !errdefs.IsNotFound(err) {
			return "", err
		}
	}
	req := nodeapi.ImageBuildRequest{Name: name, Ref: ref}
	req.Username, req.Password = reg.Credentials()
	if _, err := p.C.BuildImage(ctx, req); err != nil {
		return "", err
	}
	return name, nil
}

func (p *Control) Resolve(ctx context.Context, team, ref string) (string, error) {
	return p.C.Resolve(ctx, team, ref)
}

func (p *Control) Cached(ctx context.Context, team, name string) (string, error) {
	return p.C.ResolveStored(ctx, team, name)
}

func (p *Control) Start(ctx context.Context, team, ref string, size Size) (Sandbox, error) {
	sb, err := p.C.Create(ctx, control.CreateRequest{TeamID: team, TemplateID: ref, Timeout: 2 * time.Hour,
		Metadata: map[string]string{"spore.build": "true"}, CPUCount: size.CPUCount, MemoryMB: size.MemoryMB})
	if err != nil {
		return nil, err
	}
	return &Remote{HTTP: p.HTTP, Base: p.Base(), SID: sb.ID, Token: sb.EnvdAccessToken}, nil
}

func (p *Control) Snapshot(ctx context.Context, id, name string, template bool) (string, error) {
	sn, err := p.C.Snapshot(ctx, id, name, template)
	if err != nil {
		return "", err
	}
	return sn.ID, nil
}

func (p *Control) DeleteSnapshot(ctx context.Context, team, ref string) error {
	// The team's snapshot by its ID: the store holds its names.
	sn, err := p.C.GetSnapshot(ctx, team, ref)
	if err != nil {
		return err
	}
	ref = sn.ID
	return p.C.DeleteSnapshot(ctx, ref)
}

func (p *Control) Kill(ctx context.Context, id string) error { return p.C.Kill(ctx, id) }

func (p *Control) Files(ctx context.Context, _ string, hash string) (io.ReadCloser, error) {
	if p.Blobs == nil {
		return nil, fmt.Errorf("%w: this server has no blob store for uploaded files", errdefs.ErrConflict)
	}
	return p.Blobs.Get(ctx, FilesKey(hash))
}

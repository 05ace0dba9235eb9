package nodetest

import (
	"strings"
	"testing"

	"github.com/spore-run/spore/internal/errdefs"
	"github.com/spore-run/spore/internal/ids"
	"github.com/spore-run/spore/internal/nodeapi"
)

// testExport: malformed requests are InvalidArgument on every node; a
// node without Images answers Conflict. With Images: a sandbox's change
// exported to the registry builds a template whose sandboxes have it;
// an unknown sandbox is NotFound, an unlisted plain-HTTP registry
// InvalidArgument.
func testExport(t *testing.T, s *suite) {
	ctx := s.ctx
	id := ids.New('i')
	good := "registry.invalid/app:v1"
	if s.Images != nil {
		good = retag(s.Images.Ref, "exported")
	}
	for what, req := range map[string]nodeapi.ExportRequest{
		"no sandbox":            {Ref: good},
		"malformed sandbox ID":  {SandboxID: "Bad/ID", Ref: good},
		"neither ref nor dir":   {SandboxID: id},
		"both ref and dir":      {SandboxID: id, Ref: good, LayoutDir: "/tmp/x"},
		"ref and blob key":      {SandboxID: id, Ref: good, BlobKey: "exports/x.tar"},
		"malformed blob key":    {SandboxID: id, BlobKey: "../x.tar"},
		"malformed ref":         {SandboxID: id, Ref: "registry.invalid/App::v1"},
		"username, no password": {SandboxID: id, Ref: good, Username: "u"},
	} {
		_, err := s.n.Export(ctx, req)
		wantKind(t, "export with "+what, err, errdefs.ErrInvalidArgument)
	}
	if s.Images == nil {
		_, err := s.n.Export(ctx, nodeapi.ExportRequest{SandboxID: id, Ref: good})
		wantKind(t, "export on a node that exports none", err, errdefs.ErrConflict)
		return
	}
	im := s.Images
	_, err := s.n.Export(ctx, nodeapi.ExportRequest{SandboxID: id, Ref: good, Username: im.User, Password: im.Pass})
	wantKind(t, "export of an unknown sandbox", err, errdefs.ErrNotFound)

	name := "img-" + strings.ToLower(ids.New('t')[:8])
	src := s.buildImage(nodeapi.ImageBuildRequest{Name: name, Ref: im.Ref, Username: im.User, Password: im.Pass})
	sb := s.create(nodeapi.CreateRequest{Template: src.Names[0]})
	if _, err := im.Shell(ctx, sb, `echo exported > /srv/work/mine.txt`); err != nil {
		t.Fatal(err)
	}
	_, err = s.n.Export(ctx, nodeapi.ExportRequest{SandboxID: sb.ID, Ref: retag(im.Unlisted, "exported")})
	wantKind(t, "export to an unlisted plain-HTTP registry", err, errdefs.ErrInvalidArgument)
	info, err := s.n.Export(ctx, nodeapi.ExportRequest{SandboxID: sb.ID, Ref: good, Username: im.User, Password: im.Pass})
	if err != nil || info.Layers != 2 || !strings.HasPrefix(info.Digest, "sha256:") || info.Changed == 0 {
		t.Fatalf("export %s: %+v, %v", sb.ID, info, err)
	}
	again := s.buildImage(nodeapi.ImageBuildRequest{Name: name + "-x", Ref: good, Username: im.User, Password: im.Pass})
	sb2 := s.create(nodeapi.CreateRequest{Template: again.Names[0]})
	out, err := im.Shell(ctx, sb2, `id -un; pwd; echo "$GREETING"; cat /srv/work/mine.txt /data/new.txt`)
	if want := "app\n/srv/work\nhello from the image\nexported\nadded by layer 2\n"; err != nil || out != want {
		t.Fatalf("in a sandbox of the exported image: %q, %v; want %q", out, err, want)
	}
}

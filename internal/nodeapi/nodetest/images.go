package nodetest

import (
	"context"
	"slices"
	"strings"
	"testing"

	"github.com/spore-run/spore/internal/errdefs"
	"github.com/spore-run/spore/internal/ids"
	"github.com/spore-run/spore/internal/nodeapi"
)

// Images is what the suite needs to build templates from OCI images on a
// node that can (one with its engine's network and the in-sandbox daemon).
type Images struct {
	// Ref is testenv.BusyboxImage in a plain-HTTP registry the node lists
	// as insecure, requiring basic auth User/Pass.
	Ref        string
	User, Pass string
	// Unlisted is the same image in a plain-HTTP registry the node does
	// not list.
	Unlisted string
	// Down is a reference to a registry the node lists whose port answers
	// nothing.
	Down string
	// Shell runs a shell script in a sandbox (through its daemon, as the
	// sandbox's default user) and returns its output.
	Shell func(ctx context.Context, sb nodeapi.Sandbox, script string) (string, error)
}

// testBuildImage: malformed requests are InvalidArgument on every node;
// a node without Images answers Conflict. With Images: the template is
// built and listed as GetSnapshot, Snapshots and Info show it, a sandbox
// made from it runs the image's commands with its defaults, a rebuild
// replaces it; unknown tags are NotFound, refused credentials and an
// unlisted plain-HTTP registry InvalidArgument, an unreachable registry
// Unavailable.
func testBuildImage(t *testing.T, s *suite) {
	ctx := s.ctx
	name := "img-" + strings.ToLower(ids.New('t')[:8])
	good := "registry.invalid/app:v1"
	if s.Images != nil {
		good = s.Images.Ref
	}
	for what, req := range map[string]nodeapi.ImageBuildRequest{
		"no name":               {Ref: good},
		"malformed name":        {Name: "Bad/Name", Ref: good},
		"no ref":                {Name: name},
		"malformed ref":         {Name: name, Ref: "registry.invalid/App::v1"},
		"username, no password": {Name: name, Ref: good, Username: "u"},
		"password, no username": {Name: name, Ref: good, Password: "p"},
	} {
		_, err := s.n.BuildImage(ctx, req)
		wantKind(t, "build image with "+what, err, errdefs.ErrInvalidArgument)
	}
	if s.Images == nil {
		_, err := s.n.BuildImage(ctx, nodeapi.ImageBuildRequest{Name: name, Ref: good})
		wantKind(t, "build image on a node that builds none", err, errdefs.ErrConflict)
		return
	}
	im := s.Images
	auth := func(req nodeapi.ImageBuildRequest) nodeapi.ImageBuildRequest {
		req.Username, req.Password = im.User, im.Pass
		return req
	}
	for _, c := range []struct {
		what string
		req  nodeapi.ImageBuildRequest
		kind error
		says string
	}{
		{"an unknown tag", auth(nodeapi.ImageBuildRequest{Name: name, Ref: retag(im.Ref, "nope")}), errdefs.ErrNotFound, ""},
		{"no credentials", nodeapi.ImageBuildRequest{Name: name, Ref: im.Ref}, errdefs.ErrInvalidArgument, "credentials"},
		{"wrong credentials", nodeapi.ImageBuildRequest{Name: name, Ref: im.Ref, Username: im.User, Password: im.Pass + "x"}, errdefs.ErrInvalidArgument, "credentials"},
		{"an unlisted plain-HTTP registry", nodeapi.ImageBuildRequest{Name: name, Ref: im.Unlisted}, errdefs.ErrInvalidArgument, "--insecure-registry"},
		{"an unreachable registry", nodeapi.ImageBuildRequest{Name: name, Ref: im.Down}, errdefs.ErrUnavailable, ""},
		{"an unknown platform", auth(nodeapi.ImageBuildRequest{Name: name, Ref: im.Ref, Platform: "linux/s390x"}), errdefs.ErrNotFound, ""},
	} {
		_, err := s.n.BuildImage(ctx, c.req)
		wantKind(t, "build image from "+c.what, err, c.kind)
		if err != nil && !strings.Contains(err.Error(), c.says) {
			t.Errorf("build image from %s: %q does not say %q", c.what, err, c.says)
		}
		t.Logf("%s: %v", c.what, err)
		if _, err := s.n.GetSnapshot(ctx, name); !errdefs.IsNotFound(err) {
			t.Fatalf("a failed build (%s) left template %s: %v", c.what, name, err)
		}
	}

	info := s.buildImage(auth(nodeapi.ImageBuildRequest{Name: name, Ref: im.Ref}))
	if info.ID == "" || !slices.Equal(info.Names, []string{name}) || info.Kind != nodeapi.KindTemplate || info.Template != name ||
		info.CreatedAt.IsZero() || info.SizeBytes <= 0 || info.Origin != "" {
		t.Fatalf("built template = %+v, want kind template named %s with an ID, a time and a size", info, name)
	}
	got, err := s.n.GetSnapshot(ctx, name)
	if err != nil || got.ID != info.ID || got.Kind != info.Kind || !got.CreatedAt.Equal(info.CreatedAt) || got.SizeBytes != info.SizeBytes {
		t.Fatalf("get snapshot %s = %+v, %v; the build said %+v", name, got, err, info)
	}
	list, err := s.n.Snapshots(ctx)
	if err != nil || !slices.ContainsFunc(list, func(m nodeapi.SnapshotInfo) bool { return m.ID == info.ID && m.Kind == nodeapi.KindTemplate }) {
		t.Fatalf("snapshots (%v) do not list template %s", err, info.ID)
	}
	if ni, err := s.n.Info(ctx); err != nil || !slices.Contains(ni.Templates, name) {
		t.Fatalf("info lists templates %v (%v), not %s", ni.Templates, err, name)
	}
	sb := s.create(nodeapi.CreateRequest{Template: name})
	out, err := im.Shell(ctx, sb, `id -un; pwd; echo "$GREETING"; cat /data/new.txt`)
	if want := "app\n/srv/work\nhello from the image\nadded by layer 2\n"; err != nil || out != want {
		t.Fatalf("in a sandbox of %s: %q, %v; want %q", name, out, err, want)
	}

	// A rebuild under the name replaces the template (as a snapshot
	// taken as a template does); the old one is gone.
	again := s.buildImage(auth(nodeapi.ImageBuildRequest{Name: name, Ref: im.Ref}))
	if again.ID == info.ID {
		t.Fatalf("the rebuild kept ID %s", info.ID)
	}
	if got, err := s.n.GetSnapshot(ctx, name); err != nil || got.ID != again.ID {
		t.Fatalf("after the rebuild %s is %+v, %v; want %s", name, got, err, again.ID)
	}
	if _, err := s.n.GetSnapshot(ctx, info.ID); !errdefs.IsNotFound(err) {
		t.Errorf("the replaced template %s: %v, want not found", info.ID, err)
	}
}

func (s *suite) buildImage(req nodeapi.ImageBuildRequest) nodeapi.SnapshotInfo {
	s.t.Helper()
	info, err := s.n.BuildImage(s.ctx, req)
	if err != nil {
		s.t.Fatalf("build template %s from %s: %v", req.Name, req.Ref, err)
	}
	s.trackSnap(info.ID)
	return info
}

// retag is ref ("host/repo:tag") with another tag.
func retag(ref, tag string) string {
	return ref[:strings.LastIndex(ref, ":")+1] + tag
}

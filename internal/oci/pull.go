package oci

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"slices"
	"strings"

	"github.com/google/go-containerregistry/pkg/authn"
	"github.com/google/go-containerregistry/pkg/name"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/remote"
	"github.com/google/go-containerregistry/pkg/v1/remote/transport"

	"github.com/spore-run/spore/internal/errdefs"
)

// DefaultPlatform is the platform pulled from a multi-platform index when
// Options.Platform is empty.
const DefaultPlatform = "linux/amd64"

// ErrUnauthorized marks a registry refusing the request's credentials (or
// their absence). It comes wrapped together with errdefs.ErrInvalidArgument:
// the caller supplied the credentials, so it is theirs to fix.
var ErrUnauthorized = errors.New("registry refused the credentials")

// Options say how to reach the registry. The zero value pulls anonymously
// over HTTPS, for linux/amd64. The host's Docker configuration
// (~/.docker/config.json, credential helpers: authn.DefaultKeychain) is
// never read: a node must not lend its own credentials to whoever names
// an image.
type Options struct {
	// Username and Password: basic credentials (also used to obtain a
	// token when the registry asks for bearer auth).
	Username, Password string
	// Token: a bearer token sent as is. Exclusive with Username/Password.
	Token string
	// Keychain gives credentials for the registry when none of the above
	// are set (a node's operator-configured ones); nil: anonymous.
	Keychain authn.Keychain
	// Platform: "os/arch[/variant]" selected from a multi-platform index.
	Platform string
	// Insecure allows plain-HTTP registries (tests, a registry on the
	// host). Without it a registry that answers only over HTTP is refused,
	// even on localhost.
	Insecure bool
	// Transport is the base HTTP transport (nil: http.DefaultTransport,
	// which connects anywhere; a node passes a Floor's Transport).
	Transport http.RoundTripper
}

// Image is a pulled image: a v1.Image for one platform plus where it came
// from. Its layers are fetched lazily, by Unpack.
type Image struct {
	v1.Image
	// Ref is the reference as resolved ("registry/repo:tag" or "@digest").
	// Image.Digest() is the manifest digest of the platform image (for a
	// multi-platform index, the child's digest, not the index's).
	Ref string
	// Platform is the platform of the image ("linux/amd64"), from the index
	// entry or the image configuration; empty when neither says.
	Platform string
}

// Pull resolves ref (by tag or by digest) and returns the image for the
// wanted platform after fetching its manifest and configuration. Layers
// are not downloaded here. ctx bounds every fetch of this image, including
// the layer blobs Unpack reads later: keep it alive while the image is used.
//
// Errors: a malformed reference is errdefs.ErrInvalidArgument; an unknown
// repository, tag, digest or platform is errdefs.ErrNotFound; refused
// credentials are ErrUnauthorized (and ErrInvalidArgument); a connection
// the transport's Floor refused is ErrFloor (and ErrInvalidArgument); an
// unreachable or failing registry is errdefs.ErrUnavailable.
func Pull(ctx context.Context, ref string, o Options) (*Image, error) {
	want, err := parsePlatform(o.Platform)
	if err != nil {
		return nil, err
	}
	var nopts []name.Option
	if o.Insecure {
		nopts = append(nopts, name.Insecure)
	}
	r, err := name.ParseReference(ref, nopts...)
	if err != nil {
		return nil, errdefs.Invalidf("image reference %q: %v", ref, err)
	}
	ropts, err := remoteOptions(ctx, o, want)
	if err != nil {
		return nil, err
	}
	desc, err := remote.Get(r, ropts...)
	if err != nil {
		return nil, classify(ctx, r.String(), err)
	}
	img := &Image{Ref: r.String()}
	switch {
	case desc.MediaType.IsIndex():
		idx, err := desc.ImageIndex()
		if err != nil {
			return nil, classify(ctx, r.String(), err)
		}
		child, err := selectPlatform(idx, want, r.String())
		if err != nil {
			return nil, err
		}
		if img.Image, err = idx.Image(child.Digest); err != nil {
			return nil, classify(ctx, r.String(), err)
		}
		if child.Platform != nil {
			img.Platform = child.Platform.String()
		}
	case desc.MediaType.IsImage():
		if img.Image, err = desc.Image(); err != nil {
			return nil, classify(ctx, r.String(), err)
		}
	default:
		return nil, errdefs.Invalidf("%s is not an image (media type %s)", r, desc.MediaType)
	}
	// The configuration is small; fetching it now surfaces a broken image
	// at pull time and gives Store its key without another round trip.
	cfg, err := img.ConfigFile()
	if err != nil {
		return nil, classify(ctx, r.String(), err)
	}
	if cfg.OS != "" || cfg.Architecture != "" {
		got := v1.Platform{OS: cfg.OS, Architecture: cfg.Architecture, Variant: cfg.Variant}
		// A single-platform image for another platform is as absent as a
		// missing index entry; an unlabelled configuration is accepted.
		if !platformMatches(got, want) {
			return nil, errdefs.NotFoundf("%s is %s, not %s", r, got.String(), want.String())
		}
		if img.Platform == "" {
			img.Platform = got.String()
		}
	}
	return img, nil
}

func parsePlatform(s string) (v1.Platform, error) {
	if s == "" {
		s = DefaultPlatform
	}
	p, err := v1.ParsePlatform(s)
	if err != nil || p.OS == "" || p.Architecture == "" {
		return v1.Platform{}, errdefs.Invalidf("platform %q: want os/arch[/variant]", s)
	}
	return *p, nil
}

func remoteOptions(ctx context.Context, o Options, want v1.Platform) ([]remote.Option, error) {
	base := o.Transport
	if base == nil {
		base = http.DefaultTransport
	}
	opts := []remote.Option{
		remote.WithContext(ctx),
		remote.WithPlatform(want),
		remote.WithTransport(schemeGuard{base: base, insecure: o.Insecure}),
		remote.WithUserAgent("spore"),
	}
	switch {
	case o.Token != "" && (o.Username != "" || o.Password != ""):
		return nil, errdefs.Invalidf("registry auth: give a token or a username and password, not both")
	case o.Token != "":
		opts = append(opts, remote.WithAuth(&authn.Bearer{Token: o.Token}))
	case o.Username != "" || o.Password != "":
		opts = append(opts, remote.WithAuth(&authn.Basic{Username: o.Username, Password: o.Password}))
	case o.Keychain != nil:
		opts = append(opts, remote.WithAuthFromKeychain(o.Keychain))
	default:
		opts = append(opts, remote.WithAuth(authn.Anonymous))
	}
	return opts, nil
}

// ErrPlainHTTP is returned by schemeGuard; classify turns it into a clear
// ErrInvalidArgument.
var ErrPlainHTTP = errors.New("registry is reachable only over plain HTTP; allowed only with Options.Insecure")

// schemeGuard refuses plain-HTTP requests unless the caller allowed them:
// go-containerregistry falls back to HTTP on its own for localhost and
// private addresses, which would send credentials in clear text.
type schemeGuard struct {
	base     http.RoundTripper
	insecure bool
}

func (g schemeGuard) RoundTrip(req *http.Request) (*http.Response, error) {
	if req.URL.Scheme != "https" && !g.insecure {
		return nil, ErrPlainHTTP
	}
	return g.base.RoundTrip(req)
}

func selectPlatform(idx v1.ImageIndex, want v1.Platform, ref string) (v1.Descriptor, error) {
	im, err := idx.IndexManifest()
	if err != nil {
		return v1.Descriptor{}, classify(context.Background(), ref, err)
	}
	var have []string
	for _, d := range im.Manifests {
		if !d.MediaType.IsImage() {
			continue // nested indexes and attestations are not runnable
		}
		// The OCI spec: a descriptor without a platform is linux/amd64.
		p := v1.Platform{OS: "linux", Architecture: "amd64"}
		if d.Platform != nil {
			p = *d.Platform
		}
		if p.OS == "unknown" {
			continue // buildkit attestation manifests
		}
		if platformMatches(p, want) {
			if d.Platform == nil {
				d.Platform = &p
			}
			return d, nil
		}
		have = append(have, p.String())
	}
	slices.Sort(have)
	have = slices.Compact(have)
	return v1.Descriptor{}, errdefs.NotFoundf("%s has no image for platform %s (available: %s)",
		ref, want.String(), strings.Join(have, ", "))
}

// platformMatches: OS and architecture equal; a wanted variant must match
// (an empty one accepts any variant).
func platformMatches(got, want v1.Platform) bool {
	if got.OS != want.OS || got.Architecture != want.Architecture {
		return false
	}
	return want.Variant == "" || got.Variant == want.Variant
}

// classify wraps a registry-client error with its errdefs kind.
func classify(ctx context.Context, ref string, err error) error {
	if err == nil {
		return nil
	}
	if ctx.Err() != nil && errors.Is(err, ctx.Err()) {
		return err
	}
	if errors.Is(err, ErrPlainHTTP) || errors.Is(err, ErrFloor) {
		return fmt.Errorf("%w: %s: %w", errdefs.ErrInvalidArgument, ref, err)
	}
	var terr *transport.Error
	if errors.As(err, &terr) {
		switch {
		case terr.StatusCode == http.StatusUnauthorized || terr.StatusCode == http.StatusForbidden ||
			hasCode(terr, transport.UnauthorizedErrorCode, transport.DeniedErrorCode):
			return fmt.Errorf("%w: %w: %s: %v", ErrUnauthorized, errdefs.ErrInvalidArgument, ref, err)
		case terr.StatusCode == http.StatusNotFound ||
			hasCode(terr, transport.ManifestUnknownErrorCode, transport.NameUnknownErrorCode, transport.BlobUnknownErrorCode):
			return fmt.Errorf("%w: %s: %v", errdefs.ErrNotFound, ref, err)
		case terr.StatusCode == http.StatusBadRequest ||
			hasCode(terr, transport.NameInvalidErrorCode, transport.TagInvalidErrorCode, transport.DigestInvalidErrorCode):
			return fmt.Errorf("%w: %s: %v", errdefs.ErrInvalidArgument, ref, err)
		default:
			return fmt.Errorf("%w: %s: %v", errdefs.ErrUnavailable, ref, err)
		}
	}
	// What is left is the network (refused, reset, TLS, DNS): the registry
	// is not reachable now.
	return fmt.Errorf("%w: %s: %v", errdefs.ErrUnavailable, ref, err)
}

func hasCode(e *transport.Error, codes ...transport.ErrorCode) bool {
	for _, d := range e.Errors {
		if slices.Contains(codes, d.Code) {
			return true
		}
	}
	return false
}

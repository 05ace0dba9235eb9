package node

import (
	"context"
	"errors"
	"fmt"

	"github.com/google/go-containerregistry/pkg/name"

	"github.com/spore-run/spore/internal/errdefs"
	"github.com/spore-run/spore/internal/oci"
	"github.com/spore-run/spore/internal/snapshot"
)

// ParseInsecureRegistries checks a list of registries (host or host:port,
// no scheme or path) and returns them as go-containerregistry names them,
// the form BuildImage compares a reference's registry with.
func ParseInsecureRegistries(list []string) (map[string]bool, error) {
	out := map[string]bool{}
	for _, s := range list {
		r, err := name.NewRegistry(s, name.StrictValidation)
		if err != nil || r.RegistryStr() != s {
			return nil, errdefs.Invalidf("insecure registry %q: want host or host:port (no scheme, no path)", s)
		}
		out[r.RegistryStr()] = true
	}
	return out, nil
}

// BuildImage is BuildImageTemplate with the registry reached as the
// node's configuration says: over plain HTTP exactly when the reference's
// registry is in Config.InsecureRegistries (spec.Registry.Insecure is
// ignored), so no caller of the node contract can make it send
// credentials in clear text to a registry the operator did not list. A
// registry that answers only over plain HTTP and is not listed is
// ErrInvalidArgument, naming the option.
func (n *Node) BuildImage(ctx context.Context, spec ImageTemplateSpec) (snapshot.Manifest, error) {
	ref, err := name.ParseReference(spec.Ref)
	if err != nil {
		return snapshot.Manifest{}, errdefs.Invalidf("template %s: image reference %q: %v", spec.Name, spec.Ref, err)
	}
	host := ref.Context().RegistryStr()
	spec.Registry.Insecure = n.insecure[host]
	m, err := n.BuildImageTemplate(ctx, spec)
	if err != nil && !spec.Registry.Insecure && errdefs.IsInvalidArgument(err) && plainHTTPRefused(err) {
		return snapshot.Manifest{}, fmt.Errorf("%w (registry %s is not in this node's insecure registries: start it with --insecure-registry=%s to allow plain HTTP)", err, host, host)
	}
	return m, err
}

// plainHTTPRefused reports whether err is the registry client refusing
// plain HTTP.
func plainHTTPRefused(err error) bool { return errors.Is(err, oci.ErrPlainHTTP) }

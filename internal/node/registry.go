package node

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/netip"
	"strings"
	"sync"

	"github.com/google/go-containerregistry/pkg/name"

	"github.com/spore-run/spore/internal/errdefs"
	"github.com/spore-run/spore/internal/oci"
	"github.com/spore-run/spore/internal/snapshot"
)

// ParseInsecureRegistries checks a list of registries (host or host:port,
// no scheme or path) and returns them as go-containerregistry names them,
// the form BuildImage compares a reference's registry with.
func ParseInsecureRegistries(list []string) (map[string]bool, error) {
	return parseRegistries("insecure registry", list)
}

// ParsePrivateRegistries checks Config.PrivateRegistries as
// ParseInsecureRegistries checks its list.
func ParsePrivateRegistries(list []string) (map[string]bool, error) {
	return parseRegistries("private registry", list)
}

func parseRegistries(what string, list []string) (map[string]bool, error) {
	out := map[string]bool{}
	for _, s := range list {
		r, err := name.NewRegistry(s, name.StrictValidation)
		if err != nil || r.RegistryStr() != s {
			return nil, errdefs.Invalidf("%s %q: want host or host:port (no scheme, no path)", what, s)
		}
		out[r.RegistryStr()] = true
	}
	return out, nil
}

// registries is how a node reaches image registries (BuildImage, Export):
// the operator's lists and credentials, and one HTTP transport behind the
// egress floor, shared by every pull and push.
type registries struct {
	insecure map[string]bool // plain HTTP allowed
	private  map[string]bool // reached at floor addresses; insecure ones included
	authFile string          // the operator's credentials ("": none)

	once sync.Once
	tr   *http.Transport
}

// newRegistries checks the registry settings of cfg: the lists' syntax
// and, when one is named, the credentials file (read again at every
// pull, so the operator may rotate what it holds).
func newRegistries(cfg Config) (*registries, error) {
	insecure, err := ParseInsecureRegistries(cfg.InsecureRegistries)
	if err != nil {
		return nil, err
	}
	private, err := ParsePrivateRegistries(cfg.PrivateRegistries)
	if err != nil {
		return nil, err
	}
	// A registry listed for plain HTTP is one the operator named on a
	// network of theirs: listing it twice would be ceremony.
	for h := range insecure {
		private[h] = true
	}
	if cfg.RegistryAuthFile != "" {
		if _, err := LoadRegistryAuth(cfg.RegistryAuthFile); err != nil {
			return nil, err
		}
	}
	return &registries{insecure: insecure, private: private, authFile: cfg.RegistryAuthFile}, nil
}

// allowed reports whether a connection to hostport ("name:port",
// "[v6]:port") may go to an address in the floor: its registry, with or
// without the port, is listed.
func (r *registries) allowed(hostport string) bool {
	h, port, err := net.SplitHostPort(hostport)
	if err != nil {
		return false
	}
	host := h
	if strings.Contains(h, ":") {
		host = "[" + h + "]"
	}
	return r.private[net.JoinHostPort(h, port)] || r.private[host]
}

// transport is the floor-guarded transport of every pull and push; floor
// is asked once.
func (r *registries) transport(floor func() []netip.Prefix) *http.Transport {
	r.once.Do(func() {
		r.tr = oci.Floor{Prefixes: floor(), Allowed: r.allowed}.Transport()
	})
	return r.tr
}

// options returns how a pull (pull) or push of ref reaches its registry:
// the caller's credentials and platform; plain HTTP exactly when the
// registry is listed insecure (the caller's Insecure is ignored); the
// operator's credentials for a pull that brings none (never for a push:
// an export must not write with the operator's rights); every connection
// through the floor. Nothing of the caller's Keychain or Transport is
// kept.
func (r *registries) options(ref name.Reference, given oci.Options, floor func() []netip.Prefix, pull bool) (oci.Options, error) {
	o := oci.Options{Username: given.Username, Password: given.Password, Token: given.Token, Platform: given.Platform,
		Insecure: r.insecure[ref.Context().RegistryStr()], Transport: r.transport(floor)}
	if pull && r.authFile != "" && !hasCredentials(o) {
		auth, err := LoadRegistryAuth(r.authFile)
		if err != nil {
			return oci.Options{}, fmt.Errorf("%w: the node's --registry-auth-file (its operator must fix it): %w", errdefs.ErrUnavailable, err)
		}
		o.Keychain = auth
	}
	return o, nil
}

func hasCredentials(o oci.Options) bool { return o.Username != "" || o.Password != "" || o.Token != "" }

// explain adds to the error of a pull (pull) or push what the operator or
// the caller can do about it: the flag that allows a plain-HTTP registry
// or one at a floored address, and where credentials come from.
func (r *registries) explain(err error, ref name.Reference, o oci.Options, pull bool) error {
	host := ref.Context().RegistryStr()
	var fe *oci.FloorError
	switch {
	case err == nil:
		return nil
	case !o.Insecure && errors.Is(err, oci.ErrPlainHTTP):
		return fmt.Errorf("%w (registry %s is not in this node's insecure registries: start it with --insecure-registry=%s to allow plain HTTP)", err, host, host)
	case errors.As(err, &fe):
		return fmt.Errorf("%w (%s is not in this node's private registries: start it with --allow-private-registry=%s to allow it)", err, fe.Host, fe.Host)
	case errors.Is(err, oci.ErrUnauthorized) && !hasCredentials(o) && !pull:
		return fmt.Errorf("%w (no credentials came with the request: a push uses the request's alone)", err)
	case errors.Is(err, oci.ErrUnauthorized) && !hasCredentials(o):
		auth, _ := o.Keychain.(RegistryAuth)
		if _, ok := auth[host]; ok {
			return fmt.Errorf("%w (no credentials came with the request; the registry refused those of the node's --registry-auth-file for %s)", err, host)
		}
		return fmt.Errorf("%w (no credentials came with the request, and the node's --registry-auth-file has none for %s; the node never uses its host's Docker credentials)", err, host)
	}
	return err
}

// BuildImage is BuildImageTemplate with the registry reached as the
// node's configuration says (registries.options): over plain HTTP exactly
// when the reference's registry is in Config.InsecureRegistries, so no
// caller of the node contract can make it send credentials in clear text
// to a registry the operator did not list; with the credentials the
// request brings, else the operator's (Config.RegistryAuthFile), never
// the host's; and never to an address in the node's egress floor unless
// the operator listed the host (Config.PrivateRegistries, or
// InsecureRegistries). A registry that answers only over plain HTTP and is
// not listed, or a connection refused by the floor (the registry's, or a
// redirect's), is ErrInvalidArgument naming the option to set.
func (n *Node) BuildImage(ctx context.Context, spec ImageTemplateSpec) (snapshot.Manifest, error) {
	ref, err := name.ParseReference(spec.Ref)
	if err != nil {
		return snapshot.Manifest{}, errdefs.Invalidf("template %s: image reference %q: %v", spec.Name, spec.Ref, err)
	}
	if spec.Registry, err = n.reg.options(ref, spec.Registry, n.Net.Floor, true); err != nil {
		return snapshot.Manifest{}, fmt.Errorf("template %s: %w", spec.Name, err)
	}
	m, err := n.BuildImageTemplate(ctx, spec)
	return m, n.reg.explain(err, ref, spec.Registry, true)
}

package oci

import (
	"context"
	"encoding/base64"
	"errors"
	"io"
	"log"
	"net"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/google/go-containerregistry/pkg/authn"
	"github.com/google/go-containerregistry/pkg/registry"
	"github.com/google/go-containerregistry/pkg/v1/remote"

	"github.com/spore-run/spore/internal/errdefs"
)

// TestPullNeverUsesTheHostsDockerCredentials: the Docker configuration of
// the host (DOCKER_CONFIG here, ~/.docker/config.json otherwise) holds the
// right credentials for the registry, and a pull that brings none is
// refused (401 → ErrUnauthorized): a node lends its own credentials to no
// one. Credentials given with the pull, or by a Keychain (the operator's),
// work. Before, the pull went through authn.DefaultKeychain and succeeded.
func TestPullNeverUsesTheHostsDockerCredentials(t *testing.T) {
	r := newRegistry(t)
	r.user, r.pass = "alice", "s3cret"
	ref := r.push(t, "private:v1", imageOf(t, "", layerOf(t, file("x", "x", 0o644))))

	dir := t.TempDir()
	auth := base64.StdEncoding.EncodeToString([]byte("alice:s3cret"))
	cfg := `{"auths":{"` + r.host + `":{"auth":"` + auth + `"},"http://` + r.host + `":{"auth":"` + auth + `"}}}`
	if err := os.WriteFile(filepath.Join(dir, "config.json"), []byte(cfg), 0o600); err != nil {
		t.Fatal(err)
	}
	t.Setenv("DOCKER_CONFIG", dir)
	// The host keychain would answer with them: what the pull must not use.
	if a, err := authn.DefaultKeychain.Resolve(mustRef(t, ref).Context()); err != nil || a == authn.Anonymous {
		t.Fatalf("the test's Docker configuration is not read by the default keychain: %v, %v", a, err)
	}

	ctx := context.Background()
	_, err := Pull(ctx, ref, Options{Insecure: true})
	if !errors.Is(err, ErrUnauthorized) || !errdefs.IsInvalidArgument(err) {
		t.Fatalf("a pull without credentials on a host whose Docker config has them: %v, want ErrUnauthorized", err)
	}
	t.Logf("refused: %v", err)
	for what, o := range map[string]Options{
		"credentials with the pull":   {Insecure: true, Username: "alice", Password: "s3cret"},
		"a keychain (the operator's)": {Insecure: true, Keychain: staticKeychain{r.host: authn.AuthConfig{Username: "alice", Password: "s3cret"}}},
	} {
		if _, err := Pull(ctx, ref, o); err != nil {
			t.Errorf("%s: %v", what, err)
		}
	}
	// A keychain without an entry for this registry is anonymous.
	if _, err := Pull(ctx, ref, Options{Insecure: true, Keychain: staticKeychain{}}); !errors.Is(err, ErrUnauthorized) {
		t.Fatalf("a keychain with no entry: %v, want ErrUnauthorized", err)
	}
}

// staticKeychain maps a registry (as a reference names it) to credentials.
type staticKeychain map[string]authn.AuthConfig

func (k staticKeychain) Resolve(r authn.Resource) (authn.Authenticator, error) {
	if c, ok := k[r.RegistryStr()]; ok {
		return authn.FromConfig(c), nil
	}
	return authn.Anonymous, nil
}

var loopback = []netip.Prefix{netip.MustParsePrefix("127.0.0.0/8"), netip.MustParsePrefix("::1/128")}

// TestFloorRefusesARegistryInIt: a registry at a floored address (the test
// registry, on 127.0.0.1; by address and by a name resolving there) is
// refused before any connection, ErrFloor + InvalidArgument naming the
// host and the address; allowed by name, it is pulled from.
func TestFloorRefusesARegistryInIt(t *testing.T) {
	r := newRegistry(t)
	ref := r.push(t, "app:v1", imageOf(t, "", layerOf(t, file("x", "x", 0o644))))
	_, port, _ := net.SplitHostPort(r.host)
	byName := "localhost:" + port + "/app:v1"

	var seen atomic.Int64
	inner := r.srv.Config.Handler
	r.srv.Config.Handler = http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
		seen.Add(1)
		inner.ServeHTTP(w, req)
	})
	ctx := context.Background()
	for _, ref := range []string{ref, byName} {
		_, err := Pull(ctx, ref, Options{Insecure: true, Transport: Floor{Prefixes: loopback}.Transport()})
		var fe *FloorError
		if !errors.Is(err, ErrFloor) || !errdefs.IsInvalidArgument(err) || !errors.As(err, &fe) ||
			!strings.Contains(err.Error(), "egress floor") || !fe.Addr.IsLoopback() {
			t.Fatalf("pull %s from a floored address: %v, want ErrFloor naming the floor", ref, err)
		}
		t.Logf("refused: %v", err)
	}
	if n := seen.Load(); n != 0 {
		t.Fatalf("the registry saw %d requests from refused pulls", n)
	}

	for _, ref := range []string{ref, byName} {
		host := strings.SplitN(ref, "/", 2)[0]
		allow := Floor{Prefixes: loopback, Allowed: func(h string) bool { return h == host }}
		if _, err := Pull(ctx, ref, Options{Insecure: true, Transport: allow.Transport()}); err != nil {
			t.Fatalf("pull %s, allowed: %v", ref, err)
		}
	}
}

// TestFloorRefusesARedirectIntoIt: a registry the operator allowed
// redirects blob downloads to a storage host; a storage host at a floored
// address that is not allowed itself is refused (ErrFloor naming it) with
// no connection made to it, the config blob's redirect failing the pull;
// allowed too, the image pulls and unpacks through the redirects.
func TestFloorRefusesARedirectIntoIt(t *testing.T) {
	inner := registry.New(registry.Logger(log.New(io.Discard, "", 0)))
	var storageGets atomic.Int64
	storage := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
		storageGets.Add(1)
		inner.ServeHTTP(w, req)
	}))
	t.Cleanup(storage.Close)
	front := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
		if blobPath.MatchString(req.URL.Path) && req.Method == http.MethodGet {
			http.Redirect(w, req, storage.URL+req.URL.Path, http.StatusTemporaryRedirect)
			return
		}
		inner.ServeHTTP(w, req)
	}))
	t.Cleanup(front.Close)
	regHost := strings.TrimPrefix(front.URL, "http://")
	storageHost := strings.TrimPrefix(storage.URL, "http://")
	ref := regHost + "/app:v1"
	if err := remote.Write(mustRef(t, ref), imageOf(t, "", layerOf(t, file("hello", "hi", 0o644)))); err != nil {
		t.Fatal(err)
	}

	ctx := context.Background()
	registryOnly := Floor{Prefixes: loopback, Allowed: func(h string) bool { return h == regHost }}
	_, err := Pull(ctx, ref, Options{Insecure: true, Transport: registryOnly.Transport()})
	var fe *FloorError
	if !errors.Is(err, ErrFloor) || !errdefs.IsInvalidArgument(err) || !errors.As(err, &fe) || fe.Host != storageHost {
		t.Fatalf("pull redirected to a floored storage host: %v, want ErrFloor naming %s", err, storageHost)
	}
	if n := storageGets.Load(); n != 0 {
		t.Fatalf("the refused storage host got %d requests", n)
	}
	t.Logf("refused: %v", err)

	both := Floor{Prefixes: loopback, Allowed: func(h string) bool { return h == regHost || h == storageHost }}
	img, err := Pull(ctx, ref, Options{Insecure: true, Transport: both.Transport()})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := Unpack(ctx, img, t.TempDir(), Limits{}); err != nil {
		t.Fatal(err)
	}
	if storageGets.Load() < 2 { // the config and the layer
		t.Fatalf("the storage host served %d blobs: the registry did not redirect", storageGets.Load())
	}
}

// TestFloorCheck: addresses are checked in every form a dialler may give
// them (zoned, IPv4-mapped); one outside the floor passes; an address that
// does not parse is refused.
func TestFloorCheck(t *testing.T) {
	f := Floor{Prefixes: []netip.Prefix{netip.MustParsePrefix("169.254.0.0/16"), netip.MustParsePrefix("fe80::/10")}}
	for addr, refused := range map[string]bool{
		"169.254.169.254:80":          true,
		"[::ffff:169.254.169.254]:80": true,
		"[fe80::1%eth0]:443":          true,
		"93.184.215.14:443":           false,
		"[2606:4700::1]:443":          false,
		"not-an-address:443":          true,
	} {
		err := f.check("h:1", addr)
		if (err != nil) != refused || (refused && !errors.Is(err, ErrFloor)) {
			t.Errorf("%s: %v, want refused %v", addr, err, refused)
		}
	}
}

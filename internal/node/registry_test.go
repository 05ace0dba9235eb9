package node

import (
	"archive/tar"
	"context"
	"encoding/base64"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"net/http/httputil"
	"net/url"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"github.com/google/go-containerregistry/pkg/authn"
	"github.com/google/go-containerregistry/pkg/name"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/mutate"

	"github.com/spore-run/spore/internal/errdefs"
	"github.com/spore-run/spore/internal/netns"
	"github.com/spore-run/spore/internal/oci"
	"github.com/spore-run/spore/internal/testenv"
)

// TestParseInsecureRegistries: host or host:port only; anything with a
// scheme, a path or nothing is refused (a typo must not silently allow
// nothing, or something else). The private list is checked alike.
func TestParseInsecureRegistries(t *testing.T) {
	for what, parse := range map[string]func([]string) (map[string]bool, error){
		"insecure": ParseInsecureRegistries, "private": ParsePrivateRegistries,
	} {
		got, err := parse([]string{"127.0.0.1:5000", "registry.lan", "[::1]:5000"})
		if err != nil || len(got) != 3 || !got["127.0.0.1:5000"] || !got["registry.lan"] || !got["[::1]:5000"] {
			t.Fatalf("%s: valid list: %v, %v", what, got, err)
		}
		for _, bad := range []string{"", "http://127.0.0.1:5000", "127.0.0.1:5000/repo", "Registry.lan:x", " reg"} {
			if _, err := parse([]string{bad}); !errdefs.IsInvalidArgument(err) {
				t.Errorf("%s: %q: %v, want invalid argument", what, bad, err)
			}
		}
	}
}

// tinyImage is a one-file linux/amd64 image.
func tinyImage(t *testing.T) v1.Image {
	t.Helper()
	img, err := mutate.AppendLayers(empty.Image, testenv.TarLayer(t, []testenv.TarEntry{{Name: "hello", Body: "hi", Type: tar.TypeReg, Mode: 0o644}}))
	if err != nil {
		t.Fatal(err)
	}
	cf, err := img.ConfigFile()
	if err != nil {
		t.Fatal(err)
	}
	cf = cf.DeepCopy()
	cf.OS, cf.Architecture = "linux", "amd64"
	if img, err = mutate.ConfigFile(img, cf); err != nil {
		t.Fatal(err)
	}
	return img
}

// pullAs pulls ref, layers included, the way BuildImage (pull) reaches
// registries under cfg's settings, behind the default floor, and returns
// BuildImage's error.
func pullAs(t *testing.T, cfg Config, ref string, given oci.Options) error {
	t.Helper()
	r, err := newRegistries(cfg)
	if err != nil {
		t.Fatal(err)
	}
	return pullWith(t, r, ref, given)
}

func pullWith(t *testing.T, r *registries, ref string, given oci.Options) error {
	t.Helper()
	defer func() {
		if r.tr != nil {
			r.tr.CloseIdleConnections()
		}
	}()
	nref, err := name.ParseReference(ref)
	if err != nil {
		t.Fatal(err)
	}
	o, err := r.options(nref, given, netns.DefaultFloor, true)
	if err != nil {
		return err
	}
	ctx := context.Background()
	img, err := oci.Pull(ctx, ref, o)
	if err == nil {
		err = readLayers(img)
	}
	return r.explain(err, nref, o, true)
}

func readLayers(img v1.Image) error {
	ls, err := img.Layers()
	if err != nil {
		return err
	}
	for _, l := range ls {
		rc, err := l.Compressed()
		if err != nil {
			return err
		}
		_, err = io.Copy(io.Discard, rc)
		rc.Close()
		if err != nil {
			return err
		}
	}
	return nil
}

func writeFile(t *testing.T, path, body string, mode os.FileMode) {
	t.Helper()
	if err := os.WriteFile(path, []byte(body), mode); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(path, mode); err != nil {
		t.Fatal(err)
	}
}

func authJSON(host, user, pass string) string {
	return `{"auths":{"` + host + `":{"auth":"` + base64.StdEncoding.EncodeToString([]byte(user+":"+pass)) + `"}}}`
}

// TestImagePullsNeverUseTheHostsCredentials: the host's Docker
// configuration (DOCKER_CONFIG) holds the right credentials for a registry
// that requires them; a pull bringing none is refused with a message that
// says where credentials come from (before, the host's were sent and the
// pull succeeded). Credentials given with the pull work, and so do the
// operator's (--registry-auth-file), read again at every pull; given ones
// win over the file's; a push never gets the file's.
func TestImagePullsNeverUseTheHostsCredentials(t *testing.T) {
	reg := testenv.NewRegistry(t, "spore", "s3cret")
	ref := reg.Push(t, "app:v1", tinyImage(t))
	docker := t.TempDir()
	writeFile(t, filepath.Join(docker, "config.json"), authJSON(reg.Host, "spore", "s3cret"), 0o600)
	t.Setenv("DOCKER_CONFIG", docker)
	listed := Config{InsecureRegistries: []string{reg.Host}}

	err := pullAs(t, listed, ref, oci.Options{})
	if !errors.Is(err, oci.ErrUnauthorized) || !errdefs.IsInvalidArgument(err) ||
		!strings.Contains(err.Error(), "never uses its host's Docker credentials") {
		t.Fatalf("a pull without credentials on a host whose Docker config has them: %v, want ErrUnauthorized saying why", err)
	}
	t.Logf("refused: %v", err)
	if err := pullAs(t, listed, ref, oci.Options{Username: "spore", Password: "s3cret"}); err != nil {
		t.Fatalf("credentials given with the pull: %v", err)
	}

	file := filepath.Join(t.TempDir(), "registry-auth.json")
	writeFile(t, file, authJSON(reg.Host, "spore", "wrong"), 0o600)
	withFile := listed
	withFile.RegistryAuthFile = file
	if err := pullAs(t, withFile, ref, oci.Options{}); !errors.Is(err, oci.ErrUnauthorized) || !strings.Contains(err.Error(), "--registry-auth-file for "+reg.Host) {
		t.Fatalf("the file's wrong credentials: %v, want ErrUnauthorized naming the file", err)
	}
	if err := pullAs(t, withFile, ref, oci.Options{Username: "spore", Password: "s3cret"}); err != nil {
		t.Fatalf("credentials given with the pull beside a file with wrong ones: %v", err)
	}
	writeFile(t, file, authJSON(reg.Host, "spore", "s3cret"), 0o600) // rotated by the operator
	if err := pullAs(t, withFile, ref, oci.Options{}); err != nil {
		t.Fatalf("the operator's credentials: %v", err)
	}

	r, err := newRegistries(withFile)
	if err != nil {
		t.Fatal(err)
	}
	nref, err := name.ParseReference(ref)
	if err != nil {
		t.Fatal(err)
	}
	push, err := r.options(nref, oci.Options{}, netns.DefaultFloor, false)
	if err != nil || push.Keychain != nil || hasCredentials(push) {
		t.Fatalf("a push got credentials it did not bring: %+v, %v", push, err)
	}

	// A file the operator broke after the start fails pulls that need it,
	// as unavailable (the caller can do nothing), naming the flag.
	writeFile(t, file, authJSON(reg.Host, "spore", "s3cret"), 0o644)
	if err := pullWith(t, r, ref, oci.Options{}); !errdefs.IsUnavailable(err) || !strings.Contains(err.Error(), "--registry-auth-file") {
		t.Fatalf("a pull through a file of mode 0644: %v, want unavailable naming the flag", err)
	}
	if _, err := newRegistries(withFile); !errdefs.IsInvalidArgument(err) || !strings.Contains(err.Error(), "0600") {
		t.Fatalf("starting with a file of mode 0644: %v, want invalid argument saying 0600", err)
	}
}

// TestLoadRegistryAuth: Docker's "auths" form (auth, username and
// password, tokens), keys as docker login writes them normalized to the
// registry a reference names; credential helpers, broken JSON, keys that
// are not registries, entries without or with half credentials, two
// entries for one registry, a file others may read, and no file at all are
// refused as invalid.
func TestLoadRegistryAuth(t *testing.T) {
	dir := t.TempDir()
	load := func(body string, mode os.FileMode) (RegistryAuth, error) {
		p := filepath.Join(dir, "auth.json")
		writeFile(t, p, body, mode)
		return LoadRegistryAuth(p)
	}
	got, err := load(`{"auths":{
		"https://index.docker.io/v1/": {"auth": "`+base64.StdEncoding.EncodeToString([]byte("hub:pw"))+`"},
		"registry.lan:5000": {"username": "u", "password": "p"},
		"http://10.0.0.5:5000": {"identitytoken": "tok"}},
		"currentContext": "ignored"}`, 0o600)
	if err != nil {
		t.Fatal(err)
	}
	want := map[string]authn.AuthConfig{
		"index.docker.io":   {Username: "hub", Password: "pw"},
		"registry.lan:5000": {Username: "u", Password: "p"},
		"10.0.0.5:5000":     {IdentityToken: "tok"},
	}
	if len(got) != len(want) {
		t.Fatalf("loaded %v, want %v", got, want)
	}
	for k, w := range want {
		g := got[k]
		if g.Username != w.Username || g.Password != w.Password || g.IdentityToken != w.IdentityToken {
			t.Errorf("%s: %+v, want %+v", k, g, w)
		}
	}
	hub, _ := name.ParseReference("ubuntu:24.04")
	if a, err := got.Resolve(hub.Context()); err != nil || a == authn.Anonymous {
		t.Errorf("docker.io/library/ubuntu resolves to %v, %v: want the file's index.docker.io entry", a, err)
	}
	other, _ := name.ParseReference("ghcr.io/x/y:1")
	if a, err := got.Resolve(other.Context()); err != nil || a != authn.Anonymous {
		t.Errorf("an unlisted registry resolves to %v, %v: want anonymous", a, err)
	}

	for what, c := range map[string]struct {
		body string
		mode os.FileMode
		says string
	}{
		"mode 0644":          {`{"auths":{}}`, 0o644, "0600"},
		"mode 0640":          {`{"auths":{}}`, 0o640, "0600"},
		"a credential store": {`{"auths":{},"credsStore":"desktop"}`, 0o600, "credential helpers"},
		"credential helpers": {`{"credHelpers":{"gcr.io":"gcloud"}}`, 0o600, "credential helpers"},
		"not JSON":           {`auths:`, 0o600, "config.json form"},
		"not a registry":     {`{"auths":{"https://":{"username":"u","password":"p"}}}`, 0o600, "registry host"},
		"no credentials":     {`{"auths":{"r.lan":{}}}`, 0o600, "no credentials"},
		"half a pair":        {`{"auths":{"r.lan":{"username":"u"}}}`, 0o600, "half"},
		"two for one":        {`{"auths":{"docker.io":{"username":"u","password":"p"},"index.docker.io":{"username":"v","password":"q"}}}`, 0o600, "two entries"},
	} {
		if _, err := load(c.body, c.mode); !errdefs.IsInvalidArgument(err) || !strings.Contains(err.Error(), c.says) {
			t.Errorf("%s: %v, want invalid argument saying %q", what, err, c.says)
		}
	}
	if _, err := LoadRegistryAuth(filepath.Join(dir, "none")); !errdefs.IsInvalidArgument(err) {
		t.Errorf("no file: %v", err)
	}
	if _, err := LoadRegistryAuth(dir); !errdefs.IsInvalidArgument(err) {
		t.Errorf("a directory: %v", err)
	}
}

var blobGet = regexp.MustCompile(`^/v2/.+/blobs/sha256:[0-9a-f]{64}$`)

// TestImagePullsStayOffTheFloor: the test registry is on 127.0.0.1, in
// the node's floor. Not listed, a pull is refused (invalid argument,
// oci.ErrFloor, naming the floor and the flag); listed private (HTTPS
// only) the floor no longer refuses it; listed insecure (which implies
// private) it is pulled from. A listed registry that redirects its blobs
// to a storage host in the floor is refused there (ErrFloor naming that
// host and --allow-private-registry, no blob fetched from it) until the
// storage host is listed too. Before, every one of these pulls reached
// the address.
func TestImagePullsStayOffTheFloor(t *testing.T) {
	reg := testenv.NewRegistry(t, "", "")
	im := tinyImage(t)
	ref := reg.Push(t, "app:v1", im)

	err := pullAs(t, Config{}, ref, oci.Options{})
	if !errors.Is(err, oci.ErrFloor) || !errdefs.IsInvalidArgument(err) || !strings.Contains(err.Error(), "egress floor") ||
		!strings.Contains(err.Error(), "--insecure-registry="+reg.Host) {
		t.Fatalf("a pull from an unlisted registry on 127.0.0.1: %v, want ErrFloor naming the flag", err)
	}
	t.Logf("refused: %v", err)
	err = pullAs(t, Config{PrivateRegistries: []string{reg.Host}}, ref, oci.Options{})
	if errors.Is(err, oci.ErrFloor) || !errors.Is(err, oci.ErrPlainHTTP) || !errdefs.IsInvalidArgument(err) {
		t.Fatalf("a private (HTTPS only) registry served over plain HTTP: %v, want plain HTTP refused, not the floor", err)
	}
	if err := pullAs(t, Config{InsecureRegistries: []string{reg.Host}}, ref, oci.Options{}); err != nil {
		t.Fatalf("a pull from a listed registry: %v", err)
	}

	// A front registry redirecting blob downloads to reg, its storage.
	storage, err := url.Parse("http://" + reg.Host)
	if err != nil {
		t.Fatal(err)
	}
	proxy := httputil.NewSingleHostReverseProxy(storage)
	front := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
		if req.Method == http.MethodGet && blobGet.MatchString(req.URL.Path) {
			http.Redirect(w, req, "http://"+reg.Host+req.URL.Path, http.StatusTemporaryRedirect)
			return
		}
		proxy.ServeHTTP(w, req)
	}))
	t.Cleanup(front.Close)
	frontHost := strings.TrimPrefix(front.URL, "http://")
	frontRef := frontHost + "/app:v1"
	cfg := configDigest(t, im)
	before := reg.BlobGets(cfg)
	err = pullAs(t, Config{InsecureRegistries: []string{frontHost}}, frontRef, oci.Options{})
	var fe *oci.FloorError
	if !errors.As(err, &fe) || fe.Host != reg.Host || !errdefs.IsInvalidArgument(err) ||
		!strings.Contains(err.Error(), "--allow-private-registry="+reg.Host) {
		t.Fatalf("a listed registry redirecting to a floored storage host: %v, want ErrFloor naming %s", err, reg.Host)
	}
	t.Logf("refused: %v", err)
	if n := reg.BlobGets(cfg) - before; n != 0 {
		t.Fatalf("the refused storage host served the config blob %d times", n)
	}
	if err := pullAs(t, Config{InsecureRegistries: []string{frontHost}, PrivateRegistries: []string{reg.Host}}, frontRef, oci.Options{}); err != nil {
		t.Fatalf("redirects to a listed storage host: %v", err)
	}
	if reg.BlobGets(cfg) == before {
		t.Fatal("the pull through the front registry fetched no blob from its storage: no redirect was followed")
	}
}

func configDigest(t *testing.T, img v1.Image) string {
	t.Helper()
	d, err := img.ConfigName()
	if err != nil {
		t.Fatal(err)
	}
	return d.String()
}

// TestRegistriesAllowed: a listed registry is reached at any address by
// its host:port, and a host listed without a port at any port; nothing
// else.
func TestRegistriesAllowed(t *testing.T) {
	r, err := newRegistries(Config{InsecureRegistries: []string{"10.0.0.5:5000"}, PrivateRegistries: []string{"registry.lan", "[fd00::1]:443"}})
	if err != nil {
		t.Fatal(err)
	}
	for hostport, want := range map[string]bool{
		"10.0.0.5:5000": true, "10.0.0.5:5001": false, "registry.lan:443": true, "registry.lan:80": true,
		"[fd00::1]:443": true, "[fd00::1]:80": false, "169.254.169.254:80": false, "other.lan:443": false, "garbage": false,
	} {
		if got := r.allowed(hostport); got != want {
			t.Errorf("allowed(%s) = %v, want %v", hostport, got, want)
		}
	}
}

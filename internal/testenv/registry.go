package testenv

import (
	"archive/tar"
	"bytes"
	"io"
	"log"
	"net/http"
	"net/http/httptest"
	"os"
	"regexp"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/go-containerregistry/pkg/authn"
	"github.com/google/go-containerregistry/pkg/name"
	"github.com/google/go-containerregistry/pkg/registry"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/remote"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
)

// Busybox is the host's static busybox (Debian's busybox-static,
// installed by `make setup`): the one binary of BusyboxImage.
const Busybox = "/usr/bin/busybox"

// TarEntry is one entry of a layer TarLayer makes.
type TarEntry struct {
	Name, Body, Link string
	Type             byte
	Mode             int64
	UID, GID         int
}

// TarLayer is an uncompressed-tar layer of entries.
func TarLayer(t testing.TB, entries []TarEntry) v1.Layer {
	t.Helper()
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	for _, e := range entries {
		h := &tar.Header{Name: e.Name, Typeflag: e.Type, Mode: e.Mode, Uid: e.UID, Gid: e.GID, Linkname: e.Link,
			Size: int64(len(e.Body)), ModTime: time.Unix(1.7e9, 0)}
		if e.Type != tar.TypeReg {
			h.Size = 0
		}
		if err := tw.WriteHeader(h); err != nil {
			t.Fatal(err)
		}
		if e.Type == tar.TypeReg {
			io.WriteString(tw, e.Body)
		}
	}
	if err := tw.Close(); err != nil {
		t.Fatal(err)
	}
	b := buf.Bytes()
	l, err := tarball.LayerFromOpener(func() (io.ReadCloser, error) { return io.NopCloser(bytes.NewReader(b)), nil })
	if err != nil {
		t.Fatal(err)
	}
	return l
}

// BusyboxImage is a two-layer linux/amd64 image: busybox with its applets,
// accounts, an "app" user (uid 1234), /data files; the second layer
// deletes one of them (a whiteout), adds another and the working
// directory. Config: Env PATH=/bin and GREETING="hello from the image",
// WorkingDir /srv/work, User app.
func BusyboxImage(t testing.TB) v1.Image {
	t.Helper()
	bb, err := os.ReadFile(Busybox)
	if err != nil {
		t.Fatalf("%s (busybox-static, installed by `make setup`): %v", Busybox, err)
	}
	dir := func(n string, mode int64, uid int) TarEntry {
		return TarEntry{Name: n, Type: tar.TypeDir, Mode: mode, UID: uid, GID: uid}
	}
	file := func(n, body string, mode int64) TarEntry {
		return TarEntry{Name: n, Type: tar.TypeReg, Body: body, Mode: mode}
	}
	l1 := []TarEntry{
		dir("bin/", 0o755, 0), file("bin/busybox", string(bb), 0o755),
		dir("etc/", 0o755, 0),
		file("etc/passwd", "root:x:0:0:root:/root:/bin/sh\napp:x:1234:1234:app:/home/app:/bin/sh\n", 0o644),
		file("etc/group", "root:x:0:\napp:x:1234:\n", 0o644),
		dir("home/", 0o755, 0), dir("home/app/", 0o755, 1234), dir("root/", 0o700, 0),
		dir("data/", 0o755, 0), file("data/kept.txt", "kept by layer 2\n", 0o644), file("data/gone.txt", "deleted by layer 2\n", 0o644),
	}
	for _, a := range []string{"sh", "cat", "id", "pwd", "echo", "ls", "test", "env", "false", "true", "sleep", "whoami", "kill", "stat"} {
		l1 = append(l1, TarEntry{Name: "bin/" + a, Type: tar.TypeSymlink, Link: "busybox", Mode: 0o777})
	}
	l2 := []TarEntry{
		dir("data/", 0o755, 0), file("data/.wh.gone.txt", "", 0o644), file("data/new.txt", "added by layer 2\n", 0o644),
		dir("srv/", 0o755, 0), dir("srv/work/", 0o755, 1234),
	}
	img, err := mutate.AppendLayers(empty.Image, TarLayer(t, l1), TarLayer(t, l2))
	if err != nil {
		t.Fatal(err)
	}
	cf, err := img.ConfigFile()
	if err != nil {
		t.Fatal(err)
	}
	cf = cf.DeepCopy()
	cf.OS, cf.Architecture = "linux", "amd64"
	cf.Config.Env = []string{"PATH=/bin", "GREETING=hello from the image"}
	cf.Config.WorkingDir = "/srv/work"
	cf.Config.User = "app"
	if img, err = mutate.ConfigFile(img, cf); err != nil {
		t.Fatal(err)
	}
	return img
}

// Registry is go-containerregistry's registry served in-process over
// plain HTTP (closed when the test ends), requiring basic auth when User
// is set, counting blob downloads.
type Registry struct {
	Host       string // 127.0.0.1:port
	User, Pass string
	mu         sync.Mutex
	gets       map[string]int
}

var blobGet = regexp.MustCompile(`^/v2/.+/blobs/(sha256:[0-9a-f]{64})$`)

// NewRegistry serves a registry; user "" needs no credentials.
func NewRegistry(t testing.TB, user, pass string) *Registry {
	r := &Registry{gets: map[string]int{}, User: user, Pass: pass}
	inner := registry.New(registry.Logger(log.New(io.Discard, "", 0)))
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
		if u, p, ok := req.BasicAuth(); r.User != "" && (!ok || u != r.User || p != r.Pass) {
			w.Header().Set("WWW-Authenticate", `Basic realm="spore-test"`)
			w.Header().Set("Content-Type", "application/json")
			w.WriteHeader(http.StatusUnauthorized)
			io.WriteString(w, `{"errors":[{"code":"UNAUTHORIZED","message":"authentication required"}]}`)
			return
		}
		if m := blobGet.FindStringSubmatch(req.URL.Path); m != nil && req.Method == http.MethodGet {
			r.mu.Lock()
			r.gets[m[1]]++
			r.mu.Unlock()
		}
		inner.ServeHTTP(w, req)
	}))
	t.Cleanup(srv.Close)
	r.Host = strings.TrimPrefix(srv.URL, "http://")
	return r
}

// Push stores img under repoTag ("repo:tag") and returns its reference
// ("host/repo:tag").
func (r *Registry) Push(t testing.TB, repoTag string, img v1.Image) string {
	t.Helper()
	ref, err := name.ParseReference(r.Host+"/"+repoTag, name.Insecure)
	if err != nil {
		t.Fatal(err)
	}
	var auth authn.Authenticator = authn.Anonymous
	if r.User != "" {
		auth = &authn.Basic{Username: r.User, Password: r.Pass}
	}
	if err := remote.Write(ref, img, remote.WithAuth(auth)); err != nil {
		t.Fatal(err)
	}
	return ref.String()
}

// BlobGets is how many times blob digest (sha256:...) was downloaded.
func (r *Registry) BlobGets(digest string) int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.gets[digest]
}

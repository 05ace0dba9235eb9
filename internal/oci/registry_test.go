package oci

import (
	"archive/tar"
	"bytes"
	"encoding/base64"
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

// testRegistry is go-containerregistry's registry served in-process, with
// optional auth, blob-fetch counting and blob corruption in front of it.
type testRegistry struct {
	host string
	srv  *httptest.Server

	user, pass, token string // auth required when any is set

	mu       sync.Mutex
	blobGets map[string]int // digest -> GETs
	corrupt  string         // digest whose body is served with a flipped byte
}

var blobPath = regexp.MustCompile(`^/v2/.+/blobs/(sha256:[0-9a-f]{64})$`)

func newRegistry(t testing.TB) *testRegistry {
	t.Helper()
	r := &testRegistry{blobGets: map[string]int{}}
	inner := registry.New(registry.Logger(log.New(io.Discard, "", 0)))
	r.srv = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
		if !r.authorized(req) {
			w.Header().Set("WWW-Authenticate", `Basic realm="spore-test"`)
			w.Header().Set("Content-Type", "application/json")
			w.WriteHeader(http.StatusUnauthorized)
			io.WriteString(w, `{"errors":[{"code":"UNAUTHORIZED","message":"authentication required"}]}`)
			return
		}
		m := blobPath.FindStringSubmatch(req.URL.Path)
		if m == nil || req.Method != http.MethodGet {
			inner.ServeHTTP(w, req)
			return
		}
		r.mu.Lock()
		r.blobGets[m[1]]++
		corrupt := r.corrupt == m[1]
		r.mu.Unlock()
		if !corrupt {
			inner.ServeHTTP(w, req)
			return
		}
		rec := httptest.NewRecorder()
		inner.ServeHTTP(rec, req)
		body := rec.Body.Bytes()
		body[len(body)/2] ^= 0xff
		for k, v := range rec.Header() {
			w.Header()[k] = v
		}
		w.WriteHeader(rec.Code)
		w.Write(body)
	}))
	t.Cleanup(r.srv.Close)
	r.host = strings.TrimPrefix(r.srv.URL, "http://")
	return r
}

func (r *testRegistry) authorized(req *http.Request) bool {
	if r.user == "" && r.token == "" {
		return true
	}
	got := req.Header.Get("Authorization")
	if r.token != "" && got == "Bearer "+r.token {
		return true
	}
	return r.user != "" && got == "Basic "+base64.StdEncoding.EncodeToString([]byte(r.user+":"+r.pass))
}

func (r *testRegistry) gets(d v1.Hash) int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.blobGets[d.String()]
}

func (r *testRegistry) setCorrupt(d string) {
	r.mu.Lock()
	r.corrupt = d
	r.mu.Unlock()
}

// push writes img under repo:tag and returns the full reference.
func (r *testRegistry) push(t testing.TB, repoTag string, img v1.Image) string {
	t.Helper()
	ref := r.host + "/" + repoTag
	if err := remote.Write(mustRef(t, ref), img, r.pushAuth()); err != nil {
		t.Fatalf("push %s: %v", ref, err)
	}
	return ref
}

func (r *testRegistry) pushIndex(t testing.TB, repoTag string, idx v1.ImageIndex) string {
	t.Helper()
	ref := r.host + "/" + repoTag
	if err := remote.WriteIndex(mustRef(t, ref), idx, r.pushAuth()); err != nil {
		t.Fatalf("push %s: %v", ref, err)
	}
	return ref
}

func (r *testRegistry) pushAuth() remote.Option {
	if r.user != "" {
		return remote.WithAuth(&authn.Basic{Username: r.user, Password: r.pass})
	}
	return remote.WithAuth(authn.Anonymous)
}

func mustRef(t testing.TB, s string) name.Reference {
	t.Helper()
	ref, err := name.ParseReference(s, name.Insecure)
	if err != nil {
		t.Fatal(err)
	}
	return ref
}

// ent is one tar entry of a test layer.
type ent struct {
	tar.Header
	body string
}

var (
	t1 = time.Date(2021, 1, 2, 3, 4, 5, 0, time.UTC)
	t2 = time.Date(2022, 6, 7, 8, 9, 10, 0, time.UTC)
)

func file(name, body string, mode int64) ent {
	return ent{Header: tar.Header{Typeflag: tar.TypeReg, Name: name, Mode: mode, Size: int64(len(body)), ModTime: t1}, body: body}
}

func dir(name string, mode int64) ent {
	return ent{Header: tar.Header{Typeflag: tar.TypeDir, Name: name, Mode: mode, ModTime: t1}}
}

func symlink(name, target string) ent {
	return ent{Header: tar.Header{Typeflag: tar.TypeSymlink, Name: name, Linkname: target, Mode: 0o777, ModTime: t1}}
}

func hardlink(name, target string) ent {
	return ent{Header: tar.Header{Typeflag: tar.TypeLink, Name: name, Linkname: target, ModTime: t1}}
}

func node(typ byte, name string, mode, major, minor int64) ent {
	return ent{Header: tar.Header{Typeflag: typ, Name: name, Mode: mode, Devmajor: major, Devminor: minor, ModTime: t1}}
}

func (e ent) owner(uid, gid int) ent { e.Uid, e.Gid = uid, gid; return e }
func (e ent) at(t time.Time) ent     { e.ModTime = t; return e }

func tarBytes(t testing.TB, ents ...ent) []byte {
	t.Helper()
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	for _, e := range ents {
		h := e.Header
		h.Format = tar.FormatPAX
		if err := tw.WriteHeader(&h); err != nil {
			t.Fatalf("%s: %v", h.Name, err)
		}
		if _, err := io.WriteString(tw, e.body); err != nil {
			t.Fatal(err)
		}
	}
	if err := tw.Close(); err != nil {
		t.Fatal(err)
	}
	return buf.Bytes()
}

func layerOf(t testing.TB, ents ...ent) v1.Layer {
	t.Helper()
	b := tarBytes(t, ents...)
	l, err := tarball.LayerFromOpener(func() (io.ReadCloser, error) { return io.NopCloser(bytes.NewReader(b)), nil })
	if err != nil {
		t.Fatal(err)
	}
	return l
}

// imageOf is an image of the layers, labelled with the platform "os/arch".
func imageOf(t testing.TB, platform string, layers ...v1.Layer) v1.Image {
	t.Helper()
	img, err := mutate.AppendLayers(empty.Image, layers...)
	if err != nil {
		t.Fatal(err)
	}
	if platform == "" {
		return img
	}
	p, err := v1.ParsePlatform(platform)
	if err != nil {
		t.Fatal(err)
	}
	cfg, err := img.ConfigFile()
	if err != nil {
		t.Fatal(err)
	}
	cfg = cfg.DeepCopy()
	cfg.OS, cfg.Architecture, cfg.Variant = p.OS, p.Architecture, p.Variant
	if img, err = mutate.ConfigFile(img, cfg); err != nil {
		t.Fatal(err)
	}
	return img
}

func mustRoot(t testing.TB) {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Fatal("these tests unpack owners and device nodes for real: run them as root")
	}
}

package sdk

import (
	"archive/tar"
	"encoding/json"
	"io"
	"net/http"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/google/go-containerregistry/pkg/v1/layout"

	"github.com/spore-run/spore/internal/testenv"
)

// TestExportAndColdStart: a sandbox's and a snapshot's filesystems
// exported as OCI images to a registry the test serves, then templates
// built from those images (a cold start from them) have the changes
// (export.mjs, the stock SDK and the export routes).
func TestExportAndColdStart(t *testing.T) {
	reg := testenv.NewRegistry(t, "", "")
	host := registryHost(t, reg.Push(t, "seed/busybox:1", testenv.BusyboxImage(t)))
	s := newServer(t, "--insecure-registry", host)
	out := s.node("export.mjs", "REGISTRY="+host)
	t.Log(out)
	if !strings.Contains(out, "4 passed, 0 failed") {
		t.Fatal("export flow did not pass")
	}
	// The CLI: a template's filesystem, then bad input.
	if got := s.ok("snapshot", "export", "base", host+"/exported/base:1"); !strings.Contains(got, host+"/exported/base:1@sha256:") {
		t.Fatalf("spore snapshot export: %s", got)
	}
	for _, args := range [][]string{
		{"snapshot", "export", "base", "Not A Ref"},
		{"snapshot", "export", "no-such-snapshot", host + "/x:1"},
		{"snapshot", "export", "--sandbox", "inosuchsandboxxxxxxx", host + "/x:1"},
		{"snapshot", "export", "--registry-user", "u", "base", host + "/x:1"},
	} {
		if o, e, code := s.cli("", args...); code == 0 || e == "" {
			t.Errorf("spore %v: exit %d, stdout %q, stderr %q", args, code, o, e)
		}
	}
}

// TestExportOCILayout: a sandbox with a changed file exported as an OCI
// image layout through the CLI (spore snapshot export --oci-layout DIR)
// opens as a layout whose top layer holds the file; the API's layout tar
// (format oci-layout) streams back with a parsable index.json; bad input
// is a 400; the blob that carried the layouts is gone after.
func TestExportOCILayout(t *testing.T) {
	s := newServer(t)
	sb := s.baseSandbox()
	s.ok("exec", sb.SandboxID, "--", "echo in the layout > /home/user/layout.txt")
	dir := filepath.Join(t.TempDir(), "layout")
	t.Log(s.ok("snapshot", "export", "--sandbox", sb.SandboxID, "--oci-layout", dir))
	p, err := layout.FromPath(dir)
	if err != nil {
		t.Fatal(err)
	}
	idx, err := p.ImageIndex()
	if err != nil {
		t.Fatal(err)
	}
	im, err := idx.IndexManifest()
	if err != nil || len(im.Manifests) != 1 {
		t.Fatalf("index: %+v, %v", im, err)
	}
	img, err := p.Image(im.Manifests[0].Digest)
	if err != nil {
		t.Fatal(err)
	}
	layers, err := img.Layers()
	if err != nil || len(layers) != 2 {
		t.Fatalf("layers: %d, %v", len(layers), err)
	}
	rc, err := layers[1].Uncompressed()
	if err != nil {
		t.Fatal(err)
	}
	found := ""
	for tr := tar.NewReader(rc); ; {
		h, err := tr.Next()
		if err != nil {
			break
		}
		if h.Name == "home/user/layout.txt" {
			b, _ := io.ReadAll(tr)
			found = string(b)
		}
	}
	rc.Close()
	if found != "in the layout\n" {
		t.Fatalf("top layer: home/user/layout.txt is %q", found)
	}

	// The API: the tar itself.
	req, _ := http.NewRequest("POST", "http://"+s.addr+"/sandboxes/"+sb.SandboxID+"/export", strings.NewReader(`{"format":"oci-layout"}`))
	req.Header.Set("X-API-KEY", apiKey)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != 200 || resp.Header.Get("Content-Type") != "application/x-tar" || resp.ContentLength <= 0 {
		t.Fatalf("export as layout: %d %v", resp.StatusCode, resp.Header)
	}
	var index struct {
		Manifests []struct{ Digest string } `json:"manifests"`
	}
	tr := tar.NewReader(resp.Body)
	for {
		h, err := tr.Next()
		if err != nil {
			t.Fatalf("no index.json in the tar: %v", err)
		}
		if h.Name == "index.json" {
			if err := json.NewDecoder(tr).Decode(&index); err != nil {
				t.Fatal(err)
			}
			break
		}
	}
	io.Copy(io.Discard, resp.Body)
	if len(index.Manifests) != 1 || index.Manifests[0].Digest != resp.Header.Get("Spore-Image-Digest") {
		t.Fatalf("index.json %+v, digest header %q", index, resp.Header.Get("Spore-Image-Digest"))
	}

	for _, body := range []string{`{"ref":"registry.example.com/a:1","format":"oci-layout"}`, `{"format":"tarball"}`} {
		if code, b := s.rest("POST", "/sandboxes/"+sb.SandboxID+"/export", body); code != 400 {
			t.Errorf("export %s: %d %s", body, code, b)
		}
	}
	// A template's layout, its client gone after the first bytes: the
	// blob goes too.
	req, _ = http.NewRequest("POST", "http://"+s.addr+"/snapshots/base/export", strings.NewReader(`{"format":"oci-layout"}`))
	req.Header.Set("X-API-KEY", apiKey)
	resp, err = http.DefaultClient.Do(req)
	if err != nil || resp.StatusCode != 200 {
		t.Fatalf("export base as layout: %v %v", resp, err)
	}
	if _, err := io.ReadFull(resp.Body, make([]byte, 4096)); err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	var left []string
	for deadline := time.Now().Add(time.Minute); time.Now().Before(deadline); time.Sleep(100 * time.Millisecond) {
		if left, _ = filepath.Glob(filepath.Join(s.data, "blobs", "*", "exports", "*")); len(left) == 0 {
			break
		}
	}
	if len(left) != 0 {
		t.Fatalf("exported layouts left in the blob store: %v", left)
	}
	s.ok("kill", sb.SandboxID)
}

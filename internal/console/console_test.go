package console_test

import (
	"bytes"
	"io/fs"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/spore-run/spore/internal/console"
	"github.com/spore-run/spore/internal/testenv"
)

// The page and its assets are served with their types and the security
// headers; names outside the assets (the page itself under /console/,
// paths, unknown files) are 404s.
func TestServe(t *testing.T) {
	mux := http.NewServeMux()
	mux.HandleFunc("GET /{$}", console.Index)
	mux.HandleFunc("GET /console/{file}", console.Asset)
	srv := httptest.NewServer(mux)
	defer srv.Close()
	for path, ctype := range map[string]string{"/": "text/html", "/console/app.js": "text/javascript", "/console/app.css": "text/css",
		"/console/xterm.mjs": "text/javascript"} {
		resp, err := http.Get(srv.URL + path)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		csp := resp.Header.Get("Content-Security-Policy")
		if resp.StatusCode != 200 || !strings.HasPrefix(resp.Header.Get("Content-Type"), ctype) || !strings.Contains(csp, "script-src 'self';") ||
			!strings.Contains(csp, "frame-ancestors 'none'") || resp.Header.Get("X-Content-Type-Options") != "nosniff" {
			t.Errorf("%s: %d %q, CSP %q", path, resp.StatusCode, resp.Header.Get("Content-Type"), csp)
		}
	}
	for _, path := range []string{"/console/index.html", "/console/nope.js", "/console/..%2fconsole.go", "/console/"} {
		resp, err := http.Get(srv.URL + path)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != 404 {
			t.Errorf("%s = %d, want 404", path, resp.StatusCode)
		}
	}
}

// The committed copy of xterm.js is the package web/package-lock.json
// pins (`make sdk-deps` installs it; `make console-assets` copies it).
func TestVendoredXtermIsThePinnedPackage(t *testing.T) {
	testenv.RealTier(t)
	pkg := "web/node_modules/@xterm/xterm"
	for asset, src := range map[string]string{"xterm.mjs": "lib/xterm.mjs", "xterm.css": "css/xterm.css"} {
		want, err := os.ReadFile(filepath.Join(pkg, src))
		if err != nil {
			t.Fatalf("the pinned package (`make sdk-deps` installs it): %v", err)
		}
		got, err := fs.ReadFile(console.Files(), asset)
		if err != nil || !bytes.Equal(got, want) {
			t.Fatalf("assets/%s differs from %s/%s (run `make console-assets`): %v", asset, pkg, src, err)
		}
	}
}

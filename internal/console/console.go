// Package console is Spore's web console (docs/console.md): static assets
// embedded in the binary, served at / by spore up and every API replica.
// The page holds no data of its own: it signs in with an API key, kept in
// the browser's session storage, and calls the same REST API as the CLI
// with it (X-API-KEY), so the console can do nothing the key cannot.
package console

import (
	"embed"
	"io/fs"
	"net/http"
	"path"
	"strings"
)

//go:embed assets
var assets embed.FS

// Files are the console's assets by name (index.html, app.js, ...).
func Files() fs.FS {
	sub, err := fs.Sub(assets, "assets")
	if err != nil {
		panic(err) // the embedded tree always has it
	}
	return sub
}

// security are the headers every console response carries: its own
// scripts only (no inline code, no other origin), never in a frame, no
// referrer, no sniffing.
func security(h http.Header) {
	// Styles may be inline: the terminal (xterm.js) sets its own. Scripts
	// may not.
	h.Set("Content-Security-Policy", "default-src 'none'; script-src 'self'; style-src 'self' 'unsafe-inline'; img-src 'self' data:; connect-src 'self'; base-uri 'none'; form-action 'none'; frame-ancestors 'none'")
	h.Set("X-Content-Type-Options", "nosniff")
	h.Set("Referrer-Policy", "no-referrer")
	h.Set("X-Frame-Options", "DENY")
}

// Index serves the console's page (GET /).
func Index(w http.ResponseWriter, r *http.Request) {
	serve(w, r, "index.html")
}

// Asset serves one of the console's assets (GET /console/{file}); any
// other name is a 404.
func Asset(w http.ResponseWriter, r *http.Request) {
	name := r.PathValue("file")
	if name == "" || name == "index.html" || strings.ContainsAny(name, "/\\") || path.Clean(name) != name {
		http.NotFound(w, r)
		return
	}
	serve(w, r, name)
}

func serve(w http.ResponseWriter, r *http.Request, name string) {
	b, err := fs.ReadFile(Files(), name)
	if err != nil {
		http.NotFound(w, r)
		return
	}
	h := w.Header()
	security(h)
	h.Set("Cache-Control", "no-cache")
	switch path.Ext(name) {
	case ".html":
		h.Set("Content-Type", "text/html; charset=utf-8")
	case ".js", ".mjs":
		h.Set("Content-Type", "text/javascript; charset=utf-8")
	case ".css":
		h.Set("Content-Type", "text/css; charset=utf-8")
	case ".svg":
		h.Set("Content-Type", "image/svg+xml")
	}
	w.WriteHeader(http.StatusOK)
	if r.Method != http.MethodHead {
		w.Write(b)
	}
}

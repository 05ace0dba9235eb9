package envd

import (
	"bytes"
	"compress/gzip"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strconv"
	"testing"
)

// TestDownloadOfAGrowingFile: a file that grows between the download's stat
// and its copy (a log being written) is served as it was at the stat, its
// declared length, whole. Writing the grown file made the body longer than
// its Content-Length: the server dropped that write and the client saw the
// connection end mid-body ("unexpected EOF"), as `spore bench` once did
// reading a log its ticker wrote to at the same moment.
func TestDownloadOfAGrowingFile(t *testing.T) {
	path := filepath.Join(t.TempDir(), "log")
	first := bytes.Repeat([]byte("a line of the log\n"), 1000)
	if err := os.WriteFile(path, first, 0o600); err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		f, err := os.Open(path)
		if err != nil {
			t.Error(err)
			return
		}
		defer f.Close()
		st, err := f.Stat()
		if err != nil {
			t.Error(err)
			return
		}
		// The file grows after the stat, before the copy.
		a, err := os.OpenFile(path, os.O_APPEND|os.O_WRONLY, 0)
		if err != nil {
			t.Error(err)
			return
		}
		a.WriteString("written while the download ran\n")
		a.Close()
		serveFile(w, r, f, st)
	}))
	defer srv.Close()

	for _, enc := range []string{"identity", "gzip"} {
		// A fresh file for each, back to its first content.
		if err := os.WriteFile(path, first, 0o600); err != nil {
			t.Fatal(err)
		}
		req, _ := http.NewRequest(http.MethodGet, srv.URL, nil)
		req.Header.Set("Accept-Encoding", enc)
		// The Transport gunzips only what it asked for itself: ask
		// explicitly and read the gzip stream as a client would.
		tr := &http.Transport{DisableCompression: true}
		resp, err := (&http.Client{Transport: tr}).Do(req)
		if err != nil {
			t.Fatalf("%s: %v", enc, err)
		}
		var body io.Reader = resp.Body
		if enc == "gzip" {
			zr, err := gzip.NewReader(resp.Body)
			if err != nil {
				t.Fatalf("gzip: %v", err)
			}
			body = zr
		}
		got, err := io.ReadAll(body)
		resp.Body.Close()
		tr.CloseIdleConnections()
		if err != nil {
			t.Fatalf("%s: reading the body: %v (Content-Length %s)", enc, err, resp.Header.Get("Content-Length"))
		}
		if resp.StatusCode != http.StatusOK || !bytes.HasPrefix(got, first) {
			t.Fatalf("%s: status %d, %d bytes; want 200 and the file's first %d bytes", enc, resp.StatusCode, len(got), len(first))
		}
		if enc == "identity" {
			if cl := resp.Header.Get("Content-Length"); cl != strconv.Itoa(len(first)) || len(got) != len(first) {
				t.Errorf("identity: Content-Length %s, body %d bytes; want both %d (the file at the stat)", cl, len(got), len(first))
			}
		}
	}
}

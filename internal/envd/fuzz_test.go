package envd_test

import (
	"bytes"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/spore-run/spore/internal/envd"
)

// Uploads: any body, content type and path gets a JSON answer with a
// 2xx/4xx/507 status, never a crash or a 5xx of another kind.
func FuzzUpload(f *testing.F) {
	dir := f.TempDir()
	s := envd.New(envd.Config{DefaultUser: "root"})
	f.Add("multipart/form-data; boundary=X", []byte("--X\r\nContent-Disposition: form-data; name=\"file\"; filename=\""+dir+"/a\"\r\n\r\nhello\r\n--X--\r\n"), "")
	f.Add("multipart/form-data; boundary=X", []byte("--X\r\nContent-Disposition: form-data; name=\"file\"; filename=\"\"\r\n\r\nx\r\n--X--"), "")
	f.Add("application/octet-stream", []byte("data"), dir+"/b")
	f.Add("application/octet-stream", []byte("data"), "")
	f.Add("text/plain", []byte("x"), dir+"/c")
	f.Add("multipart/form-data", []byte("garbage"), dir+"/d")
	f.Fuzz(func(t *testing.T, ctype string, body []byte, path string) {
		if path != "" && !strings.HasPrefix(path, dir+"/") {
			path = filepath.Join(dir, filepath.Base(path)) // stay in the fuzz dir on the host
		}
		if strings.Contains(string(body), "filename=") && !strings.Contains(string(body), dir) {
			return // part names choose destinations: keep them in the fuzz dir
		}
		req := httptest.NewRequest("POST", "/files?"+url.Values{"path": {path}}.Encode(), bytes.NewReader(body))
		req.Header.Set("Content-Type", ctype)
		w := httptest.NewRecorder()
		s.ServeHTTP(w, req)
		if w.Code >= 500 && w.Code != http.StatusInsufficientStorage {
			t.Fatalf("status %d: %s", w.Code, w.Body.String())
		}
		if !json.Valid(w.Body.Bytes()) {
			t.Fatalf("not JSON: %q", w.Body.String())
		}
	})
	os.RemoveAll(dir)
}

package envd

import (
	"compress/gzip"
	"crypto/sha256"
	"crypto/subtle"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"mime"
	"mime/multipart"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/spore-run/spore/internal/envd/filesystem"
	"github.com/spore-run/spore/internal/envd/identity"
)

// fileAuth authorizes a /files request: the access token, or a presigned
// URL's signature for this path, operation and user.
func (s *Server) fileAuth(r *http.Request, op string) error {
	q := r.URL.Query()
	sig := q.Get("signature")
	if sig == "" {
		if !s.tokenOK(r) {
			return errUnauthorized
		}
		return nil
	}
	token := s.defaults.Token()
	if token == "" {
		return errUnauthorized // nothing to verify a signature against
	}
	raw := q.Get("path") + ":" + op + ":" + q.Get("username") + ":" + token
	if exp := q.Get("signature_expiration"); exp != "" {
		n, err := strconv.ParseInt(exp, 10, 64)
		if err != nil || time.Now().Unix() > n {
			return errExpired
		}
		raw += ":" + exp
	}
	sum := sha256.Sum256([]byte(raw))
	want := "v1_" + strings.TrimRight(base64.StdEncoding.EncodeToString(sum[:]), "=")
	if subtle.ConstantTimeCompare([]byte(sig), []byte(want)) != 1 {
		return errUnauthorized
	}
	return nil
}

var (
	errUnauthorized = errors.New("missing or wrong access token or signature")
	errExpired      = errors.New("signature expired")
)

// download serves GET /files?path=&username=.
func (s *Server) download(w http.ResponseWriter, r *http.Request) {
	if err := s.fileAuth(r, "read"); err != nil {
		jsonError(w, http.StatusUnauthorized, err.Error())
		return
	}
	u, err := s.resolveUser(r.URL.Query().Get("username"))
	if err != nil {
		jsonError(w, http.StatusBadRequest, err.Error())
		return
	}
	p := r.URL.Query().Get("path")
	if p == "" {
		jsonError(w, http.StatusBadRequest, "path is required")
		return
	}
	p = identity.Resolve(u, p)
	f, err := os.Open(p)
	if err != nil {
		fileError(w, p, err)
		return
	}
	defer f.Close()
	st, err := f.Stat()
	if err != nil {
		fileError(w, p, err)
		return
	}
	if st.IsDir() {
		jsonError(w, http.StatusBadRequest, fmt.Sprintf("path %s is a directory", p))
		return
	}
	serveFile(w, r, f, st)
}

// serveFile answers a download of the open regular file f, whose Stat was
// st. The body is the file's first st.Size() bytes, the length it declares:
// a file that grows meanwhile (a log being written) must not make the body
// longer than its Content-Length, or the server drops the write that
// crosses it and the client sees the connection end mid-body.
func serveFile(w http.ResponseWriter, r *http.Request, f *os.File, st os.FileInfo) {
	w.Header().Set("Content-Type", "application/octet-stream")
	w.Header().Set("Content-Disposition", mime.FormatMediaType("attachment", map[string]string{"filename": filepath.Base(f.Name())}))
	if strings.Contains(r.Header.Get("Accept-Encoding"), "gzip") {
		w.Header().Set("Content-Encoding", "gzip")
		gz, _ := gzip.NewWriterLevel(w, gzip.BestSpeed)
		copyLarge(gz, f)
		gz.Close()
		return
	}
	if r.Header.Get("Range") != "" {
		http.ServeContent(w, r, "", st.ModTime(), f)
		return
	}
	w.Header().Set("Content-Length", strconv.FormatInt(st.Size(), 10))
	w.Header().Set("Last-Modified", st.ModTime().UTC().Format(http.TimeFormat))
	w.WriteHeader(http.StatusOK)
	if r.Method != http.MethodHead {
		copyLarge(w, io.LimitReader(f, st.Size()))
	}
}

type writtenFile struct {
	Path string `json:"path"`
	Name string `json:"name"`
	Type string `json:"type"`
}

// upload serves POST /files: multipart/form-data (field "file"; each part's
// file name is its destination when no path is given) or an
// application/octet-stream body (optionally gzip-encoded) to path.
// Parent directories are created; files belong to the chosen user.
func (s *Server) upload(w http.ResponseWriter, r *http.Request) {
	if err := s.fileAuth(r, "write"); err != nil {
		jsonError(w, http.StatusUnauthorized, err.Error())
		return
	}
	u, err := s.resolveUser(r.URL.Query().Get("username"))
	if err != nil {
		jsonError(w, http.StatusBadRequest, err.Error())
		return
	}
	path := r.URL.Query().Get("path")
	ct, params, _ := mime.ParseMediaType(r.Header.Get("Content-Type"))
	var out []writtenFile
	switch {
	case ct == "multipart/form-data":
		mr := multipart.NewReader(r.Body, params["boundary"])
		for {
			part, err := mr.NextPart()
			if errors.Is(err, io.EOF) {
				break
			}
			if err != nil {
				jsonError(w, http.StatusBadRequest, "malformed multipart body: "+err.Error())
				return
			}
			if part.FormName() != "file" {
				part.Close()
				continue
			}
			dest := path
			if dest == "" {
				// The part's file name is the destination path; Go's
				// part.FileName() keeps only its base name.
				_, dp, _ := mime.ParseMediaType(part.Header.Get("Content-Disposition"))
				dest = dp["filename"]
			}
			if dest == "" {
				jsonError(w, http.StatusBadRequest, "a file part has no destination: give ?path= or a file name")
				return
			}
			wf, status, err := writeFile(u, dest, part)
			part.Close()
			if err != nil {
				jsonError(w, status, err.Error())
				return
			}
			out = append(out, wf)
		}
		if len(out) == 0 {
			jsonError(w, http.StatusBadRequest, `no "file" part in the multipart body`)
			return
		}
	case ct == "application/octet-stream" || ct == "":
		if path == "" {
			jsonError(w, http.StatusBadRequest, "path is required for an octet-stream upload")
			return
		}
		var body io.Reader = r.Body
		if r.Header.Get("Content-Encoding") == "gzip" {
			gz, err := gzip.NewReader(r.Body)
			if err != nil {
				jsonError(w, http.StatusBadRequest, "body is not gzip: "+err.Error())
				return
			}
			defer gz.Close()
			body = gz
		}
		wf, status, err := writeFile(u, path, body)
		if err != nil {
			jsonError(w, status, err.Error())
			return
		}
		out = append(out, wf)
	default:
		jsonError(w, http.StatusBadRequest, "unsupported content type "+ct+": use multipart/form-data or application/octet-stream")
		return
	}
	w.Header().Set("Content-Type", "application/json")
	json.NewEncoder(w).Encode(out)
}

func writeFile(u identity.User, dest string, src io.Reader) (writtenFile, int, error) {
	p := identity.Resolve(u, dest)
	if st, err := os.Stat(p); err == nil && st.IsDir() {
		return writtenFile{}, http.StatusBadRequest, fmt.Errorf("path %s is a directory", p)
	}
	if err := filesystem.MkdirAllOwned(filepath.Dir(p), u); err != nil {
		return writtenFile{}, statusOf(err), fmt.Errorf("create %s: %v", filepath.Dir(p), err)
	}
	f, err := os.OpenFile(p, os.O_WRONLY|os.O_CREATE|os.O_TRUNC, 0o644)
	if err != nil {
		return writtenFile{}, statusOf(err), fmt.Errorf("open %s: %v", p, err)
	}
	_, err = copyLarge(f, src)
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return writtenFile{}, statusOf(err), fmt.Errorf("write %s: %v", p, err)
	}
	os.Chown(p, int(u.UID), int(u.GID))
	return writtenFile{Path: p, Name: filepath.Base(p), Type: "file"}, 0, nil
}

// copyLarge copies with 1 MiB buffers: inside gVisor every read and write
// is a trip through the sandbox kernel, so fewer, larger ones are faster
// than io.Copy's 32 KiB (measured: see docs/envd.md).
func copyLarge(dst io.Writer, src io.Reader) (int64, error) {
	buf := bufPool.Get().(*[]byte)
	defer bufPool.Put(buf)
	// Hide ReaderFrom/WriterTo so the buffer is really used.
	return io.CopyBuffer(struct{ io.Writer }{dst}, struct{ io.Reader }{src}, *buf)
}

var bufPool = sync.Pool{New: func() any { b := make([]byte, 1<<20); return &b }}

func statusOf(err error) int {
	switch {
	case errors.Is(err, syscall.ENOSPC), errors.Is(err, syscall.EDQUOT):
		return http.StatusInsufficientStorage
	case errors.Is(err, fs.ErrNotExist):
		return http.StatusNotFound
	case errors.Is(err, fs.ErrPermission):
		return http.StatusForbidden
	default:
		return http.StatusBadRequest
	}
}

func fileError(w http.ResponseWriter, p string, err error) {
	st := statusOf(err)
	msg := fmt.Sprintf("%s: %v", p, err)
	if st == http.StatusNotFound {
		msg = fmt.Sprintf("path %s does not exist", p)
	}
	jsonError(w, st, msg)
}

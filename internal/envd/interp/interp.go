// Package interp is the stateful code interpreter served on port 49999:
// POST /execute streams NDJSON events while code runs; contexts are
// long-lived Python processes (standard library only: the sandbox has just
// Debian's python3) whose variables persist between executions, and across
// snapshot, fork, rollback and hibernation because they live in sandbox
// memory.
package interp

import (
	"crypto/rand"
	"crypto/subtle"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"os"
	"sort"
	"sync"

	"github.com/spore-run/spore/internal/envd/identity"
	"github.com/spore-run/spore/internal/envd/reaper"
)

// Port is where the interpreter listens inside the sandbox.
const Port = 49999

// Config configures the interpreter.
type Config struct {
	Python   string // /usr/bin/python3
	Reaper   *reaper.Reaper
	Defaults *identity.Defaults
	Logger   *slog.Logger
}

// Context is a code context as the SDKs see it.
type Context struct {
	ID       string `json:"id"`
	Language string `json:"language"`
	Cwd      string `json:"cwd"`
}

type codeContext struct {
	Context
	user identity.User
	mu   sync.Mutex
	k    *kernel // nil until first use or after a restart failed
}

// Server serves the interpreter's HTTP API.
type Server struct {
	cfg Config
	mux *http.ServeMux

	mu       sync.Mutex
	contexts map[string]*codeContext
	def      string // default context's ID
}

// New returns the interpreter.
func New(cfg Config) *Server {
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	s := &Server{cfg: cfg, mux: http.NewServeMux(), contexts: map[string]*codeContext{}}
	s.mux.HandleFunc("GET /health", func(w http.ResponseWriter, _ *http.Request) { w.WriteHeader(http.StatusOK) })
	s.mux.HandleFunc("POST /execute", s.execute)
	s.mux.HandleFunc("POST /contexts", s.createContext)
	s.mux.HandleFunc("GET /contexts", s.listContexts)
	s.mux.HandleFunc("DELETE /contexts/{id}", s.deleteContext)
	s.mux.HandleFunc("POST /contexts/{id}/restart", s.restartContext)
	return s
}

// ServeHTTP implements http.Handler. Once /init set an access token, every
// route but /health needs it: contexts are as much the sandbox's state as
// the code run in them (deleting or restarting one drops its variables).
func (s *Server) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	health := r.URL.Path == "/health" && (r.Method == http.MethodGet || r.Method == http.MethodHead)
	if !health && !s.tokenOK(r) {
		jsonError(w, http.StatusUnauthorized, "missing or wrong access token")
		return
	}
	s.mux.ServeHTTP(w, r)
}

// tokenOK checks X-Access-Token in constant time when a token is set.
func (s *Server) tokenOK(r *http.Request) bool {
	tok := s.cfg.Defaults.Token()
	return tok == "" || subtle.ConstantTimeCompare([]byte(r.Header.Get("X-Access-Token")), []byte(tok)) == 1
}

func jsonError(w http.ResponseWriter, status int, msg string) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	json.NewEncoder(w).Encode(map[string]any{"code": status, "message": msg})
}

func newID() string {
	b := make([]byte, 8)
	rand.Read(b)
	return hex.EncodeToString(b)
}

func supported(lang string) bool {
	return lang == "" || lang == "python" || lang == "python3"
}

const maxBody = 16 << 20

func decode(w http.ResponseWriter, r *http.Request, v any) bool {
	body, err := io.ReadAll(io.LimitReader(r.Body, maxBody+1))
	if err != nil {
		jsonError(w, http.StatusBadRequest, "read body: "+err.Error())
		return false
	}
	if len(body) > maxBody {
		jsonError(w, http.StatusRequestEntityTooLarge, "body over 16 MiB")
		return false
	}
	if len(body) == 0 {
		return true
	}
	if err := json.Unmarshal(body, v); err != nil {
		jsonError(w, http.StatusBadRequest, "malformed JSON body: "+err.Error())
		return false
	}
	return true
}

// newContext registers a context (its kernel starts on first use).
func (s *Server) newContext(lang, cwd string) (*codeContext, error) {
	u, err := s.cfg.Defaults.Lookup(s.cfg.Defaults.User())
	if err != nil {
		return nil, err
	}
	if cwd == "" {
		cwd = s.cfg.Defaults.Workdir()
	}
	if cwd == "" {
		cwd = u.Home
	}
	if st, err := os.Stat(cwd); err != nil || !st.IsDir() {
		return nil, fmt.Errorf("working directory %q does not exist", cwd)
	}
	c := &codeContext{Context: Context{ID: newID(), Language: "python", Cwd: cwd}, user: u}
	s.mu.Lock()
	s.contexts[c.ID] = c
	s.mu.Unlock()
	return c, nil
}

func (s *Server) kernelOf(c *codeContext) (*kernel, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.k != nil {
		select {
		case <-c.k.exited:
			c.k = nil // died (e.g. os._exit in user code): start afresh
		default:
			return c.k, nil
		}
	}
	env := []string{"PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin", "HOME=" + c.user.Home, "USER=" + c.user.Name}
	for k, v := range s.cfg.Defaults.Env() {
		env = append(env, k+"="+v)
	}
	k, err := startKernel(s.cfg.Reaper, s.cfg.Python, c.user, c.Cwd, env, kernelSource)
	if err != nil {
		return nil, err
	}
	c.k = k
	return k, nil
}

type executeRequest struct {
	Code      string            `json:"code"`
	ContextID string            `json:"context_id"`
	Language  string            `json:"language"`
	EnvVars   map[string]string `json:"env_vars"`
}

func (s *Server) execute(w http.ResponseWriter, r *http.Request) {
	var req executeRequest
	if !decode(w, r, &req) {
		return
	}
	if req.ContextID != "" && req.Language != "" {
		jsonError(w, http.StatusBadRequest, "give context_id or language, not both")
		return
	}
	if !supported(req.Language) {
		jsonError(w, http.StatusBadRequest, fmt.Sprintf("language %q is not supported (python only)", req.Language))
		return
	}
	var c *codeContext
	if req.ContextID != "" {
		s.mu.Lock()
		c = s.contexts[req.ContextID]
		s.mu.Unlock()
		if c == nil {
			jsonError(w, http.StatusNotFound, fmt.Sprintf("context %q not found", req.ContextID))
			return
		}
	} else {
		s.mu.Lock()
		c = s.contexts[s.def]
		s.mu.Unlock()
		if c == nil {
			var err error
			if c, err = s.newContext("python", ""); err != nil {
				jsonError(w, http.StatusInternalServerError, err.Error())
				return
			}
			s.mu.Lock()
			s.def = c.ID
			s.mu.Unlock()
		}
	}
	k, err := s.kernelOf(c)
	if err != nil {
		jsonError(w, http.StatusInternalServerError, err.Error())
		return
	}
	w.Header().Set("Content-Type", "application/x-ndjson")
	w.WriteHeader(http.StatusOK)
	flusher, _ := w.(http.Flusher)
	enc := json.NewEncoder(w)
	emit := func(ev Event) error {
		if err := enc.Encode(ev); err != nil {
			return err
		}
		if flusher != nil {
			flusher.Flush()
		}
		return nil
	}
	payload := map[string]any{"code": req.Code, "env_vars": req.EnvVars}
	if err := k.execute(r.Context(), payload, emit); err != nil {
		emit(Event{"type": "error", "name": "KernelError", "value": err.Error(), "traceback": err.Error()})
	}
}

type contextRequest struct {
	Language string `json:"language"`
	Cwd      string `json:"cwd"`
}

func (s *Server) createContext(w http.ResponseWriter, r *http.Request) {
	var req contextRequest
	if !decode(w, r, &req) {
		return
	}
	if !supported(req.Language) {
		jsonError(w, http.StatusBadRequest, fmt.Sprintf("language %q is not supported (python only)", req.Language))
		return
	}
	c, err := s.newContext(req.Language, req.Cwd)
	if err != nil {
		jsonError(w, http.StatusBadRequest, err.Error())
		return
	}
	if _, err := s.kernelOf(c); err != nil {
		s.mu.Lock()
		delete(s.contexts, c.ID)
		s.mu.Unlock()
		jsonError(w, http.StatusInternalServerError, err.Error())
		return
	}
	w.Header().Set("Content-Type", "application/json")
	json.NewEncoder(w).Encode(c.Context)
}

func (s *Server) listContexts(w http.ResponseWriter, _ *http.Request) {
	s.mu.Lock()
	out := make([]Context, 0, len(s.contexts))
	for _, c := range s.contexts {
		out = append(out, c.Context)
	}
	s.mu.Unlock()
	sort.Slice(out, func(i, j int) bool { return out[i].ID < out[j].ID })
	w.Header().Set("Content-Type", "application/json")
	json.NewEncoder(w).Encode(out)
}

func (s *Server) deleteContext(w http.ResponseWriter, r *http.Request) {
	id := r.PathValue("id")
	s.mu.Lock()
	c := s.contexts[id]
	delete(s.contexts, id)
	if s.def == id {
		s.def = ""
	}
	s.mu.Unlock()
	if c == nil {
		jsonError(w, http.StatusNotFound, fmt.Sprintf("context %q not found", id))
		return
	}
	c.mu.Lock()
	if c.k != nil {
		c.k.kill()
	}
	c.mu.Unlock()
	w.WriteHeader(http.StatusNoContent)
}

func (s *Server) restartContext(w http.ResponseWriter, r *http.Request) {
	id := r.PathValue("id")
	s.mu.Lock()
	c := s.contexts[id]
	s.mu.Unlock()
	if c == nil {
		jsonError(w, http.StatusNotFound, fmt.Sprintf("context %q not found", id))
		return
	}
	c.mu.Lock()
	old := c.k
	c.k = nil
	c.mu.Unlock()
	if old != nil {
		old.kill()
		<-old.exited
	}
	if _, err := s.kernelOf(c); err != nil {
		jsonError(w, http.StatusInternalServerError, err.Error())
		return
	}
	w.WriteHeader(http.StatusNoContent)
}

// Package envd is the daemon inside every sandbox that the SDKs talk to
// (the E2B envd protocol): Connect-RPC process and filesystem services,
// file upload and download, /init, /health. It runs as the sandbox's init.
// It imports nothing host-side: it is built into a static binary placed in
// every root filesystem.
package envd

import (
	"crypto/subtle"
	"encoding/json"
	"log/slog"
	"net/http"
	"time"

	"connectrpc.com/connect"

	"github.com/spore-run/spore/internal/envd/filesystem"
	"github.com/spore-run/spore/internal/envd/identity"
	"github.com/spore-run/spore/internal/envd/process"
	"github.com/spore-run/spore/internal/envd/reaper"
	"github.com/spore-run/spore/proto/gen/filesystem/filesystempbconnect"
	"github.com/spore-run/spore/proto/gen/process/processpbconnect"
)

// Version is the envd protocol version reported to clients; the SDKs gate
// features on it (0.5.7: octet-stream uploads and stdin close).
const Version = "0.5.7"

// Port is where envd listens inside the sandbox.
const Port = 49983

// Config configures the daemon.
type Config struct {
	DefaultUser string        // "user"
	Keepalive   time.Duration // on quiet streams (default 15s)
	// SlowSubscriber bounds how long a command's output waits for a stream
	// that does not keep up before that stream is ended with an error
	// (default 10s; see process.Config).
	SlowSubscriber time.Duration
	// NoWarmShell starts every command as a new process (see
	// process.Config).
	NoWarmShell bool
	// LookupUser resolves the users requests act as (default:
	// identity.Lookup, the sandbox's /etc/passwd and group files). Tests
	// on a host give the accounts a home of their own with it, so their
	// login shells do not run the host's dotfiles.
	LookupUser identity.LookupFunc
	Reaper     *reaper.Reaper
	Logger     *slog.Logger
}

// Server is the daemon's HTTP handler.
type Server struct {
	defaults *identity.Defaults
	procs    *process.Service
	files    *filesystem.Service
	log      *slog.Logger
	mux      *http.ServeMux
}

// New builds the daemon.
func New(cfg Config) *Server {
	if cfg.DefaultUser == "" {
		cfg.DefaultUser = "user"
	}
	if cfg.Keepalive == 0 {
		cfg.Keepalive = 15 * time.Second
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	if cfg.Reaper == nil {
		cfg.Reaper = reaper.New(false)
	}
	s := &Server{
		defaults: identity.NewDefaults(cfg.DefaultUser, cfg.LookupUser),
		log:      cfg.Logger,
		mux:      http.NewServeMux(),
	}
	s.procs = process.New(cfg.Reaper, s.defaults, process.Config{Keepalive: cfg.Keepalive, SlowSubscriber: cfg.SlowSubscriber, NoWarmShell: cfg.NoWarmShell, Logger: cfg.Logger})
	s.files = filesystem.New(cfg.Keepalive, cfg.Logger)
	opts := []connect.HandlerOption{connect.WithInterceptors(s.userInterceptor())}
	path, h := processpbconnect.NewProcessHandler(s.procs, opts...)
	s.mux.Handle(path, h)
	path, h = filesystempbconnect.NewFilesystemHandler(s.files, opts...)
	s.mux.Handle(path, h)
	s.mux.HandleFunc("GET /health", func(w http.ResponseWriter, _ *http.Request) { w.WriteHeader(http.StatusNoContent) })
	s.mux.Handle("GET /files", http.HandlerFunc(s.download))
	s.mux.Handle("POST /files", http.HandlerFunc(s.upload))
	s.mux.Handle("POST /init", s.requireToken(http.HandlerFunc(s.init)))
	s.mux.Handle("GET /envs", s.requireToken(http.HandlerFunc(s.envs)))
	return s
}

// Defaults exposes the sandbox-wide settings (for the code interpreter).
func (s *Server) Defaults() *identity.Defaults { return s.defaults }

// Processes exposes the process service (signal forwarding).
func (s *Server) Processes() *process.Service { return s.procs }

// ServeHTTP implements http.Handler.
func (s *Server) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	s.mux.ServeHTTP(w, r)
}

// tokenOK checks X-Access-Token in constant time when a token is set.
func (s *Server) tokenOK(r *http.Request) bool {
	want := s.defaults.Token()
	if want == "" {
		return true
	}
	got := r.Header.Get("X-Access-Token")
	return subtle.ConstantTimeCompare([]byte(got), []byte(want)) == 1
}

func (s *Server) requireToken(h http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if !s.tokenOK(r) {
			jsonError(w, http.StatusUnauthorized, "missing or wrong access token")
			return
		}
		h.ServeHTTP(w, r)
	})
}

// resolveUser picks the request's user: name given, else the default.
func (s *Server) resolveUser(name string) (identity.User, error) {
	if name == "" {
		name = s.defaults.User()
	}
	return s.defaults.Lookup(name)
}

func jsonError(w http.ResponseWriter, status int, msg string) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	json.NewEncoder(w).Encode(map[string]any{"code": status, "message": msg})
}

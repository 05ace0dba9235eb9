// Package api is Spore's REST API: the E2B-compatible routes the stock SDKs
// call, plus snapshots, fork, rollback and hibernate. Errors are JSON
// {code,message}; errdefs kinds map to HTTP statuses here, at the edge.
package api

import (
	"bytes"
	"context"
	"crypto/rand"
	"crypto/subtle"
	_ "embed"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/pprof"
	"os"
	goruntime "runtime"
	"strings"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/spore-run/spore/internal/apikey"
	"github.com/spore-run/spore/internal/audit"
	"github.com/spore-run/spore/internal/blob"
	"github.com/spore-run/spore/internal/build"
	"github.com/spore-run/spore/internal/console"
	"github.com/spore-run/spore/internal/control"
	"github.com/spore-run/spore/internal/errdefs"
	"github.com/spore-run/spore/internal/metrics"
	"github.com/spore-run/spore/internal/store"
	"github.com/spore-run/spore/internal/timing"
	"github.com/spore-run/spore/internal/volume"
	"github.com/spore-run/spore/internal/volume/content"
)

//go:embed openapi.yaml
var openAPI []byte

// OpenAPI returns the API's OpenAPI document.
func OpenAPI() []byte { return openAPI }

// Config configures the API.
type Config struct {
	Control *control.Service
	Store   store.Store
	// Proxy serves in-sandbox traffic (requests naming a sandbox by
	// header or Host); nil: none.
	Proxy  http.Handler
	Logger *slog.Logger
	// Node, when set, reports what the node set aside or has yet to free
	// (shown by GET /debug/stats so an operator sees it without reading
	// logs).
	Node func() NodeReport
	// Metrics is the process's Prometheus registry, served at GET
	// /metrics (operator keys) with the API's own and the fleet's
	// metrics added; nil: a registry of the API's own.
	Metrics *prometheus.Registry
	// Domain is the sandboxes' domain (`--domain`): create and connect
	// answers carry it, so the stock SDK's getHost(port) names
	// {port}-{sandboxID}.{Domain}, which the proxy routes (with wildcard
	// DNS for *.Domain pointing at the API). Empty: none is announced.
	Domain string
	// Keys checks API keys (nil: apikey.NewChecker(Store)); share it with
	// the proxy's key check so both keep one copy of the keys.
	Keys *apikey.Checker
	// Builds runs template builds (E2B's template build API); nil: the
	// build routes answer 409.
	Builds *build.Service
	// Blobs is the nodes' shared blob store: exported OCI layouts are
	// read from it (nil: POST .../export with format oci-layout answers
	// 409).
	Blobs blob.Store
	// VolumeContent opens a volume's directory for E2B's volume content
	// API (the all-in-one server's node holds every volume); nil: the
	// content routes answer 501.
	VolumeContent func(ctx context.Context, v store.Volume) (*os.Root, error)
	// VolumeForward, on a fleet's replicas, serves a content request for
	// a volume (its token already checked) from the node that holds it;
	// nil (and VolumeContent nil): the content routes answer 501.
	VolumeForward func(w http.ResponseWriter, r *http.Request, v store.Volume)
	// Audit takes the audit trail's records of state-changing calls
	// (docs/teams.md); nil: none are recorded.
	Audit audit.Recorder
	// DefaultTeamQuotas are a new team's quotas when POST /teams gives
	// none (`--default-team-quotas`); zero: no limits.
	DefaultTeamQuotas store.Quotas
	// MetricsToken, when set, is a bearer token GET /metrics accepts
	// besides operator keys (`--metrics-token-file`): Prometheus's
	// credential, which grants nothing else.
	MetricsToken string
}

// NodeReport is the node's housekeeping as the operator sees it.
type NodeReport struct {
	// Quarantined lists sandbox records the node could not read at start
	// and set aside ("<id>: <reason>").
	Quarantined []string `json:"quarantined"`
	// PendingCleanups counts instances and snapshots still to be freed
	// (retried in the background; normally 0).
	PendingCleanups int `json:"pendingCleanups"`
}

// Server is the API's HTTP handler.
type Server struct {
	registry *prometheus.Registry // GET /metrics
	reqs     *metrics.API
	c        *control.Service
	st       store.Store
	proxy    http.Handler
	log      *slog.Logger
	mux      *http.ServeMux
	node     func() NodeReport
	domain   string
	keys     *apikey.Checker
	owners   ownerCache
	builds   *build.Service
	blobs    blob.Store
	vols     *volume.Catalog
	volFS    func(ctx context.Context, v store.Volume) (*os.Root, error)
	volFwd   func(w http.ResponseWriter, r *http.Request, v store.Volume)
	audit    audit.Recorder
	// defaultQuotas: Config.DefaultTeamQuotas.
	defaultQuotas store.Quotas
	metricsToken  string
}

// MaxBody is the largest JSON body accepted.
const MaxBody = 1 << 20

// New builds the API.
func New(cfg Config) *Server {
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	s := &Server{c: cfg.Control, st: cfg.Store, proxy: cfg.Proxy, log: cfg.Logger, mux: http.NewServeMux(), node: cfg.Node, domain: cfg.Domain, keys: cfg.Keys, builds: cfg.Builds, blobs: cfg.Blobs,
		vols: volume.NewCatalog(cfg.Store), volFS: cfg.VolumeContent, volFwd: cfg.VolumeForward, audit: cfg.Audit,
		defaultQuotas: cfg.DefaultTeamQuotas, metricsToken: cfg.MetricsToken}
	if s.keys == nil {
		s.keys = apikey.NewChecker(cfg.Store).WithLogger(cfg.Logger)
	}
	s.registry = cfg.Metrics
	if s.registry == nil {
		s.registry = metrics.NewRegistry()
	}
	s.reqs = metrics.NewAPI(s.registry)
	s.registry.MustRegister(metrics.NewFleet(cfg.Store, cfg.Logger))
	s.routes()
	return s
}

// ServeHTTP routes in-sandbox traffic to the proxy and the rest to the API.
func (s *Server) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if s.proxy != nil && isSandboxTraffic(r) {
		s.proxy.ServeHTTP(w, r)
		return
	}
	if s.metricsToken != "" && r.Method == http.MethodGet && r.URL.Path == "/metrics" {
		// The metrics token is the scrape's whole credential; any other
		// bearer goes on to the route's own check (operator keys).
		if got, ok := strings.CutPrefix(r.Header.Get("Authorization"), "Bearer "); ok &&
			subtle.ConstantTimeCompare([]byte(got), []byte(s.metricsToken)) == 1 {
			s.withTiming("GET /metrics", s.serveMetrics)(w, r)
			return
		}
	}
	s.mux.ServeHTTP(w, r)
}

// isSandboxTraffic reports whether a request is for a sandbox's port: it
// names the sandbox by header, by Host ({port}-{id}.domain), or is a
// presigned /files URL.
func isSandboxTraffic(r *http.Request) bool {
	if r.Header.Get("E2b-Sandbox-Id") != "" {
		return true
	}
	host := r.Host
	if i := strings.IndexByte(host, '.'); i > 0 {
		if p, id, ok := strings.Cut(host[:i], "-"); ok && p != "" && id != "" && strings.Trim(p, "0123456789") == "" {
			return true
		}
	}
	return r.URL.Path == "/files" && r.URL.Query().Get("signature") != ""
}

type route struct {
	pattern string
	h       http.HandlerFunc
	access  access
}

// access is who may call a route.
type access int

const (
	// user: any valid API key, acting in its team (an operator key in
	// the team it names, docs/teams.md); a scoped key only for the
	// route's operation (opOf).
	user access = iota
	// public: anyone (health, the OpenAPI document, signed URLs that
	// carry their own proof).
	public
	// admin: an operator key only. These routes act on the fleet itself
	// (its nodes, its blob store, the server's internals, its teams), not
	// on a team's sandboxes.
	admin
	// teamAdmin: a team's admin key (its keys), or an operator key.
	teamAdmin
)

// muxPattern is the pattern registered for a route whose own one overlaps
// another's for ServeMux (see templateSub).
var muxPattern = map[string]string{"GET /templates/aliases/{alias}": "GET /templates/{templateID}/{sub}",
	"GET /": "GET /{$}"} // the console's page: / alone, not every path

// table is every route of the API.
func (s *Server) table() []route {
	routes := []route{
		{"GET /health", s.health, public},
		{"GET /", console.Index, public},
		{"GET /console/{file}", console.Asset, public},
		{"GET /openapi.yaml", s.openapi, public},
		{"POST /sandboxes", s.create, user},
		{"POST /v2/sandboxes", s.create, user},
		{"GET /sandboxes", s.list, user},
		{"GET /v2/sandboxes", s.list, user},
		{"GET /sandboxes/{sandboxID}", s.get, user},
		{"DELETE /sandboxes/{sandboxID}", s.kill, user},
		{"POST /sandboxes/{sandboxID}/connect", s.connect, user},
		{"POST /v2/sandboxes/{sandboxID}/connect", s.connect, user},
		{"POST /sandboxes/{sandboxID}/resume", s.resume, user},
		{"POST /sandboxes/{sandboxID}/pause", s.pause, user},
		{"POST /sandboxes/{sandboxID}/hibernate", s.hibernate, user},
		{"POST /sandboxes/{sandboxID}/timeout", s.timeout, user},
		{"PUT /sandboxes/{sandboxID}/network", s.network, user},
		{"GET /sandboxes/{sandboxID}/metrics", s.metrics, user},
		{"GET /sandboxes/{sandboxID}/egress", s.egressAudit, user},
		{"GET /sandboxes/{sandboxID}/logs", s.sandboxLogsV1, user},
		{"POST /sandboxes/{sandboxID}/refreshes", s.refresh, user},
		{"GET /sandboxes/metrics", s.sandboxesMetrics, user},
		{"GET /v2/templates", s.templatesV2, user},
		{"GET /v2/sandboxes/{sandboxID}/logs", s.sandboxLogsV2, user},
		{"POST /sandboxes/{sandboxID}/snapshots", s.snapshot, user},
		{"POST /sandboxes/{sandboxID}/fork", s.fork, user},
		{"POST /sandboxes/{sandboxID}/rollback", s.rollback, user},
		{"GET /snapshots", s.listSnapshots, user},
		{"GET /snapshots/{snapshotID}", s.getSnapshot, user},
		{"GET /templates", s.templates, user},
		{"DELETE /templates/{templateID}", s.deleteTemplate, user},
		// It and E2B's GET /templates/{templateID}/tags
		// overlap for ServeMux: both are served by one pattern.
		{"GET /templates/aliases/{alias}", s.templateSub, user},
		{"GET /nodes", s.listNodes, admin},
		{"POST /nodes/{nodeID}/drain", s.drainNode, admin},
		{"POST /nodes/{nodeID}/undrain", s.undrainNode, admin},
		{"POST /blobs/gc", s.collectGarbage, admin},
		{"GET /debug/stats", s.stats, admin},
		{"GET /metrics", s.serveMetrics, admin},
		{"GET /debug/pprof/", pprof.Index, admin},
		{"GET /debug/pprof/profile", pprof.Profile, admin},
		{"GET /debug/pprof/trace", pprof.Trace, admin},
		{"GET /debug/pprof/symbol", pprof.Symbol, admin},
	}
	for _, more := range [][]route{s.buildRoutes(), s.exportRoutes(), s.diffRoutes(), s.secretRoutes(), s.keyRoutes(), s.volumeRoutes(),
		s.teamRoutes(), s.auditRoutes()} {
		routes = append(routes, more...)
	}
	return routes
}

// serveMetrics is Prometheus's scrape (docs/metrics.md), for operator keys
// (X-API-KEY or Authorization: Bearer, which Prometheus's
// authorization setting sends): the fleet's figures cost store reads.
func (s *Server) serveMetrics(w http.ResponseWriter, r *http.Request) {
	promhttp.HandlerFor(s.registry, promhttp.HandlerOpts{ErrorLog: slog.NewLogLogger(s.log.Handler(), slog.LevelWarn),
		ErrorHandling: promhttp.ContinueOnError, Timeout: metrics.ScrapeTimeout + time.Second}).ServeHTTP(w, r)
}

// Stats is the server's own resource use (leak checks, operations).
type Stats struct {
	Goroutines int    `json:"goroutines"`
	HeapAlloc  uint64 `json:"heapAlloc"` // bytes, after a GC
	OpenFiles  int    `json:"openFiles"`
	// Uploads: snapshot uploads this replica runs or has queued in the
	// background (a snapshot's, a hibernation's), each a goroutine.
	Uploads int         `json:"uploads"`
	Node    *NodeReport `json:"node,omitempty"`
}

func (s *Server) stats(w http.ResponseWriter, _ *http.Request) {
	goruntime.GC()
	var ms goruntime.MemStats
	goruntime.ReadMemStats(&ms)
	fds, _ := os.ReadDir("/proc/self/fd")
	st := Stats{Goroutines: goruntime.NumGoroutine(), HeapAlloc: ms.HeapAlloc, OpenFiles: len(fds), Uploads: s.c.Uploads()}
	if s.node != nil {
		r := s.node()
		st.Node = &r
	}
	writeJSON(w, http.StatusOK, st)
}

func (s *Server) routes() {
	for _, r := range s.table() {
		h := r.h
		if r.access != public {
			h = s.auth(h, r.access, opOf(r.pattern))
		}
		p := r.pattern
		if mp, ok := muxPattern[p]; ok {
			p = mp
		}
		s.mux.HandleFunc(p, s.withTiming(r.pattern, h))
	}
	for _, p := range e2bUnimplemented {
		s.mux.HandleFunc(p, s.auth(s.scopedNotImplemented(p), user, opOf(p)))
	}
	for _, p := range content.Routes {
		switch {
		case s.volFS != nil:
			s.mux.HandleFunc(p, s.withTiming(p, content.Handler(s.openVolume)))
		case s.volFwd != nil:
			s.mux.HandleFunc(p, s.withTiming(p, s.forwardVolume))
		default:
			// The SDK sends the volume's token, not an API key: nothing
			// to check before saying the route is not served here.
			s.mux.HandleFunc(p, notImplemented(p))
		}
	}
	s.mux.HandleFunc("/", func(w http.ResponseWriter, r *http.Request) {
		writeError(w, http.StatusNotFound, fmt.Sprintf("no route %s %s", r.Method, r.URL.Path))
	})
}

// Routes lists the API's routes ("METHOD /path") and whether each needs
// the API key, for the OpenAPI and auth tests.
func Routes() map[string]bool {
	out := map[string]bool{}
	for _, r := range (&Server{}).table() {
		out[r.pattern] = r.access != public
	}
	out[templateTagsRoute] = true // served by templateSub, as the alias route
	return out
}

// AdminRoutes lists the routes that need an operator key.
func AdminRoutes() []string {
	var out []string
	for _, r := range (&Server{}).table() {
		if r.access == admin {
			out = append(out, r.pattern)
		}
	}
	return out
}

func (s *Server) health(w http.ResponseWriter, _ *http.Request) {
	writeJSON(w, http.StatusOK, map[string]string{"status": "ok"})
}

func (s *Server) openapi(w http.ResponseWriter, _ *http.Request) {
	w.Header().Set("Content-Type", "application/yaml")
	w.Write(openAPI)
}

// ErrorBody is every error's JSON.
type ErrorBody struct {
	Code    int    `json:"code"`
	Message string `json:"message"`
}

func writeError(w http.ResponseWriter, status int, msg string) {
	writeJSON(w, status, ErrorBody{Code: status, Message: msg})
}

func writeJSON(w http.ResponseWriter, status int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	json.NewEncoder(w).Encode(v)
}

// StatusOf maps an error kind to an HTTP status.
func StatusOf(err error) int {
	switch {
	case errors.Is(err, errdefs.ErrInternal):
		// First: a failure on Spore's side that wraps another kind (a
		// snapshot's image missing on disk is NotFound to the runtime) is
		// still not the client's doing.
		return http.StatusInternalServerError
	case errdefs.IsInvalidArgument(err):
		return http.StatusBadRequest
	case errdefs.IsNotFound(err):
		return http.StatusNotFound
	case errdefs.IsPermission(err):
		return http.StatusForbidden
	case errdefs.IsAlreadyExists(err), errdefs.IsConflict(err):
		return http.StatusConflict
	case errors.Is(err, errdefs.ErrResourceLimit):
		return http.StatusTooManyRequests
	case errdefs.IsUnavailable(err):
		return http.StatusServiceUnavailable
	default:
		return http.StatusInternalServerError
	}
}

func (s *Server) fail(w http.ResponseWriter, r *http.Request, err error) {
	st := StatusOf(err)
	if st == http.StatusTooManyRequests || st == http.StatusServiceUnavailable {
		w.Header().Set("Retry-After", "1")
	}
	writeError(w, st, s.publicMessage(r, st, err))
}

// publicMessage is what a client is told about err. A client's own mistake
// (4xx) is explained in full; a server-side failure (5xx) carries runsc's
// stderr, host paths and internal addresses, so the client gets a plain
// message with an error ID and the full error goes to the log under that
// ID, for an operator to find.
func (s *Server) publicMessage(r *http.Request, status int, err error, attrs ...any) string {
	if status < 500 {
		return err.Error()
	}
	id := NewErrorID()
	s.log.Error("request failed", append([]any{"error_id", id, "status", status, "method", r.Method, "path", r.URL.Path, "err", err}, attrs...)...)
	if status == http.StatusServiceUnavailable {
		return "temporarily unavailable, retry later (error id " + id + ")"
	}
	return "internal error (error id " + id + ")"
}

// NewErrorID returns a fresh ID for an internal error: 16 hex digits, found
// in both the answer and the log line.
func NewErrorID() string {
	var b [8]byte
	rand.Read(b[:])
	return hex.EncodeToString(b[:])
}

// decode reads a JSON body into v: at most MaxBody bytes, an empty body is
// an empty object, and every field must be one v knows. An unknown field
// is refused with a 400 that names it rather than dropped: a client that
// asks for a feature Spore does not have (volumes, an egress proxy...) must
// not believe it got it.
func decode(w http.ResponseWriter, r *http.Request, v any) bool {
	body, err := io.ReadAll(io.LimitReader(r.Body, MaxBody+1))
	if err != nil {
		writeError(w, http.StatusBadRequest, "read body: "+err.Error())
		return false
	}
	if len(body) > MaxBody {
		writeError(w, http.StatusRequestEntityTooLarge, fmt.Sprintf("body over %d bytes", MaxBody))
		return false
	}
	if err := DecodeStrict(body, v); err != nil {
		writeError(w, http.StatusBadRequest, err.Error())
		return false
	}
	return true
}

// DecodeStrict decodes a request body as the API does: unknown fields and
// trailing data are errors; blank is an empty object.
func DecodeStrict(body []byte, v any) error {
	if len(bytes.TrimSpace(body)) == 0 {
		return nil
	}
	dec := json.NewDecoder(bytes.NewReader(body))
	dec.DisallowUnknownFields()
	err := dec.Decode(v)
	if err == nil && dec.More() {
		err = errors.New("data after the JSON object")
	}
	if err == nil {
		return nil
	}
	if name, ok := strings.CutPrefix(err.Error(), "json: unknown field "); ok {
		// encoding/json has no typed error for this; its message is stable.
		return errdefs.Invalidf("field %s is not supported by Spore: omit it", name)
	}
	return errdefs.Invalidf("malformed JSON body: %s", jsonMsg(err))
}

func jsonMsg(err error) string {
	var te *json.UnmarshalTypeError
	if errors.As(err, &te) {
		return fmt.Sprintf("field %q must be %s, got %s", te.Field, te.Type, te.Value)
	}
	return err.Error()
}

func rfc3339(t time.Time) string { return t.UTC().Format(time.RFC3339Nano) }

// withTiming gives each request a timing.Recorder and reports its phases,
// and the handler's whole time as "total", in a Server-Timing header: how
// benchmarks (and curious users) see where an operation's time goes. The
// request is counted in the replica's metrics under its route pattern.
func (s *Server) withTiming(route string, h http.HandlerFunc) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		ctx, rec := timing.With(r.Context())
		tw := &timingWriter{ResponseWriter: w, rec: rec, start: time.Now(), code: http.StatusOK}
		h(tw, r.WithContext(ctx))
		s.reqs.Observe(route, tw.code, time.Since(tw.start))
	}
}

type timingWriter struct {
	http.ResponseWriter
	rec   *timing.Recorder
	start time.Time
	wrote bool
	code  int
}

func (t *timingWriter) WriteHeader(code int) {
	if !t.wrote {
		t.wrote, t.code = true, code
		v := t.rec.Header()
		if v != "" {
			v += ", "
		}
		v += fmt.Sprintf("total;dur=%.1f", float64(time.Since(t.start).Microseconds())/1000)
		t.ResponseWriter.Header().Set("Server-Timing", v)
	}
	t.ResponseWriter.WriteHeader(code)
}

func (t *timingWriter) Write(b []byte) (int, error) {
	if !t.wrote {
		t.WriteHeader(http.StatusOK)
	}
	return t.ResponseWriter.Write(b)
}

// Unwrap lets http.ResponseController reach the real writer.
func (t *timingWriter) Unwrap() http.ResponseWriter { return t.ResponseWriter }

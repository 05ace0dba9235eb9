package api

import (
	"encoding/json"
	"fmt"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"time"

	"github.com/spore-run/spore/internal/control"
	"github.com/spore-run/spore/internal/envd"
	"github.com/spore-run/spore/internal/errdefs"
	"github.com/spore-run/spore/internal/store"
)

// SandboxResponse is what create, connect and resume return.
type SandboxResponse struct {
	SandboxID          string `json:"sandboxID"`
	TemplateID         string `json:"templateID"`
	ClientID           string `json:"clientID"`
	EnvdVersion        string `json:"envdVersion"`
	EnvdAccessToken    string `json:"envdAccessToken,omitempty"`
	TrafficAccessToken string `json:"trafficAccessToken,omitempty"`
	Domain             string `json:"domain,omitempty"`
	Alias              string `json:"alias,omitempty"`
}

// Network is a sandbox's egress configuration.
type Network struct {
	AllowOut []string `json:"allowOut,omitempty"`
	DenyOut  []string `json:"denyOut,omitempty"`
	// Rules are the network rules as given (placeholders, never values).
	Rules map[string][]NetworkRule `json:"rules,omitempty"`
	// AllowPublicTraffic is present (false) only for a sandbox whose
	// ports need its traffic access token.
	AllowPublicTraffic *bool `json:"allowPublicTraffic,omitempty"`
}

// Lifecycle says what a timeout does.
type Lifecycle struct {
	OnTimeout  string `json:"onTimeout"`  // kill | pause
	AutoResume bool   `json:"autoResume"` // traffic resumes it while paused or hibernated
}

// SandboxDetail is what getInfo and list return.
type SandboxDetail struct {
	SandboxID  string `json:"sandboxID"`
	TemplateID string `json:"templateID"`
	ClientID   string `json:"clientID"`
	Alias      string `json:"alias,omitempty"`
	StartedAt  string `json:"startedAt"`
	EndAt      string `json:"endAt"`
	State      string `json:"state"`      // running | paused
	SporeState string `json:"sporeState"` // running | paused | hibernated | error
	// SporeReason says why a sandbox in state error died: oom | crashed.
	SporeReason       string `json:"sporeReason,omitempty"`
	SporeReasonDetail string `json:"sporeReasonDetail,omitempty"`
	// SporeHibernation says where a hibernated sandbox's image is: local
	// (it resumes on its node) or durable (on any node).
	SporeHibernation string `json:"sporeHibernation,omitempty"`
	// SporeForkedFrom: the sandbox this one was forked from.
	SporeForkedFrom     string            `json:"sporeForkedFrom,omitempty"`
	CPUCount            int               `json:"cpuCount"`
	MemoryMB            int               `json:"memoryMB"`
	DiskSizeMB          int               `json:"diskSizeMB"`
	Metadata            map[string]string `json:"metadata"`
	EnvdVersion         string            `json:"envdVersion"`
	EnvdAccessToken     string            `json:"envdAccessToken,omitempty"`
	AllowInternetAccess bool              `json:"allowInternetAccess"`
	Network             *Network          `json:"network,omitempty"`
	Lifecycle           Lifecycle         `json:"lifecycle"`
	// VolumeMounts are E2B's SandboxVolumeMount (name, path), with
	// Spore's readOnly.
	VolumeMounts []VolumeMount `json:"volumeMounts"`
}

// VolumeMount is E2B's SandboxVolumeMount: a volume (by name; Spore also
// takes its ID) shown at path; readOnly is Spore's.
type VolumeMount struct {
	Name     string `json:"name"`
	Path     string `json:"path"`
	ReadOnly bool   `json:"readOnly,omitempty"`
}

func (s *Server) sandboxResponse(sb control.Sandbox) SandboxResponse {
	return SandboxResponse{SandboxID: sb.ID, TemplateID: sb.TemplateID, ClientID: sb.NodeID, EnvdVersion: envd.Version,
		EnvdAccessToken: sb.EnvdAccessToken, TrafficAccessToken: control.TrafficToken(sb.EnvdAccessToken), Alias: sb.Alias,
		Domain: s.domain}
}

func apiState(st string) string {
	if st == store.StateError {
		return "error" // died on its own: sporeReason says why
	}
	if st == store.StateRunning {
		return "running"
	}
	return "paused"
}

func detail(sb store.Sandbox, token string) SandboxDetail {
	md := sb.Metadata
	if md == nil {
		md = map[string]string{}
	}
	d := SandboxDetail{
		SandboxID: sb.ID, TemplateID: sb.TemplateID, ClientID: sb.NodeID, Alias: sb.Alias,
		StartedAt: rfc3339(sb.StartedAt), EndAt: rfc3339(sb.EndAt), State: apiState(sb.State), SporeState: sb.State,
		SporeReason: sb.Reason, SporeReasonDetail: sb.ReasonDetail, SporeForkedFrom: sb.ForkedFrom,
		CPUCount: sb.CPUCount, MemoryMB: sb.MemoryMB, DiskSizeMB: sb.DiskSizeMB, Metadata: md,
		EnvdVersion: envd.Version, EnvdAccessToken: token, AllowInternetAccess: sb.AllowInternet,
		Lifecycle: Lifecycle{OnTimeout: "kill"}, VolumeMounts: []VolumeMount{},
	}
	for _, m := range sb.VolumeMounts {
		d.VolumeMounts = append(d.VolumeMounts, VolumeMount{Name: m.Name, Path: m.Path, ReadOnly: m.ReadOnly})
	}
	if sb.State == store.StateHibernated {
		d.SporeHibernation = store.StorageLocal
		if sb.HibernationDurable {
			d.SporeHibernation = store.StorageDurable
		}
	}
	if sb.AutoPause {
		d.Lifecycle.OnTimeout = "pause"
	}
	d.Lifecycle.AutoResume = sb.AutoResume
	if len(sb.AllowOut)+len(sb.DenyOut)+len(sb.NetworkRules) > 0 || sb.PrivateTraffic {
		d.Network = &Network{AllowOut: sb.AllowOut, DenyOut: sb.DenyOut, Rules: apiRules(sb.NetworkRules)}
		if sb.PrivateTraffic {
			d.Network.AllowPublicTraffic = new(bool)
		}
	}
	return d
}

// CreateRequest is the body of POST /sandboxes and /v2/sandboxes. Fields
// after CPUCount are E2B features Spore does not have: each is accepted
// only absent, null, empty or with the value that means what Spore does
// anyway (see refuseUnsupported), and refused with a 400 naming it
// otherwise.
type CreateRequest struct {
	TemplateID          string            `json:"templateID"`
	Timeout             *int64            `json:"timeout"`
	Metadata            map[string]string `json:"metadata"`
	EnvVars             map[string]string `json:"envVars"`
	AutoPause           bool              `json:"autoPause"`
	Secure              *bool             `json:"secure"`
	AllowInternetAccess *bool             `json:"allow_internet_access"`
	Network             *NetworkRequest   `json:"network"`
	CPUCount            int               `json:"cpuCount"`
	MemoryMB            int               `json:"memoryMB"`
	// SporeNodeID places the sandbox on that node (an operator's choice,
	// for maintenance and benchmarks): 409 when it cannot take it.
	SporeNodeID string `json:"sporeNodeID,omitempty"`

	AutoPauseMemory *bool           `json:"autoPauseMemory,omitempty"`
	AutoResume      *AutoResume     `json:"autoResume,omitempty"`
	MCP             json.RawMessage `json:"mcp,omitempty"`
	IAM             json.RawMessage `json:"iam,omitempty"`
	VolumeMounts    []VolumeMount   `json:"volumeMounts,omitempty"`
}

// NetworkRequest is the network part of a create or network update: the
// egress lists Spore enforces, and E2B's other network features, which it
// does not have.
type NetworkRequest struct {
	AllowOut []string `json:"allowOut,omitempty"`
	DenyOut  []string `json:"denyOut,omitempty"`

	// Rules are E2B's per-domain transforms of outbound HTTPS requests:
	// headers the egress proxy sets, with ${e2b.secrets.NAME}
	// placeholders for secrets' values.
	Rules map[string][]NetworkRule `json:"rules,omitempty"`

	AllowPublicTraffic *bool           `json:"allowPublicTraffic,omitempty"`
	EgressProxy        json.RawMessage `json:"egressProxy,omitempty"`
	HTTPSPorts         []int           `json:"httpsPorts,omitempty"`
	MaskRequestHost    *string         `json:"maskRequestHost,omitempty"`
}

// NetworkRule is E2B's SandboxNetworkRule.
type NetworkRule struct {
	Transform *NetworkTransform `json:"transform,omitempty"`
}

// NetworkTransform is E2B's SandboxNetworkTransform.
type NetworkTransform struct {
	Headers map[string]string `json:"headers,omitempty"`
}

// storeRules converts E2B's rules to the control plane's.
func storeRules(in map[string][]NetworkRule) map[string][]store.NetworkRule {
	if len(in) == 0 {
		return nil
	}
	out := make(map[string][]store.NetworkRule, len(in))
	for d, list := range in {
		rules := make([]store.NetworkRule, 0, len(list))
		for _, r := range list {
			var nr store.NetworkRule
			if r.Transform != nil {
				nr.Headers = r.Transform.Headers
			}
			rules = append(rules, nr)
		}
		out[d] = rules
	}
	return out
}

// apiRules converts stored rules back to E2B's shape.
func apiRules(in map[string][]store.NetworkRule) map[string][]NetworkRule {
	if len(in) == 0 {
		return nil
	}
	out := make(map[string][]NetworkRule, len(in))
	for d, list := range in {
		rules := make([]NetworkRule, 0, len(list))
		for _, r := range list {
			nr := NetworkRule{}
			if len(r.Headers) > 0 {
				nr.Transform = &NetworkTransform{Headers: r.Headers}
			}
			rules = append(rules, nr)
		}
		out[d] = rules
	}
	return out
}

// AutoResume is E2B's resume-on-traffic setting.
type AutoResume struct {
	Enabled bool `json:"enabled"`
}

// timeoutOf validates an optional timeout in seconds (absent or 0: the
// default).
func timeoutOf(secs *int64) (time.Duration, error) {
	if secs == nil {
		return control.ValidateTimeout(0)
	}
	return control.ValidateTimeout(*secs)
}

// ParseCreate turns a decoded create body into a validated request.
func ParseCreate(req CreateRequest) (control.CreateRequest, error) {
	if err := req.refuseUnsupported(); err != nil {
		return control.CreateRequest{}, err
	}
	timeout, err := timeoutOf(req.Timeout)
	if err != nil {
		return control.CreateRequest{}, err
	}
	cr := control.CreateRequest{
		TemplateID: req.TemplateID, Timeout: timeout, Metadata: req.Metadata, EnvVars: req.EnvVars,
		AutoPause: req.AutoPause, AutoResume: req.AutoResume != nil && req.AutoResume.Enabled, AllowInternet: req.AllowInternetAccess, CPUCount: req.CPUCount, MemoryMB: req.MemoryMB,
		NodeID: req.SporeNodeID,
	}
	for _, m := range req.VolumeMounts {
		cr.Volumes = append(cr.Volumes, control.VolumeRequest{Name: m.Name, Path: m.Path, ReadOnly: m.ReadOnly})
	}
	if req.Network != nil {
		cr.AllowOut, cr.DenyOut, cr.Rules = req.Network.AllowOut, req.Network.DenyOut, storeRules(req.Network.Rules)
		cr.PrivateTraffic = req.Network.AllowPublicTraffic != nil && !*req.Network.AllowPublicTraffic
	}
	if err := control.Validate(cr); err != nil {
		return control.CreateRequest{}, err
	}
	return cr, nil
}

func (s *Server) create(w http.ResponseWriter, r *http.Request) {
	var req CreateRequest
	if !decode(w, r, &req) {
		return
	}
	if err := allowedTemplate(r, orBase(req.TemplateID)); err != nil {
		s.fail(w, r, err)
		return
	}
	tid, err := s.resolveTagged(r.Context(), teamOf(r), req.TemplateID)
	if err != nil {
		s.fail(w, r, err)
		return
	}
	req.TemplateID = tid
	cr, err := ParseCreate(req)
	if err != nil {
		s.fail(w, r, err)
		return
	}
	cr.TeamID = teamOf(r)
	sb, err := s.c.Create(r.Context(), cr)
	if err != nil {
		s.fail(w, r, err)
		return
	}
	noteAudit(r, sb.ID, "from "+cr.TemplateID)
	writeJSON(w, http.StatusCreated, s.sandboxResponse(sb))
}

func (s *Server) get(w http.ResponseWriter, r *http.Request) {
	id, ok := s.sandboxID(w, r)
	if !ok {
		return
	}
	sb, err := s.c.Get(r.Context(), id)
	if err != nil {
		s.fail(w, r, err)
		return
	}
	writeJSON(w, http.StatusOK, detail(sb.Sandbox, sb.EnvdAccessToken))
}

// parseMetadataQuery decodes the list filter: a query string inside a
// query parameter ("k1=v1&k2=v2", each part URL-encoded).
func parseMetadataQuery(q string) (map[string]string, error) {
	if q == "" {
		return nil, nil
	}
	vals, err := url.ParseQuery(q)
	if err != nil {
		return nil, errdefs.Invalidf("metadata filter %q is not a query string: %v", q, err)
	}
	out := map[string]string{}
	for k, v := range vals {
		if len(v) != 1 {
			return nil, errdefs.Invalidf("metadata filter key %q given %d times", k, len(v))
		}
		out[k] = v[0]
	}
	return out, nil
}

// parseLimit reads a list's page size: 1 to max, min(100, max) when
// absent.
func parseLimit(q url.Values, max int) (int, error) {
	l := q.Get("limit")
	if l == "" {
		return min(100, max), nil
	}
	n, err := strconv.Atoi(l)
	if err != nil || n < 1 || n > max {
		return 0, errdefs.Invalidf("limit %q must be an integer from 1 to %d", l, max)
	}
	return n, nil
}

// ParseListQuery turns a list request's query into a filter.
func ParseListQuery(q url.Values) (store.SandboxFilter, error) {
	md, err := parseMetadataQuery(q.Get("metadata"))
	if err != nil {
		return store.SandboxFilter{}, err
	}
	limit, err := parseLimit(q, 1000)
	if err != nil {
		return store.SandboxFilter{}, err
	}
	f := store.SandboxFilter{Metadata: md, Template: q.Get("template"), Limit: limit, Cursor: q.Get("nextToken")}
	for _, st := range strings.Split(strings.Join(q["state"], ","), ",") {
		switch strings.TrimSpace(st) {
		case "":
		case "running":
			f.States = append(f.States, store.StateRunning)
		case "paused":
			f.States = append(f.States, store.StatePaused, store.StateHibernated)
		default:
			return store.SandboxFilter{}, errdefs.Invalidf("state %q must be running or paused", st)
		}
	}
	return f, nil
}

func (s *Server) list(w http.ResponseWriter, r *http.Request) {
	f, err := ParseListQuery(r.URL.Query())
	if err != nil {
		s.fail(w, r, err)
		return
	}
	f.TeamID = teamOf(r)
	page, next, err := s.c.List(r.Context(), f)
	if err != nil {
		s.fail(w, r, err)
		return
	}
	out := make([]SandboxDetail, 0, len(page))
	for _, sb := range page {
		out = append(out, detail(sb, ""))
	}
	if next != "" {
		w.Header().Set("X-Next-Token", next)
	}
	writeJSON(w, http.StatusOK, out)
}

func (s *Server) kill(w http.ResponseWriter, r *http.Request) {
	id, ok := s.sandboxID(w, r)
	if !ok {
		return
	}
	if err := s.c.Kill(r.Context(), id); err != nil {
		s.fail(w, r, err)
		return
	}
	w.WriteHeader(http.StatusNoContent)
}

type timeoutBody struct {
	Timeout *int64 `json:"timeout"`
}

// connectBody is the body of connect. memory: false asks E2B to reboot
// from the files alone; Spore always resumes the whole state.
type connectBody struct {
	Timeout *int64 `json:"timeout"`
	Memory  *bool  `json:"memory"`
}

// resumeBody is the body of the older resume, which may also set what the
// timeout does from then on.
type resumeBody struct {
	connectBody
	AutoPause *bool `json:"autoPause"`
}

func (b connectBody) refuseUnsupported() error {
	if b.Memory != nil && !*b.Memory {
		return unsupported("memory", "false", "Spore always resumes a sandbox with its memory; kill it and create a new one for a fresh start")
	}
	return nil
}

func (s *Server) connect(w http.ResponseWriter, r *http.Request) {
	id, ok := s.sandboxID(w, r)
	if !ok {
		return
	}
	var body connectBody
	if !decode(w, r, &body) {
		return
	}
	if err := body.refuseUnsupported(); err != nil {
		s.fail(w, r, err)
		return
	}
	timeout, err := timeoutOf(body.Timeout)
	if err != nil {
		s.fail(w, r, err)
		return
	}
	sb, resumed, err := s.c.Connect(r.Context(), id, timeout)
	if err != nil {
		s.fail(w, r, err)
		return
	}
	status := http.StatusOK
	if resumed {
		status = http.StatusCreated
	}
	writeJSON(w, status, s.sandboxResponse(sb))
}

// resume is the older SDKs' resume: 409 when the sandbox is running.
func (s *Server) resume(w http.ResponseWriter, r *http.Request) {
	id, ok := s.sandboxID(w, r)
	if !ok {
		return
	}
	var body resumeBody
	if !decode(w, r, &body) {
		return
	}
	rec, err := s.st.GetSandbox(r.Context(), id)
	if err != nil {
		s.fail(w, r, err)
		return
	}
	if rec.State == store.StateRunning {
		writeError(w, http.StatusConflict, "sandbox "+id+" is already running")
		return
	}
	err = body.refuseUnsupported()
	if err == nil && body.AutoPause != nil && *body.AutoPause != rec.AutoPause {
		err = unsupported("autoPause", fmt.Sprint(*body.AutoPause), "a sandbox's autoPause is set when it is created")
	}
	if err != nil {
		s.fail(w, r, err)
		return
	}
	timeout, err := timeoutOf(body.Timeout)
	if err != nil {
		s.fail(w, r, err)
		return
	}
	sb, _, err := s.c.Connect(r.Context(), id, timeout)
	if err != nil {
		s.fail(w, r, err)
		return
	}
	writeJSON(w, http.StatusCreated, s.sandboxResponse(sb))
}

func (s *Server) pause(w http.ResponseWriter, r *http.Request) {
	id, ok := s.sandboxID(w, r)
	if !ok {
		return
	}
	var body struct {
		Memory *bool `json:"memory"`
	}
	if !decode(w, r, &body) {
		return
	}
	var err error
	if body.Memory != nil && !*body.Memory {
		err = s.c.Hibernate(r.Context(), id) // not kept in memory: to disk
	} else {
		err = s.c.Pause(r.Context(), id)
	}
	if err != nil {
		s.fail(w, r, err)
		return
	}
	w.WriteHeader(http.StatusNoContent)
}

func (s *Server) hibernate(w http.ResponseWriter, r *http.Request) {
	id, ok := s.sandboxID(w, r)
	if !ok {
		return
	}
	if err := s.c.Hibernate(r.Context(), id); err != nil {
		s.fail(w, r, err)
		return
	}
	w.WriteHeader(http.StatusNoContent)
}

func (s *Server) timeout(w http.ResponseWriter, r *http.Request) {
	id, ok := s.sandboxID(w, r)
	if !ok {
		return
	}
	var body timeoutBody
	if !decode(w, r, &body) {
		return
	}
	if body.Timeout == nil {
		writeError(w, http.StatusBadRequest, "timeout is required")
		return
	}
	timeout, err := control.ValidateTimeout(*body.Timeout)
	if err != nil {
		s.fail(w, r, err)
		return
	}
	if err := s.c.SetTimeout(r.Context(), id, timeout); err != nil {
		s.fail(w, r, err)
		return
	}
	w.WriteHeader(http.StatusNoContent)
}

func (s *Server) network(w http.ResponseWriter, r *http.Request) {
	id, ok := s.sandboxID(w, r)
	if !ok {
		return
	}
	var body struct {
		NetworkRequest
		AllowInternetAccess *bool `json:"allow_internet_access"`
	}
	if !decode(w, r, &body) {
		return
	}
	if err := body.NetworkRequest.refuseUnsupported("", false); err != nil {
		s.fail(w, r, err)
		return
	}
	if err := s.c.UpdateNetwork(r.Context(), id, body.AllowInternetAccess, body.AllowOut, body.DenyOut, storeRules(body.Rules)); err != nil {
		s.fail(w, r, err)
		return
	}
	w.WriteHeader(http.StatusNoContent)
}

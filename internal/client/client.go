// Package client is a Go client of the Spore API and of the sandboxes'
// daemons through the API's proxy. The CLI is built on it.
package client

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"time"

	"connectrpc.com/connect"

	"github.com/spore-run/spore/internal/api"
	"github.com/spore-run/spore/internal/errdefs"
	"github.com/spore-run/spore/proto/gen/filesystem/filesystempbconnect"
	"github.com/spore-run/spore/proto/gen/process/processpbconnect"
)

// Client talks to one Spore API.
type Client struct {
	base string
	key  string
	team string // sent as api.TeamHeader when set (an operator acting in a team)
	http *http.Client
}

// WithTeam returns a copy of c that acts in team (an operator key's
// choice; a team key acts in its own team only).
func (c *Client) WithTeam(team string) *Client {
	cp := *c
	cp.team = team
	return &cp
}

// auth sets a request's credentials: the key, and the team it acts in.
func (c *Client) auth(req *http.Request) {
	req.Header.Set("X-API-KEY", c.key)
	if c.team != "" {
		req.Header.Set(api.TeamHeader, c.team)
	}
}

// New returns a client of the API at base (http://127.0.0.1:3000).
func New(base, key string) *Client {
	return &Client{base: strings.TrimRight(base, "/"), key: key, http: &http.Client{Transport: &http.Transport{
		MaxIdleConnsPerHost: 16, ReadBufferSize: 1 << 20, WriteBufferSize: 1 << 20, DisableCompression: true,
	}}}
}

// Error is an API error.
type Error struct {
	Status  int
	Message string
}

func (e *Error) Error() string { return fmt.Sprintf("%s (HTTP %d)", e.Message, e.Status) }

// Unwrap maps the status to an errdefs kind.
func (e *Error) Unwrap() error {
	switch e.Status {
	case 400, 413:
		return errdefs.ErrInvalidArgument
	case 403:
		return errdefs.ErrPermission
	case 404:
		return errdefs.ErrNotFound
	case 409:
		return errdefs.ErrConflict
	case 401:
		return errdefs.ErrInvalidArgument
	case 429:
		return errdefs.ErrResourceLimit
	case 502, 503:
		return errdefs.ErrUnavailable
	}
	return errdefs.ErrInternal
}

// errorOf is the *Error of an answer with status and body b (an
// api.ErrorBody, or text).
func errorOf(status int, b []byte) *Error {
	var e api.ErrorBody
	if json.Unmarshal(b, &e) != nil || e.Message == "" {
		e.Message = strings.TrimSpace(string(b))
	}
	if e.Message == "" {
		e.Message = http.StatusText(status)
	}
	return &Error{Status: status, Message: e.Message}
}

type headersKey struct{}

// WithResponseHeaders returns ctx that makes API calls made with it pass
// their response's headers to fn (to read Server-Timing, say).
func WithResponseHeaders(ctx context.Context, fn func(http.Header)) context.Context {
	return context.WithValue(ctx, headersKey{}, fn)
}

// do sends a JSON request and decodes a JSON answer into out (when not nil).
func (c *Client) do(ctx context.Context, method, path string, in, out any) (http.Header, error) {
	var body io.Reader
	if in != nil {
		b, err := json.Marshal(in)
		if err != nil {
			return nil, err
		}
		body = bytes.NewReader(b)
	}
	req, err := http.NewRequestWithContext(ctx, method, c.base+path, body)
	if err != nil {
		return nil, err
	}
	c.auth(req)
	req.Header.Set("Content-Type", "application/json")
	resp, err := c.http.Do(req)
	if err != nil {
		return nil, fmt.Errorf("%s %s: %w: %v", method, path, errdefs.ErrUnavailable, err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	if fn, ok := ctx.Value(headersKey{}).(func(http.Header)); ok {
		fn(resp.Header)
	}
	if resp.StatusCode >= 300 {
		return resp.Header, errorOf(resp.StatusCode, b)
	}
	if out != nil && len(b) > 0 {
		if err := json.Unmarshal(b, out); err != nil {
			return resp.Header, fmt.Errorf("decode %s %s: %w", method, path, err)
		}
	}
	return resp.Header, nil
}

// Create starts a sandbox.
func (c *Client) Create(ctx context.Context, req api.CreateRequest) (api.SandboxResponse, error) {
	var out api.SandboxResponse
	_, err := c.do(ctx, "POST", "/v2/sandboxes", req, &out)
	return out, err
}

// List returns every sandbox (following pages), filtered by metadata and
// state when given.
func (c *Client) List(ctx context.Context, metadata map[string]string, states []string) ([]api.SandboxDetail, error) {
	var all []api.SandboxDetail
	token := ""
	for {
		q := url.Values{}
		if len(metadata) > 0 {
			mq := url.Values{}
			for k, v := range metadata {
				mq.Set(k, v)
			}
			q.Set("metadata", mq.Encode())
		}
		if len(states) > 0 {
			q.Set("state", strings.Join(states, ","))
		}
		if token != "" {
			q.Set("nextToken", token)
		}
		var page []api.SandboxDetail
		h, err := c.do(ctx, "GET", "/v2/sandboxes?"+q.Encode(), nil, &page)
		if err != nil {
			return nil, err
		}
		all = append(all, page...)
		if token = h.Get("X-Next-Token"); token == "" {
			return all, nil
		}
	}
}

// Get returns one sandbox.
func (c *Client) Get(ctx context.Context, id string) (api.SandboxDetail, error) {
	var out api.SandboxDetail
	_, err := c.do(ctx, "GET", "/sandboxes/"+url.PathEscape(id), nil, &out)
	return out, err
}

// Kill kills a sandbox.
func (c *Client) Kill(ctx context.Context, id string) error {
	_, err := c.do(ctx, "DELETE", "/sandboxes/"+url.PathEscape(id), nil, nil)
	return err
}

// Pause pauses a sandbox in memory.
func (c *Client) Pause(ctx context.Context, id string) error {
	_, err := c.do(ctx, "POST", "/sandboxes/"+url.PathEscape(id)+"/pause", struct{}{}, nil)
	return err
}

// Hibernate checkpoints a sandbox to disk.
func (c *Client) Hibernate(ctx context.Context, id string) error {
	_, err := c.do(ctx, "POST", "/sandboxes/"+url.PathEscape(id)+"/hibernate", struct{}{}, nil)
	return err
}

// Connect resumes a paused or hibernated sandbox (a no-op when running).
func (c *Client) Connect(ctx context.Context, id string, timeout time.Duration) (api.SandboxResponse, error) {
	var out api.SandboxResponse
	body := map[string]int64{}
	if timeout > 0 {
		body["timeout"] = int64(timeout / time.Second)
	}
	_, err := c.do(ctx, "POST", "/v2/sandboxes/"+url.PathEscape(id)+"/connect", body, &out)
	return out, err
}

// SetTimeout sets a sandbox's timeout from now.
func (c *Client) SetTimeout(ctx context.Context, id string, timeout time.Duration) error {
	_, err := c.do(ctx, "POST", "/sandboxes/"+url.PathEscape(id)+"/timeout", map[string]int64{"timeout": int64(timeout / time.Second)}, nil)
	return err
}

// Snapshot takes a live snapshot; with template, it becomes the template
// name.
func (c *Client) Snapshot(ctx context.Context, id, name string, template bool) (api.SnapshotInfo, error) {
	var out api.SnapshotInfo
	body := map[string]any{}
	if name != "" {
		body["name"] = name
	}
	if template {
		body["template"] = true
	}
	_, err := c.do(ctx, "POST", "/sandboxes/"+url.PathEscape(id)+"/snapshots", body, &out)
	return out, err
}

// DiffSnapshots compares the filesystems of two snapshots (IDs or
// names): what changed from the first to the second.
func (c *Client) DiffSnapshots(ctx context.Context, from, to string) (api.SnapshotDiff, error) {
	var out api.SnapshotDiff
	_, err := c.do(ctx, "GET", "/snapshots/"+url.PathEscape(from)+"/diff/"+url.PathEscape(to), nil, &out)
	return out, err
}

// Snapshots lists snapshots (all pages).
func (c *Client) Snapshots(ctx context.Context, sandboxID string) ([]api.SnapshotInfo, error) {
	var all []api.SnapshotInfo
	token := ""
	for {
		q := url.Values{}
		if sandboxID != "" {
			q.Set("sandboxID", sandboxID)
		}
		if token != "" {
			q.Set("nextToken", token)
		}
		var page []api.SnapshotInfo
		h, err := c.do(ctx, "GET", "/snapshots?"+q.Encode(), nil, &page)
		if err != nil {
			return nil, err
		}
		all = append(all, page...)
		if token = h.Get("X-Next-Token"); token == "" {
			return all, nil
		}
	}
}

// DeleteTemplate deletes a snapshot or a template.
func (c *Client) DeleteTemplate(ctx context.Context, id string) error {
	_, err := c.do(ctx, "DELETE", "/templates/"+url.PathEscape(id), nil, nil)
	return err
}

// Templates lists templates.
func (c *Client) Templates(ctx context.Context) ([]api.TemplateInfo, error) {
	var out []api.TemplateInfo
	_, err := c.do(ctx, "GET", "/templates", nil, &out)
	return out, err
}

// Fork forks a sandbox into count children.
func (c *Client) Fork(ctx context.Context, id string, count int, timeout time.Duration) ([]api.ForkChild, error) {
	var out []api.ForkChild
	body := map[string]int64{"count": int64(count)}
	if timeout > 0 {
		body["timeout"] = int64(timeout / time.Second)
	}
	_, err := c.do(ctx, "POST", "/sandboxes/"+url.PathEscape(id)+"/fork", body, &out)
	return out, err
}

// Rollback rolls a sandbox back to a snapshot in place.
func (c *Client) Rollback(ctx context.Context, id, snapshotID string) (api.RollbackResponse, error) {
	var out api.RollbackResponse
	_, err := c.do(ctx, "POST", "/sandboxes/"+url.PathEscape(id)+"/rollback", map[string]string{"snapshotID": snapshotID}, &out)
	return out, err
}

// Sandbox is a handle on one sandbox's daemon, through the proxy.
type Sandbox struct {
	c     *Client
	ID    string
	Token string
	Proc  processpbconnect.ProcessClient
	FS    filesystempbconnect.FilesystemClient
}

// Open returns a handle on a running sandbox's daemon (resuming it when
// paused).
func (c *Client) Open(ctx context.Context, id string) (*Sandbox, error) {
	sr, err := c.Connect(ctx, id, 0)
	if err != nil {
		return nil, err
	}
	s := &Sandbox{c: c, ID: id, Token: sr.EnvdAccessToken}
	opts := connect.WithInterceptors(headers{s})
	s.Proc = processpbconnect.NewProcessClient(c.http, c.base, opts)
	s.FS = filesystempbconnect.NewFilesystemClient(c.http, c.base, opts)
	return s, nil
}

func (s *Sandbox) header(h http.Header, port int) {
	h.Set("E2b-Sandbox-Id", s.ID)
	h.Set("E2b-Sandbox-Port", strconv.Itoa(port))
	if s.Token != "" {
		h.Set("X-Access-Token", s.Token)
	}
}

type headers struct{ s *Sandbox }

func (h headers) WrapUnary(next connect.UnaryFunc) connect.UnaryFunc {
	return func(ctx context.Context, req connect.AnyRequest) (connect.AnyResponse, error) {
		h.s.header(req.Header(), 49983)
		return next(ctx, req)
	}
}

func (h headers) WrapStreamingClient(next connect.StreamingClientFunc) connect.StreamingClientFunc {
	return func(ctx context.Context, spec connect.Spec) connect.StreamingClientConn {
		conn := next(ctx, spec)
		h.s.header(conn.RequestHeader(), 49983)
		return conn
	}
}

func (h headers) WrapStreamingHandler(next connect.StreamingHandlerFunc) connect.StreamingHandlerFunc {
	return next
}

// Upload writes r to path in the sandbox.
func (s *Sandbox) Upload(ctx context.Context, path string, r io.Reader, user string) error {
	q := url.Values{"path": {path}}
	if user != "" {
		q.Set("username", user)
	}
	req, err := http.NewRequestWithContext(ctx, "POST", s.c.base+"/files?"+q.Encode(), r)
	if err != nil {
		return err
	}
	req.Header.Set("Content-Type", "application/octet-stream")
	s.header(req.Header, 49983)
	return s.fileDo(req, nil)
}

// Download copies path in the sandbox to w.
func (s *Sandbox) Download(ctx context.Context, path string, w io.Writer, user string) error {
	q := url.Values{"path": {path}}
	if user != "" {
		q.Set("username", user)
	}
	req, err := http.NewRequestWithContext(ctx, "GET", s.c.base+"/files?"+q.Encode(), nil)
	if err != nil {
		return err
	}
	s.header(req.Header, 49983)
	return s.fileDo(req, w)
}

func (s *Sandbox) fileDo(req *http.Request, w io.Writer) error {
	resp, err := s.c.http.Do(req)
	if err != nil {
		return fmt.Errorf("%w: %v", errdefs.ErrUnavailable, err)
	}
	defer resp.Body.Close()
	if resp.StatusCode >= 300 {
		b, _ := io.ReadAll(resp.Body)
		return errorOf(resp.StatusCode, b)
	}
	if w == nil {
		w = io.Discard
	}
	_, err = io.CopyBuffer(struct{ io.Writer }{w}, resp.Body, make([]byte, 1<<20))
	return err
}

// RunCode runs code in the sandbox's code interpreter (port 49999, the
// code-interpreter templates) and returns the text of its main result.
// An error the code raised is returned as an error.
func (s *Sandbox) RunCode(ctx context.Context, code string) (string, error) {
	b, _ := json.Marshal(map[string]string{"code": code})
	req, err := http.NewRequestWithContext(ctx, "POST", s.c.base+"/execute", bytes.NewReader(b))
	if err != nil {
		return "", err
	}
	req.Header.Set("Content-Type", "application/json")
	s.header(req.Header, 49999)
	var out bytes.Buffer
	if err := s.fileDo(req, &out); err != nil {
		return "", err
	}
	var result string
	for _, line := range bytes.Split(out.Bytes(), []byte("\n")) {
		var ev struct{ Type, Text, Name, Value string }
		if json.Unmarshal(line, &ev) != nil {
			continue
		}
		switch ev.Type {
		case "result":
			result = ev.Text
		case "error":
			return "", fmt.Errorf("%s: %s", ev.Name, ev.Value)
		}
	}
	return result, nil
}

// Base is the API's base URL.
func (c *Client) Base() string { return c.base }

// Nodes lists the fleet's nodes.
func (c *Client) Nodes(ctx context.Context) ([]api.NodeInfo, error) {
	var out []api.NodeInfo
	_, err := c.do(ctx, "GET", "/nodes", nil, &out)
	return out, err
}

// DrainNode stops placements on a node and hibernates its sandboxes.
func (c *Client) DrainNode(ctx context.Context, id string) (api.DrainResult, error) {
	var out api.DrainResult
	_, err := c.do(ctx, "POST", "/nodes/"+url.PathEscape(id)+"/drain", struct{}{}, &out)
	return out, err
}

// CollectGarbage frees the blob store's unused chunks.
func (c *Client) CollectGarbage(ctx context.Context, grace time.Duration, dryRun bool) (api.GCResult, error) {
	var out api.GCResult
	_, err := c.do(ctx, "POST", "/blobs/gc", api.GCRequest{GraceSeconds: int64(grace / time.Second), DryRun: dryRun}, &out)
	return out, err
}

// UndrainNode lets placements use a node again.
func (c *Client) UndrainNode(ctx context.Context, id string) error {
	_, err := c.do(ctx, "POST", "/nodes/"+url.PathEscape(id)+"/undrain", struct{}{}, nil)
	return err
}

// Export pushes a filesystem as an OCI image: of a running sandbox when
// sandbox is true, else of a snapshot or template.
func (c *Client) Export(ctx context.Context, id string, sandbox bool, req api.ExportRequest) (api.ExportResponse, error) {
	var out api.ExportResponse
	path := "/snapshots/" + url.PathEscape(id) + "/export"
	if sandbox {
		path = "/sandboxes/" + url.PathEscape(id) + "/export"
	}
	_, err := c.do(ctx, "POST", path, req, &out)
	return out, err
}

// ExportLayout exports a filesystem as an OCI image layout in one tar
// (of a running sandbox when sandbox is true, else of a snapshot or
// template): the caller reads it from the returned body and closes it.
// size is the tar's length (-1: not announced); digest the image's.
func (c *Client) ExportLayout(ctx context.Context, id string, sandbox bool) (body io.ReadCloser, size int64, digest string, err error) {
	path := "/snapshots/" + url.PathEscape(id) + "/export"
	if sandbox {
		path = "/sandboxes/" + url.PathEscape(id) + "/export"
	}
	b, err := json.Marshal(api.ExportRequest{Format: api.FormatOCILayout})
	if err != nil {
		return nil, 0, "", err
	}
	req, err := http.NewRequestWithContext(ctx, "POST", c.base+path, bytes.NewReader(b))
	if err != nil {
		return nil, 0, "", err
	}
	c.auth(req)
	req.Header.Set("Content-Type", "application/json")
	resp, err := c.http.Do(req)
	if err != nil {
		return nil, 0, "", fmt.Errorf("POST %s: %w: %v", path, errdefs.ErrUnavailable, err)
	}
	if resp.StatusCode >= 300 {
		defer resp.Body.Close()
		b, _ := io.ReadAll(io.LimitReader(resp.Body, 1<<20))
		return nil, 0, "", errorOf(resp.StatusCode, b)
	}
	return resp.Body, resp.ContentLength, resp.Header.Get(api.ExportDigestHeader), nil
}

// EgressAudit returns a sandbox's outbound connection attempts (GET
// /sandboxes/{id}/egress); since is an RFC 3339 time or a duration back
// from now ("" for all), limit 0 for the server's maximum.
func (c *Client) EgressAudit(ctx context.Context, id, since string, limit int) (api.EgressAudit, error) {
	q := url.Values{}
	if since != "" {
		q.Set("since", since)
	}
	if limit > 0 {
		q.Set("limit", strconv.Itoa(limit))
	}
	path := "/sandboxes/" + url.PathEscape(id) + "/egress"
	if len(q) > 0 {
		path += "?" + q.Encode()
	}
	var out api.EgressAudit
	_, err := c.do(ctx, http.MethodGet, path, nil, &out)
	return out, err
}

// SandboxLogs reads a sandbox's logs (GET /v2/sandboxes/{id}/logs): from
// cursor on (zero: the first), at most limit (0: the server's 1000), at
// least level ("": all), oldest first.
func (c *Client) SandboxLogs(ctx context.Context, id string, cursor time.Time, limit int, level string) ([]api.SandboxLogEntry, error) {
	q := url.Values{}
	if !cursor.IsZero() {
		q.Set("cursor", strconv.FormatInt(cursor.UnixMilli(), 10))
	}
	if limit > 0 {
		q.Set("limit", strconv.Itoa(limit))
	}
	if level != "" {
		q.Set("level", level)
	}
	path := "/v2/sandboxes/" + url.PathEscape(id) + "/logs"
	if len(q) > 0 {
		path += "?" + q.Encode()
	}
	var out api.SandboxLogsV2
	_, err := c.do(ctx, http.MethodGet, path, nil, &out)
	return out.Logs, err
}

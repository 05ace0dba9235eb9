package fleet

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strings"
	"time"

	"github.com/spore-run/spore/internal/errdefs"
)

// adminAPI calls the fleet's own API (GET /nodes, drain, undrain, the
// sandbox and snapshot lists) with the admin API key, on the first
// replica that takes the connection: the rolling upgrade works through
// the replicas it is not replacing.
type adminAPI struct {
	urls []string
	key  string
	c    *http.Client
}

func newAdminAPI(urls []string, key string) adminAPI {
	return adminAPI{urls: urls, key: key, c: &http.Client{Timeout: 5 * time.Minute}}
}

// statusError is an answer outside 2xx.
type statusError struct {
	method, path string
	code         int
	body         string
}

func (e *statusError) Error() string {
	return fmt.Sprintf("%s %s: %d %s", e.method, e.path, e.code, strings.TrimSpace(e.body))
}

// Unwrap gives the answer's kind: a 5xx is worth another try.
func (e *statusError) Unwrap() error {
	switch {
	case e.code == http.StatusNotFound:
		return errdefs.ErrNotFound
	case e.code == http.StatusConflict:
		return errdefs.ErrConflict
	case e.code >= 500:
		return errdefs.ErrUnavailable
	default:
		return errdefs.ErrInvalidArgument
	}
}

// retryable says whether a call may succeed when tried again: no replica
// answered, or one answered 5xx (a drain that could not hibernate every
// sandbox yet, a store hiccup).
func retryable(err error) bool {
	var se *statusError
	return err != nil && (!errors.As(err, &se) || se.code >= 500)
}

// call sends method path and decodes a 2xx answer's JSON into out (when
// not nil); hdr, when not nil, gets the answer's headers. A replica that
// does not take the connection is skipped for the next.
func (a adminAPI) call(ctx context.Context, method, path string, out any, hdr *http.Header) error {
	var last error
	for _, base := range a.urls {
		req, err := http.NewRequestWithContext(ctx, method, base+path, nil)
		if err != nil {
			return err
		}
		req.Header.Set("X-API-KEY", a.key)
		resp, err := a.c.Do(req)
		if err != nil {
			if ctx.Err() != nil {
				return ctx.Err()
			}
			last = fmt.Errorf("%s %s%s: %w", method, base, path, err)
			continue
		}
		b, err := io.ReadAll(io.LimitReader(resp.Body, 64<<20))
		resp.Body.Close()
		if err != nil {
			last = fmt.Errorf("%s %s%s: %w", method, base, path, err)
			continue
		}
		if resp.StatusCode/100 != 2 {
			return &statusError{method: method, path: base + path, code: resp.StatusCode, body: string(b)}
		}
		if hdr != nil {
			*hdr = resp.Header
		}
		if out == nil || len(b) == 0 {
			return nil
		}
		if err := json.Unmarshal(b, out); err != nil {
			return fmt.Errorf("%s %s%s: decode the answer: %w", method, base, path, err)
		}
		return nil
	}
	return fmt.Errorf("no API replica answered (%v): %w", last, errdefs.ErrUnavailable)
}

// nodeStatus is a node as GET /nodes shows it, what the upgrade reads.
type nodeStatus struct {
	NodeID         string `json:"nodeID"`
	State          string `json:"state"`
	Draining       bool   `json:"draining"`
	Sandboxes      int    `json:"sandboxes"` // running, paused, being created (and warm-pool ones)
	HeartbeatAgeMs int64  `json:"heartbeatAgeMs"`
}

// heartbeatAfter says whether the node's last heartbeat came after t (the
// replicas run on this host: their clock is ours).
func (n nodeStatus) heartbeatAfter(t time.Time) bool {
	return time.Now().Add(-time.Duration(n.HeartbeatAgeMs) * time.Millisecond).After(t)
}

func (a adminAPI) nodes(ctx context.Context) (map[string]nodeStatus, error) {
	var list []nodeStatus
	if err := a.call(ctx, http.MethodGet, "/nodes", &list, nil); err != nil {
		return nil, err
	}
	out := make(map[string]nodeStatus, len(list))
	for _, n := range list {
		out[n.NodeID] = n
	}
	return out, nil
}

func (a adminAPI) node(ctx context.Context, id string) (nodeStatus, error) {
	all, err := a.nodes(ctx)
	if err != nil {
		return nodeStatus{}, err
	}
	n, ok := all[id]
	if !ok {
		return nodeStatus{}, fmt.Errorf("node %s is not in GET /nodes: %w", id, errdefs.ErrNotFound)
	}
	return n, nil
}

// drain asks the fleet to drain node id and returns how many sandboxes
// it hibernated.
func (a adminAPI) drain(ctx context.Context, id string) (int, error) {
	var res struct {
		Hibernated int `json:"hibernated"`
	}
	err := a.call(ctx, http.MethodPost, "/nodes/"+url.PathEscape(id)+"/drain", &res, nil)
	return res.Hibernated, err
}

func (a adminAPI) undrain(ctx context.Context, id string) error {
	return a.call(ctx, http.MethodPost, "/nodes/"+url.PathEscape(id)+"/undrain", nil, nil)
}

// listAll reads every page of a list (path carries its query; limit
// 1000) into a slice of T.
func listAll[T any](ctx context.Context, a adminAPI, path string) ([]T, error) {
	var all []T
	next := ""
	for {
		p := path
		if next != "" {
			p += "&nextToken=" + url.QueryEscape(next)
		}
		var page []T
		var hdr http.Header
		if err := a.call(ctx, http.MethodGet, p, &page, &hdr); err != nil {
			return nil, err
		}
		all = append(all, page...)
		if next = hdr.Get("X-Next-Token"); next == "" {
			return all, nil
		}
	}
}

// notDurable counts what node id holds that is not in the shared blob
// store yet: snapshots still uploading, and hibernated sandboxes whose
// image is local (the drain's hibernations upload in the background).
func (a adminAPI) notDurable(ctx context.Context, id string) (snapshots, hibernated int, err error) {
	sns, err := listAll[struct {
		NodeID  string `json:"nodeID"`
		Storage string `json:"storage"`
	}](ctx, a, "/snapshots?limit=1000")
	if err != nil {
		return 0, 0, err
	}
	for _, sn := range sns {
		if sn.NodeID == id && sn.Storage == "uploading" {
			snapshots++
		}
	}
	sbs, err := listAll[struct {
		ClientID    string `json:"clientID"`
		SporeState  string `json:"sporeState"`
		Hibernation string `json:"sporeHibernation"`
	}](ctx, a, "/v2/sandboxes?state=paused&limit=1000")
	if err != nil {
		return 0, 0, err
	}
	for _, sb := range sbs {
		if sb.ClientID == id && sb.SporeState == "hibernated" && sb.Hibernation == "local" {
			hibernated++
		}
	}
	return snapshots, hibernated, nil
}

package client

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strconv"
	"time"

	"github.com/spore-run/spore/internal/errdefs"
	"github.com/spore-run/spore/internal/store"
)

// AuditQuery selects audit records (GET /audit).
type AuditQuery struct {
	Resource     string
	Since, Until time.Time
	Limit        int
	Next         string // a page's token
	All          bool   // every team's (operator keys)
}

func (q AuditQuery) values() url.Values {
	v := url.Values{}
	if q.Resource != "" {
		v.Set("resource", q.Resource)
	}
	if !q.Since.IsZero() {
		v.Set("since", q.Since.UTC().Format(time.RFC3339Nano))
	}
	if !q.Until.IsZero() {
		v.Set("until", q.Until.UTC().Format(time.RFC3339Nano))
	}
	if q.Limit > 0 {
		v.Set("limit", strconv.Itoa(q.Limit))
	}
	if q.Next != "" {
		v.Set("next", q.Next)
	}
	if q.All {
		v.Set("all", "true")
	}
	return v
}

// Audit returns a page of the team's audit records, newest first, and the
// next page's token ("" at the end).
func (c *Client) Audit(ctx context.Context, q AuditQuery) ([]store.AuditRecord, string, error) {
	var out []store.AuditRecord
	h, err := c.do(ctx, http.MethodGet, "/audit?"+q.values().Encode(), nil, &out)
	if err != nil {
		return nil, "", err
	}
	return out, h.Get("X-Next-Token"), nil
}

// ExportAudit writes every record q selects to w as JSON lines.
func (c *Client) ExportAudit(ctx context.Context, q AuditQuery, w io.Writer) error {
	v := q.values()
	v.Set("format", "jsonl")
	v.Del("limit")
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, c.base+"/audit?"+v.Encode(), nil)
	if err != nil {
		return err
	}
	c.auth(req)
	resp, err := c.http.Do(req)
	if err != nil {
		return fmt.Errorf("GET /audit: %w: %v", errdefs.ErrUnavailable, err)
	}
	defer resp.Body.Close()
	if resp.StatusCode >= 300 {
		b, _ := io.ReadAll(resp.Body)
		return errorOf(resp.StatusCode, b)
	}
	_, err = io.Copy(w, resp.Body)
	return err
}

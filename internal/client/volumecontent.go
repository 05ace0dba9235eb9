package client

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strconv"

	"github.com/spore-run/spore/internal/errdefs"
	"github.com/spore-run/spore/internal/volume/content"
)

// VolumeFiles is a client of one volume's content API (E2B's
// /volumecontent routes), authorized by the volume's token.
type VolumeFiles struct {
	c     *Client
	id    string
	token string
}

// VolumeFiles returns a content client of the volume ref (ID or name),
// with the token GET /volumes/{ref} gives its owner.
func (c *Client) VolumeFiles(ctx context.Context, ref string) (*VolumeFiles, error) {
	v, err := c.Volume(ctx, ref)
	if err != nil {
		return nil, err
	}
	return &VolumeFiles{c: c, id: v.VolumeID, token: v.Token}, nil
}

func (f *VolumeFiles) request(ctx context.Context, method, kind, p string, q url.Values, body io.Reader, size int64) (*http.Response, error) {
	if q == nil {
		q = url.Values{}
	}
	q.Set("path", p)
	u := f.c.base + "/volumecontent/" + url.PathEscape(f.id) + "/" + kind + "?" + q.Encode()
	req, err := http.NewRequestWithContext(ctx, method, u, body)
	if err != nil {
		return nil, err
	}
	if body != nil {
		req.ContentLength = size
		req.Header.Set("Content-Type", "application/octet-stream")
	}
	req.Header.Set("Authorization", "Bearer "+f.token)
	resp, err := f.c.http.Do(req)
	if err != nil {
		return nil, fmt.Errorf("%s %s %s: %w: %v", method, kind, p, errdefs.ErrUnavailable, err)
	}
	if resp.StatusCode >= 300 {
		defer resp.Body.Close()
		b, _ := io.ReadAll(io.LimitReader(resp.Body, 64<<10))
		return nil, errorOf(resp.StatusCode, b)
	}
	return resp, nil
}

func decodeInto(resp *http.Response, out any) error {
	defer resp.Body.Close()
	if err := json.NewDecoder(io.LimitReader(resp.Body, 64<<20)).Decode(out); err != nil {
		return fmt.Errorf("decode %s: %w", resp.Request.URL.Path, err)
	}
	return nil
}

// Stat describes the entry at p (a path from the volume's root).
func (f *VolumeFiles) Stat(ctx context.Context, p string) (content.EntryStat, error) {
	var e content.EntryStat
	resp, err := f.request(ctx, http.MethodGet, "path", p, nil, nil, 0)
	if err != nil {
		return e, err
	}
	return e, decodeInto(resp, &e)
}

// List lists the directory p, depth levels down (1: its entries).
func (f *VolumeFiles) List(ctx context.Context, p string, depth int) ([]content.EntryStat, error) {
	var out []content.EntryStat
	resp, err := f.request(ctx, http.MethodGet, "dir", p, url.Values{"depth": {strconv.Itoa(depth)}}, nil, 0)
	if err != nil {
		return nil, err
	}
	return out, decodeInto(resp, &out)
}

// MakeDir makes the directory p and its parents (an existing one is no
// error).
func (f *VolumeFiles) MakeDir(ctx context.Context, p string) error {
	resp, err := f.request(ctx, http.MethodPost, "dir", p, url.Values{"force": {"true"}}, nil, 0)
	if err != nil {
		return err
	}
	resp.Body.Close()
	return nil
}

// Read returns the file p's content; the caller closes it.
func (f *VolumeFiles) Read(ctx context.Context, p string) (io.ReadCloser, int64, error) {
	resp, err := f.request(ctx, http.MethodGet, "file", p, nil, nil, 0)
	if err != nil {
		return nil, 0, err
	}
	return resp.Body, resp.ContentLength, nil
}

// Write writes size bytes of r to the file p (made with its parents, or
// replaced whole: a cut upload leaves the old content), with permission
// bits mode.
func (f *VolumeFiles) Write(ctx context.Context, p string, r io.Reader, size int64, mode uint32) error {
	q := url.Values{"force": {"true"}, "mode": {"0o" + strconv.FormatUint(uint64(mode), 8)}}
	if size == 0 {
		r = http.NoBody
	}
	resp, err := f.request(ctx, http.MethodPut, "file", p, q, r, size)
	if err != nil {
		return err
	}
	resp.Body.Close()
	return nil
}

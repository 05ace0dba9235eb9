package client

import (
	"context"
	"net/http"
	"net/url"

	"github.com/spore-run/spore/internal/api"
)

// CreateVolume creates a volume (mode "" is shared; sizeMB 0 is the
// default quota) and returns it with its content token.
func (c *Client) CreateVolume(ctx context.Context, name, mode string, sizeMB int64) (api.VolumeAndToken, error) {
	var out api.VolumeAndToken
	_, err := c.do(ctx, http.MethodPost, "/volumes", api.NewVolume{Name: name, Mode: mode, SizeMB: sizeMB}, &out)
	return out, err
}

// Volume returns a volume, with its content token, by ID or name.
func (c *Client) Volume(ctx context.Context, ref string) (api.VolumeAndToken, error) {
	var out api.VolumeAndToken
	_, err := c.do(ctx, http.MethodGet, "/volumes/"+url.PathEscape(ref), nil, &out)
	return out, err
}

// Volumes returns every volume, following the pages.
func (c *Client) Volumes(ctx context.Context) ([]api.Volume, error) {
	var all []api.Volume
	next := ""
	for {
		var page []api.Volume
		q := url.Values{}
		if next != "" {
			q.Set("nextToken", next)
		}
		h, err := c.do(ctx, http.MethodGet, "/volumes?"+q.Encode(), nil, &page)
		if err != nil {
			return nil, err
		}
		all = append(all, page...)
		if next = h.Get("X-Next-Token"); next == "" {
			return all, nil
		}
	}
}

// DeleteVolume deletes a volume by ID or name.
func (c *Client) DeleteVolume(ctx context.Context, ref string) error {
	_, err := c.do(ctx, http.MethodDelete, "/volumes/"+url.PathEscape(ref), nil, nil)
	return err
}

package client

import (
	"context"
	"net/http"
	"net/url"

	"github.com/spore-run/spore/internal/api"
)

// CreateSecret creates a secret (POST /secrets).
func (c *Client) CreateSecret(ctx context.Context, name, value string, md map[string]string) (api.Secret, error) {
	var out api.Secret
	_, err := c.do(ctx, http.MethodPost, "/secrets", api.NewSecret{Name: name, Value: value, Metadata: md}, &out)
	return out, err
}

// UpdateSecret stores value as the secret's next version.
func (c *Client) UpdateSecret(ctx context.Context, ref, value string, md map[string]string) (api.Secret, error) {
	var out api.Secret
	_, err := c.do(ctx, http.MethodPost, "/secrets/"+url.PathEscape(ref), api.SecretUpdate{Value: value, Metadata: md}, &out)
	return out, err
}

// Secret returns a secret's metadata by ID or name.
func (c *Client) Secret(ctx context.Context, ref string) (api.Secret, error) {
	var out api.Secret
	_, err := c.do(ctx, http.MethodGet, "/secrets/"+url.PathEscape(ref), nil, &out)
	return out, err
}

// Secrets returns every secret, following the pages.
func (c *Client) Secrets(ctx context.Context) ([]api.Secret, error) {
	var all []api.Secret
	next := ""
	for {
		var page []api.Secret
		q := url.Values{}
		if next != "" {
			q.Set("nextToken", next)
		}
		h, err := c.do(ctx, http.MethodGet, "/secrets?"+q.Encode(), nil, &page)
		if err != nil {
			return nil, err
		}
		all = append(all, page...)
		if next = h.Get("X-Next-Token"); next == "" {
			return all, nil
		}
	}
}

// DeleteSecret deletes a secret by ID or name.
func (c *Client) DeleteSecret(ctx context.Context, ref string) error {
	_, err := c.do(ctx, http.MethodDelete, "/secrets/"+url.PathEscape(ref), nil, nil)
	return err
}

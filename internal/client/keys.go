package client

import (
	"context"
	"net/http"
	"net/url"

	"github.com/spore-run/spore/internal/api"
)

// CreateKey makes an API key (POST /api-keys; admin keys only): the answer
// is the only one that carries the key.
func (c *Client) CreateKey(ctx context.Context, name, role string) (api.CreatedKey, error) {
	var out api.CreatedKey
	_, err := c.do(ctx, http.MethodPost, "/api-keys", api.CreateKeyRequest{Name: name, Role: role}, &out)
	return out, err
}

// Keys lists the API keys (revoked ones too with all).
func (c *Client) Keys(ctx context.Context, all bool) ([]api.KeyInfo, error) {
	var out []api.KeyInfo
	q := url.Values{}
	if all {
		q.Set("revoked", "true")
	}
	_, err := c.do(ctx, http.MethodGet, "/api-keys?"+q.Encode(), nil, &out)
	return out, err
}

// RevokeKey revokes an API key by ID.
func (c *Client) RevokeKey(ctx context.Context, id string) error {
	_, err := c.do(ctx, http.MethodDelete, "/api-keys/"+url.PathEscape(id), nil, nil)
	return err
}

package client

import (
	"context"
	"net/http"
	"net/url"

	"github.com/spore-run/spore/internal/api"
	"github.com/spore-run/spore/internal/store"
)

// CreateKey makes an API key; the answer carries it (shown this once).
func (c *Client) CreateKey(ctx context.Context, req api.CreateKeyRequest) (api.CreatedKey, error) {
	var out api.CreatedKey
	_, err := c.do(ctx, http.MethodPost, "/api-keys", req, &out)
	return out, err
}

// Keys lists the API keys the key may see (revoked ones too with all;
// an operator's of one team with team).
func (c *Client) Keys(ctx context.Context, all bool, team string) ([]api.KeyInfo, error) {
	var out []api.KeyInfo
	q := url.Values{}
	if all {
		q.Set("revoked", "true")
	}
	if team != "" {
		q.Set("teamID", team)
	}
	_, err := c.do(ctx, http.MethodGet, "/api-keys?"+q.Encode(), nil, &out)
	return out, err
}

// RevokeKey revokes an API key by ID.
func (c *Client) RevokeKey(ctx context.Context, id string) error {
	_, err := c.do(ctx, http.MethodDelete, "/api-keys/"+url.PathEscape(id), nil, nil)
	return err
}

// Teams lists the teams the key sees (E2B's GET /teams: its own; an
// operator's, every team).
func (c *Client) Teams(ctx context.Context) ([]api.TeamEntry, error) {
	var out []api.TeamEntry
	_, err := c.do(ctx, http.MethodGet, "/teams", nil, &out)
	return out, err
}

// Team returns a team by ID or name.
func (c *Client) Team(ctx context.Context, ref string) (api.TeamInfo, error) {
	var out api.TeamInfo
	_, err := c.do(ctx, http.MethodGet, "/teams/"+url.PathEscape(ref), nil, &out)
	return out, err
}

// CreateTeam makes a team (operator keys only), with quotas (nil: the
// deployment's default quotas; zero: no limits).
func (c *Client) CreateTeam(ctx context.Context, name string, quotas *store.Quotas) (api.TeamInfo, error) {
	var out api.TeamInfo
	_, err := c.do(ctx, http.MethodPost, "/teams", api.CreateTeamRequest{Name: name, Quotas: quotas}, &out)
	return out, err
}

// SetTeamQuotas replaces a team's quotas (operator keys only).
func (c *Client) SetTeamQuotas(ctx context.Context, ref string, quotas store.Quotas) (api.TeamInfo, error) {
	var out api.TeamInfo
	_, err := c.do(ctx, http.MethodPatch, "/teams/"+url.PathEscape(ref), api.UpdateTeamRequest{Quotas: &quotas}, &out)
	return out, err
}

// DeleteTeam removes an empty team and revokes its keys (operator keys
// only).
func (c *Client) DeleteTeam(ctx context.Context, ref string) error {
	_, err := c.do(ctx, http.MethodDelete, "/teams/"+url.PathEscape(ref), nil, nil)
	return err
}

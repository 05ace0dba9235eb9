package client

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strconv"

	"github.com/spore-run/spore/internal/api"
	"github.com/spore-run/spore/internal/build"
	"github.com/spore-run/spore/internal/errdefs"
)

// E2B's template build API, as the stock SDK calls it (see
// docs/templates.md): request a build, upload the COPY steps' files by
// hash, start the build with its spec, poll its status and logs; tags.

// RequestBuild records a build of req.Name ("name" or "name:tag")
// waiting for its spec.
func (c *Client) RequestBuild(ctx context.Context, req api.BuildRequest) (api.BuildRequestResponse, error) {
	var out api.BuildRequestResponse
	_, err := c.do(ctx, "POST", "/v3/templates", req, &out)
	return out, err
}

// FileUploadLink says whether the files of hash are uploaded already and,
// when not, where to PUT them.
func (c *Client) FileUploadLink(ctx context.Context, template, hash string) (api.FileUpload, error) {
	var out api.FileUpload
	_, err := c.do(ctx, "GET", "/templates/"+url.PathEscape(template)+"/files/"+url.PathEscape(hash), nil, &out)
	return out, err
}

// UploadFiles PUTs size bytes of body (a tar, optionally gzipped) to the
// link FileUploadLink gave, with its headers.
func (c *Client) UploadFiles(ctx context.Context, link api.FileUpload, body io.Reader, size int64) error {
	if link.URL == "" {
		return fmt.Errorf("%w: the upload link has no URL", errdefs.ErrInvalidArgument)
	}
	req, err := http.NewRequestWithContext(ctx, "PUT", link.URL, body)
	if err != nil {
		return err
	}
	// The server refuses an upload of unknown length: it checks the size
	// before storing anything.
	req.ContentLength = size
	req.Header.Set("Content-Type", "application/octet-stream")
	for k, v := range link.Headers {
		req.Header.Set(k, v)
	}
	resp, err := c.http.Do(req)
	if err != nil {
		return fmt.Errorf("PUT %s: %w: %v", link.URL, errdefs.ErrUnavailable, err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	if resp.StatusCode >= 300 {
		return errorOf(resp.StatusCode, b)
	}
	return nil
}

// StartBuild starts template's waiting build with spec.
func (c *Client) StartBuild(ctx context.Context, template, buildID string, spec build.Spec) error {
	_, err := c.do(ctx, "POST", "/v2/templates/"+url.PathEscape(template)+"/builds/"+url.PathEscape(buildID), spec, nil)
	return err
}

// BuildStatus returns a build's status and its log entries from
// logsOffset on (a page of them: poll again for more).
func (c *Client) BuildStatus(ctx context.Context, template, buildID string, logsOffset int) (api.BuildInfo, error) {
	var out api.BuildInfo
	q := url.Values{"logsOffset": {strconv.Itoa(logsOffset)}}
	_, err := c.do(ctx, "GET", "/templates/"+url.PathEscape(template)+"/builds/"+url.PathEscape(buildID)+"/status?"+q.Encode(), nil, &out)
	return out, err
}

// Template returns a template with its builds.
func (c *Client) Template(ctx context.Context, template string) (api.TemplateWithBuilds, error) {
	var out api.TemplateWithBuilds
	_, err := c.do(ctx, "GET", "/templates/"+url.PathEscape(template), nil, &out)
	return out, err
}

// TemplateTags lists a template's tags.
func (c *Client) TemplateTags(ctx context.Context, template string) ([]api.TemplateTag, error) {
	var out []api.TemplateTag
	_, err := c.do(ctx, "GET", "/templates/"+url.PathEscape(template)+"/tags", nil, &out)
	return out, err
}

// AssignTags gives tags to the build target ("name:tag"; "name" is its
// default tag) names, and returns that build's ID.
func (c *Client) AssignTags(ctx context.Context, target string, tags []string) (string, error) {
	var out struct {
		BuildID string `json:"buildID"`
	}
	_, err := c.do(ctx, "POST", "/templates/tags", map[string]any{"target": target, "tags": tags}, &out)
	return out.BuildID, err
}

// RemoveTags removes tags of template name (all must exist).
func (c *Client) RemoveTags(ctx context.Context, name string, tags []string) error {
	_, err := c.do(ctx, "DELETE", "/templates/tags", map[string]any{"name": name, "tags": tags}, nil)
	return err
}

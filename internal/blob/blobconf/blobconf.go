// Package blobconf opens the blob store an operator names on the command
// line (`--blob-store`):
//
//	none                          no blob store: snapshots stay on the node's disk
//	/abs/dir, file:///abs/dir     a directory (blob/local): one host, or a shared file system
//	s3://BUCKET[/PREFIX][?opts]   an S3-compatible bucket (blob/s3)
//
// S3 options (query parameters): endpoint=URL (empty: AWS), region=R,
// path-style=true|false (default true when an endpoint is given: most
// self-hosted servers need it), profile=P, credentials-file=/abs/path (a
// shared credentials file, AWS's format, whose profile P or "default"
// holds the keys; it wins over the environment). Otherwise credentials
// come from the usual places (AWS_ACCESS_KEY_ID/AWS_SECRET_ACCESS_KEY,
// AWS_PROFILE, ~/.aws/credentials and config, web identity, instance
// roles), never from the URL.
package blobconf

import (
	"context"
	"fmt"
	"net/url"
	"path/filepath"
	"strconv"
	"strings"

	"github.com/spore-run/spore/internal/blob"
	"github.com/spore-run/spore/internal/blob/local"
	"github.com/spore-run/spore/internal/blob/s3"
	"github.com/spore-run/spore/internal/errdefs"
)

// Open returns the store spec names; nil (and no error) for "none" and "".
func Open(ctx context.Context, spec string) (blob.Store, error) {
	switch {
	case spec == "" || spec == "none":
		return nil, nil
	case strings.HasPrefix(spec, "/"):
		return openDir(spec)
	}
	u, err := url.Parse(spec)
	if err != nil {
		return nil, errdefs.Invalidf("--blob-store %q: %v", spec, err)
	}
	switch u.Scheme {
	case "file":
		if u.Host != "" || !filepath.IsAbs(u.Path) {
			return nil, errdefs.Invalidf("--blob-store %q: want file:///absolute/path", spec)
		}
		return openDir(u.Path)
	case "s3":
		return openS3(ctx, spec, u)
	}
	return nil, errdefs.Invalidf("--blob-store %q: want none, /abs/dir, file:///abs/dir or s3://bucket[/prefix][?endpoint=...]", spec)
}

func openDir(dir string) (blob.Store, error) {
	st, err := local.Open(filepath.Clean(dir))
	if err != nil {
		return nil, fmt.Errorf("blob store %s: %w", dir, err)
	}
	return st, nil
}

func openS3(ctx context.Context, spec string, u *url.URL) (blob.Store, error) {
	if u.Host == "" {
		return nil, errdefs.Invalidf("--blob-store %q: no bucket", spec)
	}
	if u.User != nil {
		return nil, errdefs.Invalidf("--blob-store %q: credentials do not go in the URL (use AWS_ACCESS_KEY_ID/AWS_SECRET_ACCESS_KEY or a profile)", spec)
	}
	cfg := s3.Config{Bucket: u.Host}
	if p := strings.Trim(u.Path, "/"); p != "" {
		cfg.Prefix = p + "/"
	}
	q := u.Query()
	for k := range q {
		switch k {
		case "endpoint", "region", "path-style", "profile", "credentials-file":
		default:
			return nil, errdefs.Invalidf("--blob-store %q: unknown option %q (endpoint, region, path-style, profile, credentials-file)", spec, k)
		}
	}
	cfg.Endpoint, cfg.Region, cfg.Profile = q.Get("endpoint"), q.Get("region"), q.Get("profile")
	if f := q.Get("credentials-file"); f != "" {
		if !filepath.IsAbs(f) {
			return nil, errdefs.Invalidf("--blob-store %q: credentials-file=%q: want an absolute path", spec, f)
		}
		cfg.CredentialsFile = f
	}
	cfg.PathStyle = cfg.Endpoint != ""
	if v := q.Get("path-style"); v != "" {
		b, err := strconv.ParseBool(v)
		if err != nil {
			return nil, errdefs.Invalidf("--blob-store %q: path-style=%q: want true or false", spec, v)
		}
		cfg.PathStyle = b
	}
	st, err := s3.New(ctx, cfg)
	if err != nil {
		return nil, fmt.Errorf("blob store %s: %w", spec, err)
	}
	return st, nil
}

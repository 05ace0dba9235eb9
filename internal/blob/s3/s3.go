// Package s3 is a blob.Store on an S3-compatible server (AWS S3, SeaweedFS,
// Ceph RGW, Cloudflare R2, versitygw, ...), with the AWS SDK for Go v2.
//
// Objects are named Config.Prefix + key in one bucket. A Put is atomic
// because S3's are: a PUT (or a multipart upload's completion) makes the
// whole object visible at once, and an interrupted one makes nothing
// visible. Credentials come from the SDK's usual chain (environment,
// shared config and credentials files, a profile, web identity, instance
// roles) unless Config names static keys.
//
// Integrity is not this package's job: what the server returns is what Get
// returns (the chunk layer names chunks by their hash and checks it).
package s3

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/aws/retry"
	v4 "github.com/aws/aws-sdk-go-v2/aws/signer/v4"
	awshttp "github.com/aws/aws-sdk-go-v2/aws/transport/http"
	"github.com/aws/aws-sdk-go-v2/config"
	"github.com/aws/aws-sdk-go-v2/credentials"
	awss3 "github.com/aws/aws-sdk-go-v2/service/s3"
	"github.com/aws/aws-sdk-go-v2/service/s3/types"

	"github.com/spore-run/spore/internal/blob"
	"github.com/spore-run/spore/internal/errdefs"
)

// Config says which bucket to use and how to reach it.
type Config struct {
	// Endpoint is the server's base URL (http://host:port); empty: AWS S3.
	Endpoint string
	// Region; empty: the environment's or profile's (AWS_REGION, ...),
	// else us-east-1.
	Region string
	Bucket string
	// Prefix is prepended to every key as is (end it with "/" for a
	// folder); keys listed are returned without it.
	Prefix string
	// PathStyle addresses the bucket in the path (http://host/bucket/key)
	// instead of the host name (http://bucket.host/key). Most self-hosted
	// servers need it unless set up with a wildcard DNS name.
	PathStyle bool

	// AccessKeyID and SecretAccessKey (and SessionToken) are static
	// credentials; empty: the SDK's default chain (AWS_ACCESS_KEY_ID and
	// AWS_SECRET_ACCESS_KEY, AWS_PROFILE, ~/.aws/credentials and config,
	// web identity, container and instance roles).
	AccessKeyID     string
	SecretAccessKey string
	SessionToken    string
	// Profile picks a shared-config profile (else AWS_PROFILE or default).
	Profile string
	// CredentialsFile is a shared credentials file (AWS's format) whose
	// Profile (default "default") holds the keys; it wins over the
	// environment's credentials (a local fleet's server's keys).
	CredentialsFile string

	// MaxAttempts is how many times a request is tried (default 5), with
	// jittered exponential backoff of at most MaxBackoff (default 5 s).
	MaxAttempts int
	MaxBackoff  time.Duration
	// BufferLimit: a Put of at most this many bytes is read into memory
	// first, so the SDK can retry it (default 8 MiB). Larger ones stream,
	// and fail on the first transient error (the caller retries).
	BufferLimit int64
	// MultipartThreshold: larger Puts are multipart uploads of PartSize
	// parts, each buffered and retried (defaults 64 MiB and 16 MiB).
	MultipartThreshold int64
	PartSize           int64

	// HTTPClient replaces the SDK's HTTP client (tests).
	HTTPClient *http.Client
}

// Store is a blob.Store in an S3 bucket; safe for concurrent use.
type Store struct {
	c   *awss3.Client
	cfg Config
}

var _ blob.Store = (*Store)(nil)

// New makes a store from cfg. It does not contact the server (EnsureBucket
// does).
func New(ctx context.Context, cfg Config) (*Store, error) {
	if cfg.Bucket == "" {
		return nil, errdefs.Invalidf("s3 blob store: no bucket")
	}
	if err := blob.CheckPrefix(cfg.Prefix); err != nil {
		return nil, fmt.Errorf("s3 blob store prefix: %w", err)
	}
	if cfg.MaxAttempts <= 0 {
		cfg.MaxAttempts = 5
	}
	if cfg.MaxBackoff <= 0 {
		cfg.MaxBackoff = 5 * time.Second
	}
	if cfg.BufferLimit <= 0 {
		cfg.BufferLimit = 8 << 20
	}
	if cfg.MultipartThreshold <= 0 {
		cfg.MultipartThreshold = 64 << 20
	}
	if cfg.PartSize <= 0 {
		cfg.PartSize = 16 << 20
	}
	if cfg.PartSize < 5<<20 {
		return nil, errdefs.Invalidf("s3 blob store: part size %d is under S3's minimum of 5 MiB", cfg.PartSize)
	}
	opts := []func(*config.LoadOptions) error{
		config.WithRetryer(func() aws.Retryer {
			return retry.NewStandard(func(o *retry.StandardOptions) {
				o.MaxAttempts = cfg.MaxAttempts
				o.MaxBackoff = cfg.MaxBackoff
			})
		}),
	}
	if cfg.Region != "" {
		opts = append(opts, config.WithRegion(cfg.Region))
	}
	if cfg.CredentialsFile != "" && cfg.AccessKeyID == "" && cfg.SecretAccessKey == "" {
		profile := cfg.Profile
		if profile == "" {
			profile = "default"
		}
		sc, err := config.LoadSharedConfigProfile(ctx, profile, func(o *config.LoadSharedConfigOptions) {
			o.CredentialsFiles, o.ConfigFiles = []string{cfg.CredentialsFile}, []string{}
		})
		if err != nil {
			return nil, fmt.Errorf("%w: s3 blob store: credentials file %s: %w", errdefs.ErrInvalidArgument, cfg.CredentialsFile, err)
		}
		if !sc.Credentials.HasKeys() {
			return nil, errdefs.Invalidf("s3 blob store: credentials file %s: profile %q has no keys", cfg.CredentialsFile, profile)
		}
		cfg.AccessKeyID, cfg.SecretAccessKey, cfg.SessionToken = sc.Credentials.AccessKeyID, sc.Credentials.SecretAccessKey, sc.Credentials.SessionToken
	}
	if cfg.Profile != "" && cfg.CredentialsFile == "" {
		opts = append(opts, config.WithSharedConfigProfile(cfg.Profile))
	}
	if cfg.AccessKeyID != "" || cfg.SecretAccessKey != "" {
		opts = append(opts, config.WithCredentialsProvider(
			credentials.NewStaticCredentialsProvider(cfg.AccessKeyID, cfg.SecretAccessKey, cfg.SessionToken)))
	}
	if cfg.HTTPClient == nil {
		// No overall timeout (bodies are large); a server that accepts a
		// connection and then says nothing fails the attempt.
		opts = append(opts, config.WithHTTPClient(awshttp.NewBuildableClient().
			WithDialerOptions(func(d *net.Dialer) { d.Timeout = 10 * time.Second }).
			WithTransportOptions(func(t *http.Transport) {
				t.ResponseHeaderTimeout = time.Minute
				t.MaxIdleConnsPerHost = 32
			})))
	}
	awsCfg, err := config.LoadDefaultConfig(ctx, opts...)
	if err != nil {
		return nil, fmt.Errorf("%w: s3 blob store: loading the AWS configuration: %w", errdefs.ErrInvalidArgument, err)
	}
	if awsCfg.Region == "" {
		awsCfg.Region = "us-east-1"
	}
	c := awss3.NewFromConfig(awsCfg, func(o *awss3.Options) {
		if cfg.Endpoint != "" {
			o.BaseEndpoint = aws.String(cfg.Endpoint)
		}
		o.UsePathStyle = cfg.PathStyle
		// No "Expect: 100-continue" on PUTs (the SDK adds it above 2 MB):
		// a server that does not answer it (versitygw) stalls each such PUT
		// for the client's 1 s continue timeout, which made uploads of
		// chunks up to 4 MB crawl (21.7 MB/s); objects are small and
		// buffered, so the saved round trip is all it gives.
		o.ContinueHeaderThresholdBytes = -1
		if cfg.HTTPClient != nil {
			o.HTTPClient = cfg.HTTPClient
		}
		// What the server holds is what Get returns: the chunk layer checks
		// every chunk against its hash and refetches a bad one from another
		// tier, for whole objects and ranges alike (the SDK's check covers
		// only whole objects put with a checksum, and fails at EOF).
		o.ResponseChecksumValidation = aws.ResponseChecksumValidationWhenRequired
		o.DisableLogOutputChecksumValidationSkipped = true
	})
	return &Store{c: c, cfg: cfg}, nil
}

// Client is the SDK client (benchmarks compare against it).
func (s *Store) Client() *awss3.Client { return s.c }

// EnsureBucket creates the bucket unless it exists (setup and tests).
func (s *Store) EnsureBucket(ctx context.Context) error {
	_, err := s.c.HeadBucket(ctx, &awss3.HeadBucketInput{Bucket: aws.String(s.cfg.Bucket)})
	if err == nil {
		return nil
	}
	if err := s.mapErr("head bucket", "", err); !errdefs.IsNotFound(err) && !isNoSuchBucket(err) {
		return err
	}
	in := &awss3.CreateBucketInput{Bucket: aws.String(s.cfg.Bucket)}
	// Outside us-east-1 AWS wants the region restated.
	if r := s.c.Options().Region; r != "us-east-1" {
		in.CreateBucketConfiguration = &types.CreateBucketConfiguration{LocationConstraint: types.BucketLocationConstraint(r)}
	}
	_, err = s.c.CreateBucket(ctx, in)
	var owned *types.BucketAlreadyOwnedByYou
	if err != nil && !errors.As(err, &owned) {
		return s.mapErr("create bucket", "", err)
	}
	return nil
}

func (s *Store) name(key string) *string { return aws.String(s.cfg.Prefix + key) }

// Put implements blob.Store.
func (s *Store) Put(ctx context.Context, key string, r io.Reader, size int64) error {
	if err := blob.CheckKey(key); err != nil {
		return err
	}
	if size < 0 {
		return errdefs.Invalidf("blob %s: negative size %d", key, size)
	}
	if err := ctx.Err(); err != nil {
		return fmt.Errorf("s3 put %s: %w", key, err)
	}
	src := &sourceReader{r: blob.ExactReader(ctx, r, size)}
	var err error
	switch {
	case size > s.cfg.MultipartThreshold:
		err = s.putMultipart(ctx, key, src, size)
	case size <= s.cfg.BufferLimit:
		// In memory, so the SDK can rewind it to retry.
		buf := make([]byte, size)
		if _, rerr := io.ReadFull(src, buf); rerr != nil {
			return fmt.Errorf("s3 put %s: %w", key, src.cause(rerr))
		}
		err = s.putObject(ctx, key, bytes.NewReader(buf), size)
	default:
		err = s.putObject(ctx, key, src, size)
	}
	if err != nil {
		// The source's own failure says more than the transport's.
		if src.err != nil {
			return fmt.Errorf("s3 put %s: %w", key, src.err)
		}
		return s.mapErr("put", key, err)
	}
	return nil
}

func (s *Store) putObject(ctx context.Context, key string, body io.Reader, size int64) error {
	var opts []func(*awss3.Options)
	if _, seekable := body.(io.Seeker); !seekable && strings.HasPrefix(s.cfg.Endpoint, "http://") {
		// A stream over plain HTTP: the SDK can neither hash the payload
		// for the signature (that reads it twice) nor send a trailing
		// checksum (HTTPS only), so it goes unsigned and unchecksummed, as
		// a presigned PUT does; TCP checks the transfer and the chunk layer
		// the content. Over HTTPS it streams with a trailing checksum.
		opts = append(opts, func(o *awss3.Options) {
			o.RequestChecksumCalculation = aws.RequestChecksumCalculationWhenRequired
			o.APIOptions = append(o.APIOptions, v4.SwapComputePayloadSHA256ForUnsignedPayloadMiddleware)
		})
	}
	_, err := s.c.PutObject(ctx, &awss3.PutObjectInput{
		Bucket:        aws.String(s.cfg.Bucket),
		Key:           s.name(key),
		Body:          body,
		ContentLength: aws.Int64(size),
	}, opts...)
	return err
}

// putMultipart uploads size bytes in parts; the object appears whole when
// the upload completes, and a failed upload is aborted.
func (s *Store) putMultipart(ctx context.Context, key string, src io.Reader, size int64) (err error) {
	up, err := s.c.CreateMultipartUpload(ctx, &awss3.CreateMultipartUploadInput{
		Bucket: aws.String(s.cfg.Bucket),
		Key:    s.name(key),
	})
	if err != nil {
		return err
	}
	defer func() {
		if err == nil {
			return
		}
		// The caller's context may be what failed: abort on our own.
		actx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 30*time.Second)
		defer cancel()
		if _, aerr := s.c.AbortMultipartUpload(actx, &awss3.AbortMultipartUploadInput{
			Bucket: aws.String(s.cfg.Bucket), Key: s.name(key), UploadId: up.UploadId,
		}); aerr != nil {
			// Left for the bucket's lifecycle rule; nothing is visible.
			slog.Warn("s3: aborting a failed multipart upload", "key", key, "upload", aws.ToString(up.UploadId), "err", aerr)
		}
	}()
	var parts []types.CompletedPart
	buf := make([]byte, s.cfg.PartSize)
	for n, left := int32(1), size; left > 0; n++ {
		part := buf[:min(left, s.cfg.PartSize)]
		if _, err := io.ReadFull(src, part); err != nil {
			return err
		}
		left -= int64(len(part))
		out, err := s.c.UploadPart(ctx, &awss3.UploadPartInput{
			Bucket:        aws.String(s.cfg.Bucket),
			Key:           s.name(key),
			UploadId:      up.UploadId,
			PartNumber:    aws.Int32(n),
			Body:          bytes.NewReader(part),
			ContentLength: aws.Int64(int64(len(part))),
		})
		if err != nil {
			return err
		}
		parts = append(parts, types.CompletedPart{PartNumber: aws.Int32(n), ETag: out.ETag})
	}
	_, err = s.c.CompleteMultipartUpload(ctx, &awss3.CompleteMultipartUploadInput{
		Bucket:          aws.String(s.cfg.Bucket),
		Key:             s.name(key),
		UploadId:        up.UploadId,
		MultipartUpload: &types.CompletedMultipartUpload{Parts: parts},
	})
	return err
}

// Get implements blob.Store.
func (s *Store) Get(ctx context.Context, key string) (io.ReadCloser, error) {
	if err := blob.CheckKey(key); err != nil {
		return nil, err
	}
	out, err := s.c.GetObject(ctx, &awss3.GetObjectInput{Bucket: aws.String(s.cfg.Bucket), Key: s.name(key)})
	if err != nil {
		return nil, s.mapErr("get", key, err)
	}
	return out.Body, nil
}

// GetRange implements blob.Store. S3 answers a range that starts past the
// end with 416 and cuts one that ends past it short; the contract wants
// both refused, and an empty range at the very end allowed.
func (s *Store) GetRange(ctx context.Context, key string, offset, length int64) (io.ReadCloser, error) {
	if err := blob.CheckKey(key); err != nil {
		return nil, err
	}
	if offset < 0 {
		return nil, blob.CheckRange(key, offset, length, 0)
	}
	if length == 0 {
		info, err := s.Stat(ctx, key)
		if err != nil {
			return nil, err
		}
		if err := blob.CheckRange(key, offset, length, info.Size); err != nil {
			return nil, err
		}
		return io.NopCloser(strings.NewReader("")), nil
	}
	rng := fmt.Sprintf("bytes=%d-", offset)
	if length > 0 {
		rng += strconv.FormatInt(offset+length-1, 10)
	}
	out, err := s.c.GetObject(ctx, &awss3.GetObjectInput{Bucket: aws.String(s.cfg.Bucket), Key: s.name(key), Range: aws.String(rng)})
	if err != nil {
		err = s.mapErr("get", key, err)
		if errdefs.IsInvalidArgument(err) && length < 0 {
			// 416: offset >= size. offset == size is an empty range.
			info, serr := s.Stat(ctx, key)
			if serr != nil {
				return nil, serr
			}
			if offset == info.Size {
				return io.NopCloser(strings.NewReader("")), nil
			}
			return nil, blob.CheckRange(key, offset, length, info.Size)
		}
		return nil, err
	}
	total, ok := rangeTotal(aws.ToString(out.ContentRange))
	if !ok {
		out.Body.Close()
		return nil, fmt.Errorf("%w: s3 get %s: the server ignored the range %s (Content-Range %q)",
			errdefs.ErrInternal, key, rng, aws.ToString(out.ContentRange))
	}
	if err := blob.CheckRange(key, offset, length, total); err != nil {
		out.Body.Close()
		return nil, err
	}
	return out.Body, nil
}

// rangeTotal parses the complete length of "bytes 0-9/10".
func rangeTotal(cr string) (int64, bool) {
	_, total, ok := strings.Cut(cr, "/")
	if !ok || !strings.HasPrefix(cr, "bytes ") {
		return 0, false
	}
	n, err := strconv.ParseInt(total, 10, 64)
	return n, err == nil
}

// Stat implements blob.Store.
func (s *Store) Stat(ctx context.Context, key string) (blob.Info, error) {
	if err := blob.CheckKey(key); err != nil {
		return blob.Info{}, err
	}
	out, err := s.c.HeadObject(ctx, &awss3.HeadObjectInput{Bucket: aws.String(s.cfg.Bucket), Key: s.name(key)})
	if err != nil {
		return blob.Info{}, s.mapErr("stat", key, err)
	}
	return blob.Info{Key: key, Size: aws.ToInt64(out.ContentLength), Modified: aws.ToTime(out.LastModified)}, nil
}

// Delete implements blob.Store.
func (s *Store) Delete(ctx context.Context, key string) error {
	if err := blob.CheckKey(key); err != nil {
		return err
	}
	_, err := s.c.DeleteObject(ctx, &awss3.DeleteObjectInput{Bucket: aws.String(s.cfg.Bucket), Key: s.name(key)})
	if err != nil {
		if err := s.mapErr("delete", key, err); !errdefs.IsNotFound(err) || isNoSuchBucket(err) {
			return err
		}
	}
	return nil
}

// List implements blob.Store: ListObjectsV2 pages (S3 lists in UTF-8
// binary order, which is the keys' lexical order). Names under the prefix
// that are not keys (written by something else) are skipped.
func (s *Store) List(ctx context.Context, prefix string, fn func(blob.Info) error) error {
	if err := blob.CheckPrefix(prefix); err != nil {
		return err
	}
	p := awss3.NewListObjectsV2Paginator(s.c, &awss3.ListObjectsV2Input{
		Bucket: aws.String(s.cfg.Bucket),
		Prefix: aws.String(s.cfg.Prefix + prefix),
	})
	for p.HasMorePages() {
		page, err := p.NextPage(ctx)
		if err != nil {
			return s.mapErr("list", prefix, err)
		}
		for _, o := range page.Contents {
			key, ok := strings.CutPrefix(aws.ToString(o.Key), s.cfg.Prefix)
			if !ok || blob.CheckKey(key) != nil {
				continue
			}
			if err := fn(blob.Info{Key: key, Size: aws.ToInt64(o.Size), Modified: aws.ToTime(o.LastModified)}); err != nil {
				return err
			}
		}
	}
	return nil
}

// sourceReader remembers the first error of a Put's source, which the
// transport may replace by its own.
type sourceReader struct {
	r   io.Reader
	err error
}

func (s *sourceReader) Read(p []byte) (int, error) {
	n, err := s.r.Read(p)
	if err != nil && err != io.EOF && s.err == nil {
		s.err = err
	}
	return n, err
}

func (s *sourceReader) cause(err error) error {
	if s.err != nil {
		return s.err
	}
	return err
}

package s3

import (
	"context"
	"errors"
	"fmt"
	"net/http"

	awshttp "github.com/aws/aws-sdk-go-v2/aws/transport/http"
	"github.com/aws/smithy-go"
	smithyhttp "github.com/aws/smithy-go/transport/http"

	"github.com/spore-run/spore/internal/errdefs"
)

// mapErr gives an SDK error its errdefs kind, keeping the SDK's error (and
// a context's cancellation) in the chain:
//
//	missing object (NoSuchKey, a 404)          ErrNotFound
//	missing bucket (NoSuchBucket)              ErrUnavailable: the store is not set up
//	bad range (416), other 400s                ErrInvalidArgument
//	refused credentials (401, 403, their codes) ErrUnavailable, saying so
//	5xx, 429, throttling, no answer at all     ErrUnavailable (after the retries)
//	anything else                              ErrInternal
func (s *Store) mapErr(op, key string, err error) error {
	what := fmt.Sprintf("s3 %s %s/%s%s", op, s.cfg.Bucket, s.cfg.Prefix, key)
	if errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded) {
		return fmt.Errorf("%s: %w", what, err)
	}
	var re *awshttp.ResponseError
	var send *smithyhttp.RequestSendError
	if !errors.As(err, &re) || errors.As(err, &send) || re.HTTPStatusCode() == 0 {
		return fmt.Errorf("%w: %s: cannot reach %s: %w", errdefs.ErrUnavailable, what, s.endpoint(), err)
	}
	code := ""
	var api smithy.APIError
	if errors.As(err, &api) {
		code = api.ErrorCode()
	}
	status := re.HTTPStatusCode()
	switch {
	case credentialCodes[code] || status == http.StatusUnauthorized || status == http.StatusForbidden:
		return fmt.Errorf("%w: %s: access denied by %s (check the credentials and the bucket's policy): %w",
			errdefs.ErrUnavailable, what, s.endpoint(), err)
	case code == "NoSuchBucket":
		return fmt.Errorf("%w: %s: bucket %s does not exist at %s: %w", errdefs.ErrUnavailable, what, s.cfg.Bucket, s.endpoint(), errNoSuchBucket{err})
	case code == "NoSuchKey" || status == http.StatusNotFound:
		return fmt.Errorf("%w: %s: %w", errdefs.ErrNotFound, what, err)
	case code == "InvalidRange" || status == http.StatusRequestedRangeNotSatisfiable:
		return fmt.Errorf("%w: %s: range past the end: %w", errdefs.ErrInvalidArgument, what, err)
	case status >= 500 || status == http.StatusTooManyRequests || code == "SlowDown":
		return fmt.Errorf("%w: %s: server error: %w", errdefs.ErrUnavailable, what, err)
	case status == http.StatusBadRequest:
		return fmt.Errorf("%w: %s: %w", errdefs.ErrInvalidArgument, what, err)
	}
	return fmt.Errorf("%w: %s: %w", errdefs.ErrInternal, what, err)
}

// credentialCodes are the error codes of refused credentials, whatever
// their status (versitygw answers an unknown access key with a 404).
var credentialCodes = map[string]bool{
	"AccessDenied": true, "InvalidAccessKeyId": true, "SignatureDoesNotMatch": true,
	"ExpiredToken": true, "InvalidToken": true, "TokenRefreshRequired": true,
	"AuthorizationHeaderMalformed": true, "XAdminUserNotFound": true,
}

func (s *Store) endpoint() string {
	if s.cfg.Endpoint != "" {
		return s.cfg.Endpoint
	}
	return "AWS S3"
}

// errNoSuchBucket marks a missing bucket in the chain (EnsureBucket
// creates it; Delete does not call it a missing object).
type errNoSuchBucket struct{ error }

func (e errNoSuchBucket) Unwrap() error { return e.error }

func isNoSuchBucket(err error) bool {
	var nb errNoSuchBucket
	return errors.As(err, &nb)
}

// Package s3server runs the S3-compatible server Spore tests and local
// fleets use: versitygw (Apache-2.0) with its posix backend, which serves a
// bucket from a plain directory. `make s3-tools` (scripts/s3-tools.sh)
// builds it into $SPORE_CACHE_DIR/s3/versitygw-<Version>/.
package s3server

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/credentials"
	"github.com/aws/aws-sdk-go-v2/service/s3"

	"github.com/spore-run/spore/internal/errdefs"
)

// Version is the versitygw version scripts/s3-tools.sh builds (keep equal).
const Version = "v1.8.0"

// BinEnv overrides the versitygw binary.
const BinEnv = "SPORE_VERSITYGW"

// Bin returns the versitygw binary: $SPORE_VERSITYGW, else the one
// `make s3-tools` built under $SPORE_CACHE_DIR (default /var/cache/spore).
func Bin() (string, error) {
	p := os.Getenv(BinEnv)
	if p == "" {
		cache := os.Getenv("SPORE_CACHE_DIR")
		if cache == "" {
			cache = "/var/cache/spore"
		}
		p = filepath.Join(cache, "s3", "versitygw-"+Version, "versitygw")
	}
	if _, err := os.Stat(p); err != nil {
		return p, fmt.Errorf("the S3 server (versitygw %s) is not at %s: build it with `make s3-tools` (or set %s): %w",
			Version, p, BinEnv, errdefs.ErrNotFound)
	}
	return p, nil
}

// Server says how to run one versitygw.
type Server struct {
	Bin    string
	Listen []string // host:port addresses (versitygw listens on each)
	Dir    string   // the posix backend's directory: bucket B is Dir/B
	Region string
	// AccessKey and SecretKey are the root user's keys; they go in the
	// process's environment, not its command line.
	AccessKey, SecretKey string
	// VirtualDomain, if set, enables virtual-host addressing under it.
	VirtualDomain string
}

// Command returns the command that runs the server (not started). Its
// health check answers on /health.
func (s Server) Command() *exec.Cmd {
	var args []string
	for _, l := range s.Listen {
		args = append(args, "--port", l)
	}
	args = append(args, "--region", s.Region, "--health", "/health", "--quiet")
	if s.VirtualDomain != "" {
		args = append(args, "--virtual-domain", s.VirtualDomain)
	}
	cmd := exec.Command(s.Bin, append(args, "posix", s.Dir)...)
	cmd.Env = append(os.Environ(), "ROOT_ACCESS_KEY_ID="+s.AccessKey, "ROOT_SECRET_ACCESS_KEY="+s.SecretKey)
	return cmd
}

// CreateBucket makes bucket on the server at endpoint (path-style).
func CreateBucket(ctx context.Context, endpoint, region, accessKey, secretKey, bucket string) error {
	c := s3.New(s3.Options{
		Region:       region,
		BaseEndpoint: aws.String(endpoint),
		UsePathStyle: true,
		Credentials:  credentials.NewStaticCredentialsProvider(accessKey, secretKey, ""),
	})
	if _, err := c.CreateBucket(ctx, &s3.CreateBucketInput{Bucket: aws.String(bucket)}); err != nil {
		return fmt.Errorf("create bucket %s at %s: %w", bucket, endpoint, err)
	}
	return nil
}

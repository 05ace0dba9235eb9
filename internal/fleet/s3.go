package fleet

import (
	"bufio"
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"net/url"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/spore-run/spore/internal/errdefs"
	"github.com/spore-run/spore/internal/pgcluster"
	"github.com/spore-run/spore/internal/s3server"
)

// A fleet's shared blob store is, by default, an S3 server of its own
// (versitygw; `make s3-tools` builds it): snapshots, hibernations and
// templates then travel between the nodes through S3 exactly as in a
// deployment with a real object store. It listens on every address, and
// the fleet's host table admits its port only on loopback and the nodes'
// links (like the API replicas'); each node reaches it at its gateway.
// Its keys are random, kept in <dir>/s3-credentials (AWS's shared
// credentials format, mode 0600), which the nodes' --blob-store names.

// S3 is the fleet's S3 server.
type S3 struct {
	Bin             string `json:"bin"`
	Dir             string `json:"dir"` // the posix backend's directory: the bucket is Dir/Bucket
	Port            int    `json:"port"`
	Endpoint        string `json:"endpoint"` // for the host: http://127.0.0.1:PORT
	Region          string `json:"region"`
	Bucket          string `json:"bucket"`
	CredentialsFile string `json:"credentials_file"`
}

// DefaultBucket is the bucket a fleet's S3 server holds.
const DefaultBucket = "spore"

// nodeSpec is the --blob-store the nodes get ({host}: each one's gateway).
func (x *S3) nodeSpec() string {
	q := url.Values{"endpoint": {"http://{host}:" + strconv.Itoa(x.Port)}, "region": {x.Region}, "credentials-file": {x.CredentialsFile}}
	// The placeholder must survive encoding, for the node's substitution.
	enc := strings.NewReplacer("%7Bhost%7D", "{host}").Replace(q.Encode())
	return "s3://" + x.Bucket + "?" + enc
}

// prepareS3 records the fleet's S3 server (binary, port, directory, keys)
// before anything depends on it; startS3 starts it.
func prepareS3(cfg Config, st *State) error {
	bin := cfg.S3Server // validate found it
	port, err := pgcluster.FreePort()
	if err != nil {
		return err
	}
	x := &S3{Bin: bin, Dir: filepath.Join(cfg.Dir, "s3"), Port: port, Endpoint: fmt.Sprintf("http://127.0.0.1:%d", port),
		Region: "us-east-1", Bucket: DefaultBucket, CredentialsFile: filepath.Join(cfg.Dir, "s3-credentials")}
	var b [20]byte
	if _, err := rand.Read(b[:]); err != nil {
		return err
	}
	access, secret := "spore-fleet-"+hex.EncodeToString(b[:4]), hex.EncodeToString(b[4:])
	creds := fmt.Sprintf("[default]\naws_access_key_id = %s\naws_secret_access_key = %s\n", access, secret)
	if err := os.WriteFile(x.CredentialsFile, []byte(creds), 0o600); err != nil {
		return err
	}
	if err := os.MkdirAll(filepath.Join(x.Dir, "data"), 0o700); err != nil {
		return err
	}
	st.S3 = x
	return st.save()
}

// server is how to run the fleet's S3 server (keys from its file).
func (x *S3) server() (s3server.Server, error) {
	access, secret, err := readCredentials(x.CredentialsFile)
	if err != nil {
		return s3server.Server{}, err
	}
	return s3server.Server{Bin: x.Bin, Listen: []string{"0.0.0.0:" + strconv.Itoa(x.Port)}, Dir: filepath.Join(x.Dir, "data"),
		Region: x.Region, AccessKey: access, SecretKey: secret}, nil
}

// startS3 starts the fleet's S3 server, waits for it and makes its bucket.
func startS3(ctx context.Context, cfg Config, st *State) error {
	srv, err := st.S3.server()
	if err != nil {
		return err
	}
	p, err := start(srv.Command(), filepath.Join(cfg.Dir, "logs", "s3.log"), "")
	if err != nil {
		return err
	}
	p.Role, p.Name = "s3", "s3"
	st.Processes = append(st.Processes, p)
	if err := st.save(); err != nil {
		return err
	}
	if err := waitHTTP(ctx, p, st.S3.Endpoint+"/health", "", time.Minute); err != nil {
		return fmt.Errorf("S3 server: %w", err)
	}
	cctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	return s3server.CreateBucket(cctx, st.S3.Endpoint, st.S3.Region, srv.AccessKey, srv.SecretKey, st.S3.Bucket)
}

// readCredentials reads the keys of the default profile of a shared
// credentials file written by prepareS3.
func readCredentials(path string) (access, secret string, err error) {
	f, err := os.Open(path)
	if err != nil {
		return "", "", err
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		k, v, ok := strings.Cut(sc.Text(), "=")
		if !ok {
			continue
		}
		switch strings.TrimSpace(k) {
		case "aws_access_key_id":
			access = strings.TrimSpace(v)
		case "aws_secret_access_key":
			secret = strings.TrimSpace(v)
		}
	}
	if access == "" || secret == "" {
		return "", "", fmt.Errorf("%s: no keys: %w", path, errdefs.ErrInvalidArgument)
	}
	return access, secret, sc.Err()
}

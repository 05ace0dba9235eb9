package testenv

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/spore-run/spore/internal/pgcluster"
	"github.com/spore-run/spore/internal/s3server"
)

// A real S3-compatible server for tests: versitygw (Apache-2.0) with its
// posix backend, one process per S3 call, in the test's temp directory.
// `make s3-tools` (scripts/s3-tools.sh) builds it into
// $SPORE_CACHE_DIR/s3/versitygw-<version>/; SPORE_VERSITYGW overrides the
// binary. S3 is a real-tier helper: it skips in the fast tier and fails
// loudly when the binary is missing.

// VersitygwVersion is the version scripts/s3-tools.sh builds.
const VersitygwVersion = s3server.Version

// VersitygwEnv overrides the versitygw binary.
const VersitygwEnv = s3server.BinEnv

// S3Server is a running versitygw holding one fresh, empty bucket.
type S3Server struct {
	Endpoint  string // http://127.0.0.1:PORT (path-style addressing)
	Region    string
	AccessKey string
	SecretKey string
	Bucket    string
	// VirtualDomain is the base domain of virtual-host addressing:
	// http://BUCKET.localhost:PORT. Nothing resolves *.localhost here, so a
	// client dials Addr whatever the host name (see DialAddr).
	VirtualDomain string
	Addr          string // 127.0.0.1:PORT
	// Dir is the posix backend's directory: object KEY of bucket B is the
	// plain file Dir/B/KEY.
	Dir string
	PID int

	Port int

	listen  string // the host part of versitygw's --port
	cmd     *exec.Cmd
	exited  chan struct{}
	stopped sync.Once
}

// VersitygwBin returns the versitygw binary, failing t when it is missing.
func VersitygwBin(t testing.TB) string {
	t.Helper()
	RealTier(t)
	p, err := s3server.Bin()
	if err != nil {
		t.Fatal(err)
	}
	return p
}

// S3 starts versitygw on a free loopback port with a new bucket; t's
// cleanup stops it (by its PID) and its files go with t.TempDir.
func S3(t testing.TB) *S3Server { return s3Server(t, "127.0.0.1") }

// S3AllInterfaces is S3 listening on every address of the host (network
// namespaces reach it at their gateway: a fleet's nodes); Endpoint and
// Addr still name loopback.
func S3AllInterfaces(t testing.TB) *S3Server { return s3Server(t, "0.0.0.0") }

func s3Server(t testing.TB, listen string) *S3Server {
	t.Helper()
	bin := VersitygwBin(t)
	dir := t.TempDir()
	var key [8]byte
	rand.Read(key[:])
	s := &S3Server{
		Region:        "us-east-1",
		AccessKey:     "spore-test-" + hex.EncodeToString(key[:4]),
		SecretKey:     "secret-" + hex.EncodeToString(key[4:]),
		Bucket:        "t-" + hex.EncodeToString(key[:6]),
		VirtualDomain: "localhost",
		Dir:           filepath.Join(dir, "data"),
		listen:        listen,
	}
	if err := os.Mkdir(s.Dir, 0o755); err != nil {
		t.Fatal(err)
	}
	// A port taken between FreePort and versitygw's listen fails the start
	// (the process exits); try again with another.
	var err error
	for range 5 {
		if err = s.start(t, bin, dir, ""); err == nil {
			break
		}
	}
	if err != nil {
		t.Fatalf("S3 test server: %v", err)
	}
	t.Cleanup(func() { s.Stop() })
	if err := s.createBucket(); err != nil {
		t.Fatalf("S3 test server: create bucket %s: %v", s.Bucket, err)
	}
	return s
}

// start starts versitygw on addr ("": a free loopback port).
func (s *S3Server) start(t testing.TB, bin, dir, addr string) error {
	if addr == "" {
		port, err := pgcluster.FreePort()
		if err != nil {
			return err
		}
		addr = fmt.Sprintf("127.0.0.1:%d", port)
	}
	s.Addr = addr
	s.Endpoint = "http://" + s.Addr
	_, p, _ := net.SplitHostPort(addr)
	s.Port, _ = strconv.Atoi(p)
	listen := s.Addr
	if s.listen != "" {
		listen = net.JoinHostPort(s.listen, p)
	}
	logPath := filepath.Join(dir, "versitygw.log")
	logf, err := os.OpenFile(logPath, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return err
	}
	defer logf.Close()
	cmd := s3server.Server{Bin: bin, Listen: []string{listen}, Dir: s.Dir, Region: s.Region,
		AccessKey: s.AccessKey, SecretKey: s.SecretKey, VirtualDomain: s.VirtualDomain}.Command()
	cmd.Stdout, cmd.Stderr = logf, logf
	// Taken down with a killed test binary.
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		return fmt.Errorf("start %s: %w", bin, err)
	}
	s.cmd, s.PID, s.exited = cmd, cmd.Process.Pid, make(chan struct{})
	s.stopped = sync.Once{}
	go func() { cmd.Wait(); close(s.exited) }()
	deadline := time.Now().Add(30 * time.Second)
	for {
		resp, err := http.Get(s.Endpoint + "/health")
		if err == nil {
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				t.Logf("versitygw %s (pid %d) at %s, bucket %s, files in %s", VersitygwVersion, s.PID, s.Endpoint, s.Bucket, s.Dir)
				return nil
			}
		}
		select {
		case <-s.exited:
			b, _ := os.ReadFile(logPath)
			return fmt.Errorf("versitygw exited at start: %s", lastLines(string(b), 10))
		case <-time.After(20 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			s.Stop()
			return fmt.Errorf("versitygw did not answer on %s within 30 s", s.Addr)
		}
	}
}

// Stop stops the server (SIGTERM, then SIGKILL after 10 s) and waits for
// it; the data stays in Dir. Safe to call more than once.
func (s *S3Server) Stop() {
	s.stopped.Do(func() {
		s.cmd.Process.Signal(syscall.SIGTERM)
		select {
		case <-s.exited:
		case <-time.After(10 * time.Second):
			s.cmd.Process.Kill()
			<-s.exited
		}
	})
}

// Restart starts a stopped server again on the same port and data, so
// clients configured with its endpoint reach it again.
func (s *S3Server) Restart(t testing.TB) {
	t.Helper()
	s.Stop()
	if err := s.start(t, VersitygwBin(t), filepath.Dir(s.Dir), s.Addr); err != nil {
		t.Fatalf("S3 test server restart: %v", err)
	}
}

// ObjectPath is the file holding key in the server's bucket.
func (s *S3Server) ObjectPath(key string) string {
	return filepath.Join(s.Dir, s.Bucket, filepath.FromSlash(key))
}

// DialAddr returns a DialContext that connects to the server whatever the
// host name asked for: virtual-host addressing names BUCKET.localhost,
// which no resolver here knows.
func (s *S3Server) DialAddr() func(ctx context.Context, network, addr string) (net.Conn, error) {
	var d net.Dialer
	return func(ctx context.Context, network, _ string) (net.Conn, error) {
		return d.DialContext(ctx, network, s.Addr)
	}
}

func (s *S3Server) createBucket() error {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	return s3server.CreateBucket(ctx, s.Endpoint, s.Region, s.AccessKey, s.SecretKey, s.Bucket)
}

func lastLines(s string, n int) string {
	lines := strings.Split(strings.TrimRight(s, "\n"), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}

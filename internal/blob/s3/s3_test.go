package s3_test

import (
	"bytes"
	"io"
	"net/http"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/spore-run/spore/internal/blob"
	"github.com/spore-run/spore/internal/blob/blobtest"
	"github.com/spore-run/spore/internal/blob/s3"
	"github.com/spore-run/spore/internal/errdefs"
	"github.com/spore-run/spore/internal/testenv"
)

// open returns a store on srv's bucket, path-style or virtual-host.
func open(t testing.TB, srv *testenv.S3Server, virtualHost bool, edit ...func(*s3.Config)) *s3.Store {
	t.Helper()
	cfg := s3.Config{
		Endpoint:        srv.Endpoint,
		Region:          srv.Region,
		Bucket:          srv.Bucket,
		PathStyle:       true,
		AccessKeyID:     srv.AccessKey,
		SecretAccessKey: srv.SecretKey,
	}
	if virtualHost {
		// http://BUCKET.localhost:PORT: nothing resolves *.localhost here,
		// so the client dials the server whatever the name (the Host
		// header, which versitygw routes on, keeps it).
		cfg.Endpoint = strings.Replace(srv.Endpoint, "127.0.0.1", srv.VirtualDomain, 1)
		cfg.PathStyle = false
		cfg.HTTPClient = &http.Client{Transport: &http.Transport{DialContext: srv.DialAddr()}}
	}
	for _, e := range edit {
		e(&cfg)
	}
	s, err := s3.New(t.Context(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	return s
}

func TestConformancePathStyle(t *testing.T) {
	blobtest.Run(t, func(t *testing.T) blob.Store { return open(t, testenv.S3(t), false) })
}

func TestConformanceVirtualHost(t *testing.T) {
	blobtest.Run(t, func(t *testing.T) blob.Store { return open(t, testenv.S3(t), true) })
}

// A key prefix keeps the store to its folder of the bucket.
func TestConformancePrefix(t *testing.T) {
	blobtest.Run(t, func(t *testing.T) blob.Store {
		srv := testenv.S3(t)
		other := open(t, srv, false)
		// An object beside the prefix's folder that List must not show.
		if err := other.Put(t.Context(), "spore-other", strings.NewReader("x"), 1); err != nil {
			t.Fatal(err)
		}
		return open(t, srv, false, func(c *s3.Config) { c.Prefix = "spore/" })
	})
}

// Small thresholds put the buffered, streamed and multipart paths all
// under the suite (20 MiB objects are multipart here, 8 MiB streamed).
func TestConformanceMultipart(t *testing.T) {
	blobtest.Run(t, func(t *testing.T) blob.Store {
		return open(t, testenv.S3(t), false, func(c *s3.Config) {
			c.BufferLimit = 1 << 20
			c.MultipartThreshold = 6 << 20
			c.PartSize = 5 << 20
		})
	})
}

func TestEnsureBucket(t *testing.T) {
	srv := testenv.S3(t)
	s := open(t, srv, false, func(c *s3.Config) { c.Bucket = "made-by-ensure" })
	ctx := t.Context()
	err := s.Put(ctx, "k", strings.NewReader("v"), 1)
	if !errdefs.IsUnavailable(err) || !strings.Contains(err.Error(), "does not exist") {
		t.Fatalf("Put into a missing bucket: %v, want unavailable saying the bucket does not exist", err)
	}
	for range 2 { // idempotent
		if err := s.EnsureBucket(ctx); err != nil {
			t.Fatal(err)
		}
	}
	if err := s.Put(ctx, "k", strings.NewReader("v"), 1); err != nil {
		t.Fatal(err)
	}
}

// A server that goes away is ErrUnavailable (after the retries), and the
// store works again when it is back.
func TestServerDown(t *testing.T) {
	srv := testenv.S3(t)
	s := open(t, srv, false, func(c *s3.Config) { c.MaxBackoff = 200 * time.Millisecond })
	ctx := t.Context()
	if err := s.Put(ctx, "k", strings.NewReader("v"), 1); err != nil {
		t.Fatal(err)
	}
	srv.Stop()
	checks := map[string]error{"Put": s.Put(ctx, "k2", strings.NewReader("v"), 1)}
	_, checks["Get"] = s.Get(ctx, "k")
	_, checks["GetRange"] = s.GetRange(ctx, "k", 0, 1)
	_, checks["Stat"] = s.Stat(ctx, "k")
	checks["Delete"] = s.Delete(ctx, "k")
	checks["List"] = s.List(ctx, "", func(blob.Info) error { return nil })
	for op, err := range checks {
		if !errdefs.IsUnavailable(err) {
			t.Errorf("%s with the server down: %v, want unavailable", op, err)
		}
	}
	t.Logf("e.g. %v", checks["Get"])
	srv.Restart(t)
	if _, err := s.Stat(ctx, "k"); err != nil {
		t.Fatalf("Stat after the server is back: %v", err)
	}
}

// Wrong credentials fail every call clearly (access denied, check the
// credentials), and touch nothing.
func TestWrongCredentials(t *testing.T) {
	srv := testenv.S3(t)
	good := open(t, srv, false)
	ctx := t.Context()
	if err := good.Put(ctx, "k", strings.NewReader("v"), 1); err != nil {
		t.Fatal(err)
	}
	for name, edit := range map[string]func(*s3.Config){
		"wrong secret":     func(c *s3.Config) { c.SecretAccessKey = "not-the-secret" },
		"unknown key id":   func(c *s3.Config) { c.AccessKeyID = "nobody" },
		"no such key pair": func(c *s3.Config) { c.AccessKeyID, c.SecretAccessKey = "nobody", "nothing" },
	} {
		bad := open(t, srv, false, edit)
		errs := map[string]error{"Put": bad.Put(ctx, "k", strings.NewReader("x"), 1)}
		_, errs["Get"] = bad.Get(ctx, "k")
		errs["List"] = bad.List(ctx, "", func(blob.Info) error { return nil })
		errs["Delete"] = bad.Delete(ctx, "k")
		for op, err := range errs {
			if !errdefs.IsUnavailable(err) || !strings.Contains(err.Error(), "check the credentials") {
				t.Errorf("%s: %s: %v, want unavailable naming the credentials", name, op, err)
			}
		}
		t.Logf("%s: %v", name, errs["Get"])
	}
	rc, err := good.Get(ctx, "k")
	if err != nil {
		t.Fatal(err)
	}
	b, _ := io.ReadAll(rc)
	rc.Close()
	if string(b) != "v" {
		t.Fatalf("object after the refused calls = %q, want v", b)
	}
}

// Credentials from the environment (the SDK's default chain), as a
// deployment passes them.
func TestCredentialsFromEnv(t *testing.T) {
	srv := testenv.S3(t)
	t.Setenv("AWS_ACCESS_KEY_ID", srv.AccessKey)
	t.Setenv("AWS_SECRET_ACCESS_KEY", srv.SecretKey)
	t.Setenv("AWS_REGION", srv.Region)
	t.Setenv("AWS_CONFIG_FILE", os.DevNull)
	t.Setenv("AWS_SHARED_CREDENTIALS_FILE", os.DevNull)
	s := open(t, srv, false, func(c *s3.Config) { c.AccessKeyID, c.SecretAccessKey, c.Region = "", "", "" })
	if err := s.Put(t.Context(), "from/env", strings.NewReader("v"), 1); err != nil {
		t.Fatal(err)
	}
}

// Credentials from a shared credentials file and a named profile.
func TestCredentialsFromProfile(t *testing.T) {
	srv := testenv.S3(t)
	dir := t.TempDir()
	creds := dir + "/credentials"
	if err := os.WriteFile(creds, []byte("[default]\naws_access_key_id = wrong\naws_secret_access_key = wrong\n\n[spore]\naws_access_key_id = "+
		srv.AccessKey+"\naws_secret_access_key = "+srv.SecretKey+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	for _, k := range []string{"AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_PROFILE", "AWS_SESSION_TOKEN"} {
		t.Setenv(k, "")
		os.Unsetenv(k)
	}
	t.Setenv("AWS_CONFIG_FILE", os.DevNull)
	t.Setenv("AWS_SHARED_CREDENTIALS_FILE", creds)
	s := open(t, srv, false, func(c *s3.Config) { c.AccessKeyID, c.SecretAccessKey, c.Profile = "", "", "spore" })
	if err := s.Put(t.Context(), "from/profile", strings.NewReader("v"), 1); err != nil {
		t.Fatal(err)
	}
}

// The store returns what the server holds: a byte flipped in versitygw's
// file comes back flipped, also where the server kept the PUT's CRC32 (the
// SDK's response check is off). Integrity is the chunk layer's job: chunks
// are named by their hash and checked on read.
func TestCorruptionPassesThrough(t *testing.T) {
	srv := testenv.S3(t)
	s := open(t, srv, false)
	ctx := t.Context()
	orig := bytes.Repeat([]byte("spore "), 10000)
	if err := s.Put(ctx, "c/obj", bytes.NewReader(orig), int64(len(orig))); err != nil {
		t.Fatal(err)
	}
	path := srv.ObjectPath("c/obj")
	f, err := os.OpenFile(path, os.O_RDWR, 0)
	if err != nil {
		t.Fatalf("versitygw's file for the object: %v", err)
	}
	if _, err := f.WriteAt([]byte{orig[1234] ^ 0x01}, 1234); err != nil {
		t.Fatal(err)
	}
	f.Close()
	rc, err := s.Get(ctx, "c/obj")
	if err != nil {
		t.Fatal(err)
	}
	got, err := io.ReadAll(rc)
	rc.Close()
	if err != nil {
		t.Fatalf("reading the corrupted object: %v, want its bytes as stored", err)
	}
	want := bytes.Clone(orig)
	want[1234] ^= 0x01
	if !bytes.Equal(got, want) {
		t.Fatalf("Get of the corrupted object returned something else than the file holds")
	}
	t.Logf("returned as stored: byte 1234 is %q (was %q)", got[1234], orig[1234])
}

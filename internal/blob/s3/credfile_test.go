package s3_test

import (
	"fmt"
	"io"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/spore-run/spore/internal/blob/blobconf"
	"github.com/spore-run/spore/internal/errdefs"
	"github.com/spore-run/spore/internal/testenv"
)

// TestCredentialsFile: credentials-file= names a shared credentials file
// whose keys are used, over wrong keys in the environment (a local
// fleet's nodes inherit whatever environment started it); a file with
// wrong keys is refused by the server; a missing file or profile is a
// clear invalid argument.
func TestCredentialsFile(t *testing.T) {
	srv := testenv.S3(t)
	dir := t.TempDir()
	write := func(name, body string) string {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, []byte(body), 0o600); err != nil {
			t.Fatal(err)
		}
		return p
	}
	good := write("good", fmt.Sprintf("[default]\naws_access_key_id = %s\naws_secret_access_key = %s\n\n[other]\naws_access_key_id = nobody\naws_secret_access_key = nothing\n", srv.AccessKey, srv.SecretKey))
	t.Setenv("AWS_ACCESS_KEY_ID", "wrong-from-env")
	t.Setenv("AWS_SECRET_ACCESS_KEY", "wrong-from-env")
	spec := func(file, profile string) string {
		q := url.Values{"endpoint": {srv.Endpoint}, "region": {srv.Region}, "credentials-file": {file}}
		if profile != "" {
			q.Set("profile", profile)
		}
		return "s3://" + srv.Bucket + "/cf?" + q.Encode()
	}
	st, err := blobconf.Open(t.Context(), spec(good, ""))
	if err != nil {
		t.Fatal(err)
	}
	if err := st.Put(t.Context(), "k", strings.NewReader("hello"), 5); err != nil {
		t.Fatalf("put with the file's keys: %v", err)
	}
	r, err := st.Get(t.Context(), "k")
	if err != nil {
		t.Fatal(err)
	}
	b, _ := io.ReadAll(r)
	r.Close()
	if string(b) != "hello" {
		t.Fatalf("got %q", b)
	}
	// The file's other profile has keys the server does not know.
	other, err := blobconf.Open(t.Context(), spec(good, "other"))
	if err != nil {
		t.Fatal(err)
	}
	if err := other.Put(t.Context(), "k2", strings.NewReader("x"), 1); err == nil {
		t.Fatal("put with unknown keys succeeded")
	}
	for _, bad := range []string{spec(filepath.Join(dir, "missing"), ""), spec(good, "absent"), spec("relative/file", "")} {
		if _, err := blobconf.Open(t.Context(), bad); !errdefs.IsInvalidArgument(err) {
			t.Errorf("%s: %v, want invalid argument", bad, err)
		}
	}
}

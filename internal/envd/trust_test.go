package envd_test

import (
	"bytes"
	"encoding/json"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/spore-run/spore/internal/egress"
	"github.com/spore-run/spore/internal/envd"
)

// /init with the sandbox's egress CA: the certificate lands once in the
// system bundle (appended, the rest kept) and in Spore's own file however
// often init runs; the variables that point clients at the bundle are
// set unless the sandbox's environment sets them; a malformed CA is a
// 400 that installs nothing.
func TestInitInstallsTheEgressCA(t *testing.T) {
	dir := t.TempDir()
	bundle, own := filepath.Join(dir, "etc/ssl/certs/ca-certificates.crt"), filepath.Join(dir, "usr/local/share/ca-certificates/spore-egress.crt")
	oldB, oldO := envd.SystemCABundle, envd.SporeCAFile
	envd.SystemCABundle, envd.SporeCAFile = bundle, own
	t.Cleanup(func() { envd.SystemCABundle, envd.SporeCAFile = oldB, oldO })
	os.MkdirAll(filepath.Dir(bundle), 0o755)
	existing := "-----BEGIN CERTIFICATE-----\nMIIB...existing\n-----END CERTIFICATE-----" // no final newline
	os.WriteFile(bundle, []byte(existing), 0o644)

	d := newDaemon(t)
	ca, err := egress.NewCA("isb1")
	if err != nil {
		t.Fatal(err)
	}
	post := func(body map[string]any) int {
		b, _ := json.Marshal(body)
		resp, err := http.Post(d.srv.URL+"/init", "application/json", bytes.NewReader(b))
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		return resp.StatusCode
	}
	for range 2 {
		if code := post(map[string]any{"sporeEgressCA": string(ca.CertPEM), "envVars": map[string]string{"CURL_CA_BUNDLE": "/mine.pem"}}); code != 204 {
			t.Fatalf("init = %d", code)
		}
	}
	b, _ := os.ReadFile(bundle)
	if !strings.HasPrefix(string(b), existing+"\n") || strings.Count(string(b), string(ca.CertPEM)) != 1 {
		t.Fatalf("bundle:\n%s", b)
	}
	if o, _ := os.ReadFile(own); string(o) != string(ca.CertPEM) {
		t.Fatalf("Spore's file:\n%s", o)
	}
	resp, err := http.Get(d.srv.URL + "/envs")
	if err != nil {
		t.Fatal(err)
	}
	var env map[string]string
	json.NewDecoder(resp.Body).Decode(&env)
	resp.Body.Close()
	if env["SSL_CERT_FILE"] != bundle || env["REQUESTS_CA_BUNDLE"] != bundle || env["NODE_EXTRA_CA_CERTS"] != own || env["CURL_CA_BUNDLE"] != "/mine.pem" {
		t.Fatalf("env: %v", env)
	}
	before, _ := os.ReadFile(bundle)
	for _, bad := range []string{"junk", string(ca.KeyPEM), string(ca.CertPEM) + string(ca.CertPEM)} {
		if code := post(map[string]any{"sporeEgressCA": bad}); code != 400 {
			t.Fatalf("init with %.20q = %d", bad, code)
		}
	}
	if after, _ := os.ReadFile(bundle); !bytes.Equal(before, after) {
		t.Fatal("a refused CA changed the bundle")
	}
}

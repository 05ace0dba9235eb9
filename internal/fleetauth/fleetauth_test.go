package fleetauth

import (
	"bytes"
	"context"
	"crypto/rand"
	"crypto/rsa"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/json"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/spore-run/spore/internal/errdefs"
)

var quiet = slog.New(slog.DiscardHandler)

func testCA(t *testing.T) (*CA, []byte) {
	t.Helper()
	ca, key, err := NewCA("test")
	if err != nil {
		t.Fatal(err)
	}
	return ca, key
}

func TestIdentityOfCertificate(t *testing.T) {
	ca, _ := testCA(t)
	certPEM, keyPEM, err := ca.Issue(Identity{Role: RoleNode, Name: "n1"}, []string{"10.0.0.1", "node.example"}, time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	cert, id, err := parsePair(certPEM, keyPEM)
	if err != nil || id != (Identity{Role: RoleNode, Name: "n1"}) {
		t.Fatalf("identity %v %v", id, err)
	}
	if len(cert.Leaf.IPAddresses) != 1 || cert.Leaf.DNSNames[0] != "node.example" {
		t.Fatalf("hosts: %v %v", cert.Leaf.IPAddresses, cert.Leaf.DNSNames)
	}
	for _, bad := range []Identity{{Role: "admin", Name: "x"}, {Role: RoleNode, Name: "../x"}, {Role: RoleReplica, Name: ""}} {
		if _, _, err := ca.Issue(bad, nil, time.Hour); !errdefs.IsInvalidArgument(err) {
			t.Errorf("issue %v: %v", bad, err)
		}
	}
	// Two identities, or none: no identity.
	for _, uris := range [][]string{{}, {"spore://node/a", "spore://replica/b"}, {"spore://node/a?x=1"}} {
		tmpl := &x509.Certificate{SerialNumber: serial(), Subject: pkix.Name{CommonName: "x"}, NotBefore: time.Now(), NotAfter: time.Now().Add(time.Hour)}
		for _, u := range uris {
			pu, _ := url.Parse(u)
			tmpl.URIs = append(tmpl.URIs, pu)
		}
		key, _, _ := NewKey()
		der, err := x509.CreateCertificate(rand.Reader, tmpl, ca.Cert, key.Public(), ca.key)
		if err != nil {
			t.Fatal(err)
		}
		c, _ := x509.ParseCertificate(der)
		if id, err := identityOf(c); err == nil {
			t.Errorf("URIs %v: identity %v, want none", uris, id)
		}
	}
}

func TestLoadCARefusesMismatches(t *testing.T) {
	ca, key := testCA(t)
	other, otherKey := testCA(t)
	if _, err := LoadCA(ca.CertPEM, key); err != nil {
		t.Fatal(err)
	}
	if _, err := LoadCA(ca.CertPEM, otherKey); !errdefs.IsInvalidArgument(err) {
		t.Fatalf("a CA with another's key: %v", err)
	}
	leaf, leafKey, _ := other.Issue(Identity{Role: RoleNode, Name: "n"}, nil, time.Hour)
	if _, err := LoadCA(leaf, leafKey); !errdefs.IsInvalidArgument(err) {
		t.Fatalf("a leaf as CA: %v", err)
	}
	if _, err := NewMember(leaf, leafKey, ca.CertPEM); !errdefs.IsInvalidArgument(err) {
		t.Fatalf("a member whose certificate another CA signed: %v", err)
	}
}

// A member loaded from files reads them again when they change: a
// rotated certificate (and a CA bundle with the next CA) is used without
// a restart.
func TestMemberReloadsRotatedFiles(t *testing.T) {
	dir := t.TempDir()
	ca, _ := testCA(t)
	certPEM, keyPEM, _ := ca.Issue(Identity{Role: RoleNode, Name: "n1"}, nil, time.Hour)
	cf, kf, af := NodeFiles(dir)
	for f, b := range map[string][]byte{cf: certPEM, kf: keyPEM, af: ca.CertPEM} {
		os.WriteFile(f, b, 0o600)
	}
	m, err := LoadMember(cf, kf, af)
	if err != nil {
		t.Fatal(err)
	}
	first := m.Expiry()
	next, _ := testCA(t)
	bundle := append(append([]byte{}, ca.CertPEM...), next.CertPEM...)
	certPEM2, keyPEM2, _ := next.Issue(Identity{Role: RoleNode, Name: "n1"}, nil, 2*time.Hour)
	os.WriteFile(af, bundle, 0o600)
	os.WriteFile(kf, keyPEM2, 0o600)
	os.WriteFile(cf, certPEM2, 0o600)
	m.mu.Lock()
	m.checked = time.Time{} // as if ReloadEvery had passed
	m.mu.Unlock()
	cert, roots := m.current()
	if cert.Leaf.NotAfter.Equal(first) {
		t.Fatal("the rotated certificate was not read")
	}
	if _, err := cert.Leaf.Verify(x509.VerifyOptions{Roots: roots, KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageAny}}); err != nil {
		t.Fatalf("the new CA is not trusted after the rotation: %v", err)
	}
}

// enrollServer is a replica's fleet listener serving the enroller, with
// bindings kept in a map.
func enrollServer(t *testing.T, ca *CA, join string) (*httptest.Server, *Fleet, map[string]string) {
	t.Helper()
	replica, err := ReplicaMember(ca, ca.CertPEM, "r1")
	if err != nil {
		t.Fatal(err)
	}
	f := Secure(replica)
	var mu sync.Mutex
	bound := map[string]string{}
	en := &Enroller{CA: ca, Bundle: ca.CertPEM, JoinToken: join, Log: quiet, Bind: func(_ context.Context, node, key string) error {
		mu.Lock()
		defer mu.Unlock()
		if have, ok := bound[node]; ok && have != key {
			return errdefs.Conflictf("node %s is enrolled with another key", node)
		}
		bound[node] = key
		return nil
	}}
	mux := http.NewServeMux()
	mux.Handle("POST "+EnrollPath, en.Handler(f))
	srv := httptest.NewUnstartedServer(mux)
	srv.TLS = f.ServerTLS(tls.VerifyClientCertIfGiven)
	srv.StartTLS()
	t.Cleanup(srv.Close)
	return srv, f, bound
}

// A node enrolls with the join token (its key made once, 0600), loads its
// certificate after without asking, renews with its certificate alone;
// a wrong token, another key for an enrolled ID, a node renewing
// another's certificate are refused.
func TestEnrollment(t *testing.T) {
	ctx := context.Background()
	ca, _ := testCA(t)
	srv, _, bound := enrollServer(t, ca, "join-token-0123456789")
	caFile := filepath.Join(t.TempDir(), "ca.crt")
	os.WriteFile(caFile, ca.CertPEM, 0o644)
	ne := NodeEnrollment{Dir: t.TempDir(), CAFile: caFile, Node: "n1", Hosts: []string{"10.1.2.3"}, APIURLs: []string{srv.URL},
		JoinToken: "wrong-token-0123456789", Log: quiet}
	if _, err := ne.Ensure(ctx); err == nil {
		t.Fatal("enrolled with a wrong join token")
	}
	ne.JoinToken = "join-token-0123456789"
	m, err := ne.Ensure(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if id := m.Identity(); id != (Identity{Role: RoleNode, Name: "n1"}) || bound["n1"] == "" {
		t.Fatalf("enrolled as %v, bound %v", id, bound)
	}
	_, kf, _ := NodeFiles(ne.Dir)
	if st, err := os.Stat(kf); err != nil || st.Mode().Perm() != 0o600 {
		t.Fatalf("key file: %v %v", st.Mode(), err)
	}
	srv.Close() // nothing to ask now: the certificate is current
	if m2, err := ne.Ensure(ctx); err != nil || m2.Identity() != m.Identity() {
		t.Fatalf("a second start: %v %v", m2, err)
	}

	srv2, _, bound2 := enrollServer(t, ca, "join-token-0123456789")
	bound2["n1"] = bound["n1"]
	// Renewal: the certificate is the credential, the token not needed.
	ne2 := ne
	ne2.APIURLs, ne2.JoinToken = []string{srv2.URL}, ""
	serialOf := func() string {
		c, _ := m.current()
		return c.Leaf.SerialNumber.String()
	}
	before := serialOf()
	if err := ne2.renew(ctx, m); err != nil {
		t.Fatalf("renewal with the certificate: %v", err)
	}
	if serialOf() == before {
		t.Fatal("the renewal did not replace the certificate")
	}
	if cf, _, _ := NodeFiles(ne.Dir); true {
		onDisk, _ := os.ReadFile(cf)
		c, _ := m.current()
		if !bytes.Contains(onDisk, pemBlock("CERTIFICATE", c.Leaf.Raw)) {
			t.Fatal("the renewed certificate was not written for the next start")
		}
	}
	// Another node taking n1's ID with its own key: 409.
	thief := NodeEnrollment{Dir: t.TempDir(), CAFile: caFile, Node: "n1", APIURLs: []string{srv2.URL}, JoinToken: "join-token-0123456789", Log: quiet}
	if _, err := thief.Ensure(ctx); err == nil || !strings.Contains(err.Error(), "another key") {
		t.Fatalf("a second key for n1: %v, want a conflict", err)
	}
	// Node n1 renewing node n2's certificate with its own: 403.
	hc := &http.Client{Transport: &http.Transport{TLSClientConfig: Secure(m).ClientTLS(IsRole(RoleReplica))}}
	defer hc.CloseIdleConnections()
	key, _, _ := NewKey()
	csr, _ := x509.CreateCertificateRequest(rand.Reader, &x509.CertificateRequest{}, key)
	body, _ := json.Marshal(EnrollRequest{Node: "n2", CSR: string(pemBlock("CERTIFICATE REQUEST", csr))})
	resp, err := hc.Post(srv2.URL+EnrollPath, "application/json", bytes.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusForbidden {
		t.Fatalf("n1 renewing n2: %d, want 403", resp.StatusCode)
	}
	for name, req := range map[string]EnrollRequest{
		"bad id":        {Node: "../n", CSR: string(pemBlock("CERTIFICATE REQUEST", csr))},
		"not a csr":     {Node: "n3", CSR: "hello"},
		"too many host": {Node: "n3", CSR: string(pemBlock("CERTIFICATE REQUEST", csr)), Hosts: make([]string, MaxHosts+1)},
		"bad host":      {Node: "n3", CSR: string(pemBlock("CERTIFICATE REQUEST", csr)), Hosts: []string{"a b"}},
	} {
		body, _ := json.Marshal(req)
		r, _ := http.NewRequest(http.MethodPost, srv2.URL+EnrollPath, bytes.NewReader(body))
		r.Header.Set("Authorization", "Bearer join-token-0123456789")
		plain := &http.Client{Transport: &http.Transport{TLSClientConfig: &tls.Config{InsecureSkipVerify: true}}}
		resp, err := plain.Do(r)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != http.StatusBadRequest {
			t.Errorf("%s: %d, want 400", name, resp.StatusCode)
		}
		if _, ok := bound2["n3"]; ok {
			t.Errorf("%s bound n3", name)
		}
	}
}

// An insecure fleet admits the token only (in its header, or as a bearer
// where the request is not proxied), never a bare token.
func TestInsecureGuard(t *testing.T) {
	f, err := Insecure("shared-token-0123456789", nil)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := Insecure("short", nil); !errdefs.IsInvalidArgument(err) {
		t.Fatalf("a short token: %v", err)
	}
	h := f.Guard(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Header.Get(TokenHeader) != "" {
			t.Error("the token reached the handler")
		}
	}), true, Roles(RoleReplica))
	for hdr, want := range map[[2]string]int{
		{TokenHeader, "shared-token-0123456789"}:            200,
		{"Authorization", "Bearer shared-token-0123456789"}: 401, // hop: Authorization is the sandbox's
		{"Authorization", "shared-token-0123456789"}:        401,
		{TokenHeader, "shared-token-012345678"}:             401,
	} {
		r := httptest.NewRequest(http.MethodGet, "/", nil)
		r.Header.Set(hdr[0], hdr[1])
		w := httptest.NewRecorder()
		h.ServeHTTP(w, r)
		if w.Code != want {
			t.Errorf("%s: %q: %d, want %d", hdr[0], hdr[1], w.Code, want)
		}
	}
}

// A CA with an RSA key in PKCS#1 (cert-manager's default) loads and signs.
func TestRSACA(t *testing.T) {
	key, err := rsa.GenerateKey(rand.Reader, 2048)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{SerialNumber: serial(), Subject: pkix.Name{CommonName: "rsa ca"}, NotBefore: time.Now().Add(-time.Hour),
		NotAfter: time.Now().Add(time.Hour), KeyUsage: x509.KeyUsageCertSign, BasicConstraintsValid: true, IsCA: true}
	der, _ := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	ca, err := LoadCA(pemBlock("CERTIFICATE", der), pemBlock("RSA PRIVATE KEY", x509.MarshalPKCS1PrivateKey(key)))
	if err != nil {
		t.Fatal(err)
	}
	certPEM, keyPEM, err := ca.Issue(Identity{Role: RoleReplica, Name: "r"}, nil, time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := NewMember(certPEM, keyPEM, ca.CertPEM); err != nil {
		t.Fatal(err)
	}
}

// A replica's member (certificate in memory) trusts the next CA once its
// bundle file holds it, without a restart.
func TestReplicaReloadsItsBundle(t *testing.T) {
	ca, _ := testCA(t)
	next, _ := testCA(t)
	bundle := filepath.Join(t.TempDir(), "ca.crt")
	os.WriteFile(bundle, ca.CertPEM, 0o644)
	m, err := ReplicaMember(ca, ca.CertPEM, "r1")
	if err != nil {
		t.Fatal(err)
	}
	m.WatchBundle(bundle)
	leafPEM, _, _ := next.Issue(Identity{Role: RoleNode, Name: "n"}, nil, time.Hour)
	certs, _ := parseCerts(leafPEM)
	if _, err := m.verify([][]byte{certs[0].Raw}, x509.ExtKeyUsageServerAuth); err == nil {
		t.Fatal("a certificate of an untrusted CA verified")
	}
	os.WriteFile(bundle, append(append([]byte{}, ca.CertPEM...), next.CertPEM...), 0o644)
	m.mu.Lock()
	m.checked = time.Time{}
	m.mu.Unlock()
	if _, err := m.verify([][]byte{certs[0].Raw}, x509.ExtKeyUsageServerAuth); err != nil {
		t.Fatalf("after the bundle gained the next CA: %v", err)
	}
}

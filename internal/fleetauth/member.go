package fleetauth

import (
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"os"
	"sync"
	"time"

	"github.com/spore-run/spore/internal/atomicfs"
	"github.com/spore-run/spore/internal/errdefs"
)

// Member is one fleet member's TLS material: its certificate and key, and
// the fleet CAs it trusts (a bundle: during a CA rotation, the old CA and
// the new one). Given as files, both are read again when they change
// (looked at most every ReloadEvery), so rotating a certificate or the
// CA bundle is replacing files, with no restart.
type Member struct {
	certFile, keyFile, caFile string

	mu      sync.Mutex
	cert    *tls.Certificate
	id      Identity
	roots   *x509.CertPool
	stamp   [3]fileStamp // of certFile, keyFile, caFile as last read
	checked time.Time
}

// ReloadEvery bounds how often a Member looks at its files.
const ReloadEvery = 10 * time.Second

type fileStamp struct {
	mod  time.Time
	size int64
}

// LoadMember reads a member's certificate, key and CA bundle from files.
func LoadMember(certFile, keyFile, caFile string) (*Member, error) {
	m := &Member{certFile: certFile, keyFile: keyFile, caFile: caFile}
	if err := m.reload(true); err != nil {
		return nil, err
	}
	return m, nil
}

// NewMember is a member whose certificate is held in memory (a replica's,
// issued by itself; SetCertificate replaces it) trusting the CAs in caPEM.
func NewMember(certPEM, keyPEM, caPEM []byte) (*Member, error) {
	m := &Member{}
	if err := m.set(certPEM, keyPEM, caPEM); err != nil {
		return nil, err
	}
	return m, nil
}

// Identity is the member's own identity.
func (m *Member) Identity() Identity {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.id
}

// Expiry is when the member's certificate expires.
func (m *Member) Expiry() time.Time {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.cert.Leaf.NotAfter
}

// SetCertificate replaces the member's certificate and key (a renewal),
// keeping its trust bundle; the identity must stay the same. For a member
// loaded from files, the files are written too (atomically), so a
// restart keeps the new certificate.
func (m *Member) SetCertificate(certPEM, keyPEM []byte) error {
	m.mu.Lock()
	certFile, keyFile, old := m.certFile, m.keyFile, m.id
	m.mu.Unlock()
	cert, id, err := parsePair(certPEM, keyPEM)
	if err != nil {
		return err
	}
	if id != old {
		return errdefs.Invalidf("renewed certificate names %s, not %s", id, old)
	}
	if certFile != "" {
		if err := atomicfs.WriteFile(keyFile, keyPEM, 0o600); err != nil {
			return err
		}
		if err := atomicfs.WriteFile(certFile, certPEM, 0o644); err != nil {
			return err
		}
	}
	m.mu.Lock()
	m.cert, m.id = cert, id
	if certFile != "" {
		m.stamp[0], m.stamp[1] = stampOf(certFile), stampOf(keyFile)
	}
	m.mu.Unlock()
	return nil
}

func (m *Member) set(certPEM, keyPEM, caPEM []byte) error {
	cert, id, err := parsePair(certPEM, keyPEM)
	if err != nil {
		return err
	}
	roots, err := pool(caPEM)
	if err != nil {
		return err
	}
	if _, err := cert.Leaf.Verify(x509.VerifyOptions{Roots: roots, KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageAny}}); err != nil {
		return errdefs.Invalidf("fleet certificate of %s: not signed by a trusted fleet CA: %v", id, err)
	}
	m.mu.Lock()
	m.cert, m.id, m.roots = cert, id, roots
	m.mu.Unlock()
	return nil
}

// WatchBundle makes a member whose certificate is in memory read its CA
// bundle again from path when the file changes (a replica: the CA
// rotation's new bundle is trusted without a restart).
func (m *Member) WatchBundle(path string) {
	m.mu.Lock()
	m.caFile, m.stamp[2], m.checked = path, stampOf(path), time.Now()
	m.mu.Unlock()
}

// reload reads the files again when they changed (or when force).
func (m *Member) reload(force bool) error {
	if m.certFile == "" {
		return m.reloadBundle()
	}
	m.mu.Lock()
	if !force && time.Since(m.checked) < ReloadEvery {
		m.mu.Unlock()
		return nil
	}
	m.checked = time.Now()
	stamps := [3]fileStamp{stampOf(m.certFile), stampOf(m.keyFile), stampOf(m.caFile)}
	same := stamps == m.stamp
	m.mu.Unlock()
	if same && !force {
		return nil
	}
	var bs [3][]byte
	for i, f := range []string{m.certFile, m.keyFile, m.caFile} {
		b, err := os.ReadFile(f)
		if err != nil {
			return fmt.Errorf("fleet TLS: %w", err)
		}
		bs[i] = b
	}
	if err := m.set(bs[0], bs[1], bs[2]); err != nil {
		return err
	}
	m.mu.Lock()
	m.stamp = stamps
	m.mu.Unlock()
	return nil
}

// reloadBundle reads a watched CA bundle again when it changed.
func (m *Member) reloadBundle() error {
	m.mu.Lock()
	if m.caFile == "" || time.Since(m.checked) < ReloadEvery {
		m.mu.Unlock()
		return nil
	}
	m.checked = time.Now()
	st := stampOf(m.caFile)
	same, path := st == m.stamp[2], m.caFile
	m.mu.Unlock()
	if same {
		return nil
	}
	b, err := os.ReadFile(path)
	if err != nil {
		return err
	}
	roots, err := pool(b)
	if err != nil {
		return err
	}
	m.mu.Lock()
	m.roots, m.stamp[2] = roots, st
	m.mu.Unlock()
	return nil
}

func (m *Member) current() (*tls.Certificate, *x509.CertPool) {
	_ = m.reload(false) // a failed reload keeps what was read before
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.cert, m.roots
}

// verify checks a peer's certificate chain against the fleet CAs and
// returns its identity.
func (m *Member) verify(rawCerts [][]byte, usage x509.ExtKeyUsage) (Identity, error) {
	if len(rawCerts) == 0 {
		return Identity{}, errors.New("no certificate")
	}
	_, roots := m.current()
	leaf, err := x509.ParseCertificate(rawCerts[0])
	if err != nil {
		return Identity{}, err
	}
	inter := x509.NewCertPool()
	for _, raw := range rawCerts[1:] {
		if c, err := x509.ParseCertificate(raw); err == nil {
			inter.AddCert(c)
		}
	}
	if _, err := leaf.Verify(x509.VerifyOptions{Roots: roots, Intermediates: inter, KeyUsages: []x509.ExtKeyUsage{usage}}); err != nil {
		return Identity{}, err
	}
	return identityOf(leaf)
}

// ServerConfig is the TLS configuration of a listener of this member:
// its certificate, TLS 1.3, and client certificates of the fleet
// (required, or verified when given with clientAuth
// tls.VerifyClientCertIfGiven); the caller's identity is then read with
// PeerIdentity.
func (m *Member) ServerConfig(clientAuth tls.ClientAuthType) *tls.Config {
	base := &tls.Config{MinVersion: tls.VersionTLS13, NextProtos: []string{"h2", "http/1.1"}}
	base.GetConfigForClient = func(*tls.ClientHelloInfo) (*tls.Config, error) {
		cert, roots := m.current()
		c := base.Clone()
		c.GetConfigForClient = nil
		c.Certificates = []tls.Certificate{*cert}
		c.ClientCAs = roots
		c.ClientAuth = clientAuth
		return c, nil
	}
	return base
}

// ClientConfig is the TLS configuration of a connection this member
// opens: its certificate, and the server's verified against the fleet CAs
// (not against a host name: members are named by identity) and then
// judged by want (nil: any fleet member).
func (m *Member) ClientConfig(want func(Identity) error) *tls.Config {
	return &tls.Config{
		MinVersion: tls.VersionTLS13,
		// The chain and identity are checked in VerifyPeerCertificate:
		// a member is known by its identity, not by the address it was
		// dialed at.
		InsecureSkipVerify: true,
		GetClientCertificate: func(*tls.CertificateRequestInfo) (*tls.Certificate, error) {
			cert, _ := m.current()
			return cert, nil
		},
		VerifyPeerCertificate: func(raw [][]byte, _ [][]*x509.Certificate) error {
			id, err := m.verify(raw, x509.ExtKeyUsageServerAuth)
			if err != nil {
				return fmt.Errorf("fleet peer: %w", err)
			}
			if want != nil {
				if err := want(id); err != nil {
					return fmt.Errorf("fleet peer %s: %w", id, err)
				}
			}
			return nil
		},
	}
}

// IsNode accepts node name (ClientConfig's want).
func IsNode(name string) func(Identity) error {
	return func(id Identity) error {
		if id.Role != RoleNode || id.Name != name {
			return fmt.Errorf("want node %s", name)
		}
		return nil
	}
}

// IsRole accepts any member of the roles.
func IsRole(roles ...Role) func(Identity) error {
	return func(id Identity) error {
		for _, r := range roles {
			if id.Role == r {
				return nil
			}
		}
		return fmt.Errorf("want a member of role %v", roles)
	}
}

func parsePair(certPEM, keyPEM []byte) (*tls.Certificate, Identity, error) {
	cert, err := tls.X509KeyPair(certPEM, keyPEM)
	if err != nil {
		return nil, Identity{}, errdefs.Invalidf("fleet certificate and key: %v", err)
	}
	id, err := identityOf(cert.Leaf)
	if err != nil {
		return nil, Identity{}, errdefs.Invalidf("%v", err)
	}
	return &cert, id, nil
}

func pool(caPEM []byte) (*x509.CertPool, error) {
	certs, err := parseCerts(caPEM)
	if err != nil || len(certs) == 0 {
		return nil, errdefs.Invalidf("fleet CA bundle: no PEM certificate (%v)", err)
	}
	p := x509.NewCertPool()
	for _, c := range certs {
		if !c.IsCA {
			return nil, errdefs.Invalidf("fleet CA bundle: %q is not a CA", c.Subject.CommonName)
		}
		p.AddCert(c)
	}
	return p, nil
}

func stampOf(path string) fileStamp {
	st, err := os.Stat(path)
	if err != nil {
		return fileStamp{}
	}
	return fileStamp{mod: st.ModTime(), size: st.Size()}
}

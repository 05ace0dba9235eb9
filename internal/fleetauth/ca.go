package fleetauth

import (
	"crypto"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/sha256"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/hex"
	"encoding/pem"
	"fmt"
	"math/big"
	"net"
	"net/url"
	"time"

	"github.com/spore-run/spore/internal/errdefs"
)

// Certificate lifetimes.
const (
	CALifetime = 10 * 365 * 24 * time.Hour
	// NodeCertLifetime: a node renews its certificate at two thirds of it
	// (enroll.go), so a lost node's certificate is of no use for long.
	NodeCertLifetime = 30 * 24 * time.Hour
	// ReplicaCertLifetime: a replica issues its own from the CA it holds
	// and renews it at half of it.
	ReplicaCertLifetime = 7 * 24 * time.Hour
)

// CA is the fleet's certificate authority: API replicas hold it (they
// sign the certificates nodes enroll for, and their own); nodes hold only
// its certificate.
type CA struct {
	Cert    *x509.Certificate
	CertPEM []byte
	key     crypto.Signer
}

// NewCA makes a CA (ECDSA P-256, valid CALifetime, able to sign member
// certificates only) and returns it with its key in PEM.
func NewCA(name string) (*CA, []byte, error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, nil, err
	}
	now := time.Now()
	tmpl := &x509.Certificate{
		SerialNumber:          serial(),
		Subject:               pkix.Name{Organization: []string{"Spore"}, CommonName: name},
		NotBefore:             now.Add(-time.Hour),
		NotAfter:              now.Add(CALifetime),
		KeyUsage:              x509.KeyUsageCertSign | x509.KeyUsageCRLSign,
		BasicConstraintsValid: true,
		IsCA:                  true,
		MaxPathLenZero:        true,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		return nil, nil, err
	}
	cert, _ := x509.ParseCertificate(der)
	kder, err := x509.MarshalECPrivateKey(key)
	if err != nil {
		return nil, nil, err
	}
	return &CA{Cert: cert, CertPEM: pemBlock("CERTIFICATE", der), key: key}, pemBlock("EC PRIVATE KEY", kder), nil
}

// LoadCA reads a CA from its certificate and key (PEM).
func LoadCA(certPEM, keyPEM []byte) (*CA, error) {
	certs, err := parseCerts(certPEM)
	if err != nil || len(certs) == 0 {
		return nil, errdefs.Invalidf("fleet CA certificate: no PEM certificate (%v)", err)
	}
	key, err := parseKey(keyPEM)
	if err != nil {
		return nil, errdefs.Invalidf("fleet CA key: %v", err)
	}
	ca := certs[0]
	if !ca.IsCA {
		return nil, errdefs.Invalidf("fleet CA certificate %q is not a CA", ca.Subject.CommonName)
	}
	if !publicKeysEqual(ca.PublicKey, key.Public()) {
		return nil, errdefs.Invalidf("fleet CA key is not the CA certificate's")
	}
	return &CA{Cert: ca, CertPEM: pemBlock("CERTIFICATE", ca.Raw), key: key}, nil
}

// Sign issues a member certificate for pub: identity id in a URI SAN,
// hosts (IP addresses or DNS names) as SANs too, usable as a server and
// as a client, valid for ttl.
func (ca *CA) Sign(pub crypto.PublicKey, id Identity, hosts []string, ttl time.Duration) ([]byte, error) {
	if err := id.Validate(); err != nil {
		return nil, err
	}
	now := time.Now()
	tmpl := &x509.Certificate{
		SerialNumber: serial(),
		Subject:      pkix.Name{Organization: []string{"Spore fleet"}, CommonName: id.String()},
		URIs:         []*url.URL{id.URI()},
		NotBefore:    now.Add(-5 * time.Minute),
		NotAfter:     now.Add(ttl),
		KeyUsage:     x509.KeyUsageDigitalSignature,
		ExtKeyUsage:  []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth, x509.ExtKeyUsageClientAuth},
	}
	if tmpl.NotAfter.After(ca.Cert.NotAfter) {
		tmpl.NotAfter = ca.Cert.NotAfter
	}
	for _, h := range hosts {
		if ip := net.ParseIP(h); ip != nil {
			tmpl.IPAddresses = append(tmpl.IPAddresses, ip)
		} else if h != "" {
			tmpl.DNSNames = append(tmpl.DNSNames, h)
		}
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca.Cert, pub, ca.key)
	if err != nil {
		return nil, fmt.Errorf("sign a certificate for %s: %w", id, err)
	}
	return pemBlock("CERTIFICATE", der), nil
}

// Issue makes a key and a certificate for id (PEM: certificate, key).
func (ca *CA) Issue(id Identity, hosts []string, ttl time.Duration) ([]byte, []byte, error) {
	key, keyPEM, err := NewKey()
	if err != nil {
		return nil, nil, err
	}
	certPEM, err := ca.Sign(key.Public(), id, hosts, ttl)
	return certPEM, keyPEM, err
}

// NewKey makes a member's key (ECDSA P-256) and returns it with its PEM.
func NewKey() (crypto.Signer, []byte, error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, nil, err
	}
	der, err := x509.MarshalECPrivateKey(key)
	if err != nil {
		return nil, nil, err
	}
	return key, pemBlock("EC PRIVATE KEY", der), nil
}

// KeyID is a public key's fingerprint: hex SHA-256 of its DER.
func KeyID(pub crypto.PublicKey) (string, error) {
	der, err := x509.MarshalPKIXPublicKey(pub)
	if err != nil {
		return "", err
	}
	sum := sha256.Sum256(der)
	return hex.EncodeToString(sum[:]), nil
}

func serial() *big.Int {
	n, _ := rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 126))
	return n
}

func pemBlock(typ string, der []byte) []byte {
	return pem.EncodeToMemory(&pem.Block{Type: typ, Bytes: der})
}

// parseCerts reads every certificate of a PEM bundle.
func parseCerts(b []byte) ([]*x509.Certificate, error) {
	var out []*x509.Certificate
	for {
		var blk *pem.Block
		blk, b = pem.Decode(b)
		if blk == nil {
			return out, nil
		}
		if blk.Type != "CERTIFICATE" {
			continue
		}
		c, err := x509.ParseCertificate(blk.Bytes)
		if err != nil {
			return nil, err
		}
		out = append(out, c)
	}
}

// parseKey reads a private key (EC, PKCS#8) from PEM.
func parseKey(b []byte) (crypto.Signer, error) {
	blk, _ := pem.Decode(b)
	if blk == nil {
		return nil, fmt.Errorf("no PEM key")
	}
	if k, err := x509.ParseECPrivateKey(blk.Bytes); err == nil {
		return k, nil
	}
	if k, err := x509.ParsePKCS1PrivateKey(blk.Bytes); err == nil {
		return k, nil // an RSA CA (cert-manager's default)
	}
	k, err := x509.ParsePKCS8PrivateKey(blk.Bytes)
	if err != nil {
		return nil, err
	}
	s, ok := k.(crypto.Signer)
	if !ok {
		return nil, fmt.Errorf("unsupported key type %T", k)
	}
	return s, nil
}

func publicKeysEqual(a, b crypto.PublicKey) bool {
	ea, ok := a.(interface{ Equal(crypto.PublicKey) bool })
	return ok && ea.Equal(b)
}

// Package fleettest makes fleet CAs and members for tests.
package fleettest

import (
	"testing"

	"github.com/spore-run/spore/internal/fleetauth"
)

// CA is a test fleet CA.
type CA struct {
	*fleetauth.CA
	KeyPEM []byte
}

// New makes a fleet CA.
func New(t testing.TB) *CA {
	t.Helper()
	ca, key, err := fleetauth.NewCA("test fleet CA")
	if err != nil {
		t.Fatal(err)
	}
	return &CA{CA: ca, KeyPEM: key}
}

// Member is a fleet of mutual TLS for a member of role named name, with
// a certificate of this CA naming hosts.
func (c *CA) Member(t testing.TB, role fleetauth.Role, name string, hosts ...string) *fleetauth.Fleet {
	t.Helper()
	certPEM, keyPEM, err := c.Issue(fleetauth.Identity{Role: role, Name: name}, hosts, fleetauth.NodeCertLifetime)
	if err != nil {
		t.Fatal(err)
	}
	m, err := fleetauth.NewMember(certPEM, keyPEM, c.CertPEM)
	if err != nil {
		t.Fatal(err)
	}
	return fleetauth.Secure(m)
}

// Package fleetauth is how the members of a Spore fleet (API replicas and
// node agents) know each other: mutual TLS under a fleet certificate
// authority. Every member has a certificate naming its identity (its role
// and name) in a URI SAN, spore://node/<id> or spore://replica/<name>;
// every connection inside the fleet is TLS 1.3, both sides present a
// certificate the fleet CA signed, and each side checks what the other is
// (a replica calling node N checks it reached N; a node serves its RPC and
// proxy only to replicas; a replica records a node's registration only
// for the node its certificate names).
//
// A fleet without certificates is possible only in insecure mode
// (Insecure): cleartext HTTP/2 and one shared token, as before mutual TLS,
// with a warning in the log.
package fleetauth

import (
	"crypto/x509"
	"fmt"
	"net/url"
	"strings"

	"github.com/spore-run/spore/internal/errdefs"
	"github.com/spore-run/spore/internal/ids"
)

// Role is what a fleet member is.
type Role string

// The roles.
const (
	RoleNode    Role = "node"
	RoleReplica Role = "replica"
	// RoleToken is what an insecure fleet knows of a caller: it holds the
	// shared token, and may be anything.
	RoleToken Role = "token"
)

// Identity is a fleet member: its role and its name (a node's ID, a
// replica's name).
type Identity struct {
	Role Role
	Name string
}

func (id Identity) String() string { return string(id.Role) + "/" + id.Name }

// URI is the identity as a certificate carries it.
func (id Identity) URI() *url.URL {
	return &url.URL{Scheme: "spore", Host: string(id.Role), Path: "/" + id.Name}
}

// Validate checks an identity a certificate may carry.
func (id Identity) Validate() error {
	if id.Role != RoleNode && id.Role != RoleReplica {
		return errdefs.Invalidf("fleet identity: role %q, want node or replica", id.Role)
	}
	return ids.ValidateName("fleet member name", id.Name)
}

// identityOf reads the identity of a certificate: exactly one spore://
// URI SAN of a known role and a valid name.
func identityOf(cert *x509.Certificate) (Identity, error) {
	var found []Identity
	for _, u := range cert.URIs {
		if u.Scheme != "spore" {
			continue
		}
		id := Identity{Role: Role(u.Host), Name: strings.TrimPrefix(u.Path, "/")}
		if err := id.Validate(); err != nil || u.RawQuery != "" || u.Fragment != "" || u.User != nil {
			return Identity{}, fmt.Errorf("certificate %q: bad fleet identity %s", cert.Subject.CommonName, u)
		}
		found = append(found, id)
	}
	if len(found) != 1 {
		return Identity{}, fmt.Errorf("certificate %q: %d fleet identities, want one", cert.Subject.CommonName, len(found))
	}
	return found[0], nil
}

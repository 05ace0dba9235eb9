package server

import (
	"context"
	"fmt"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"strings"
	"syscall"

	"github.com/spore-run/spore/internal/fleetauth"
	"github.com/spore-run/spore/internal/ids"
	"github.com/spore-run/spore/internal/store"
)

// FleetConfig is how a member of a fleet (an API replica, a node agent)
// authenticates the others: mutual TLS under the fleet CA (see
// internal/fleetauth and docs/deploy.md "Fleet TLS"), or, only when
// Insecure, cleartext and one shared token.
type FleetConfig struct {
	// Insecure (--insecure-fleet): cleartext, Token is every identity.
	Insecure bool
	Token    string
	// CAFile is the fleet CA bundle (PEM: the CA, and during a rotation
	// the previous one too).
	CAFile string
	// CAKeyFile (replicas): the CA's key. Replicas sign the certificates
	// nodes enroll for, and their own.
	CAKeyFile string
	// JoinToken: replicas admit a node's first enrollment with it; a node
	// without a certificate enrolls with it ("": certificates are issued
	// beforehand, `spore fleet cert`).
	JoinToken string
	// Listen (replicas): the fleet listener, TLS: nodes register and
	// enroll there.
	Listen string
	// Name (replicas): the replica's name in its certificate (default:
	// the host name and a random suffix).
	Name string
}

// replicaFleet is a replica's side of the fleet, and its enroller (nil
// when insecure).
func (c FleetConfig) replicaFleet(st store.Store, log *slog.Logger) (*fleetauth.Fleet, *fleetauth.Enroller, error) {
	if c.Insecure {
		f, err := fleetauth.Insecure(c.Token, log)
		return f, nil, err
	}
	if c.CAFile == "" || c.CAKeyFile == "" {
		return nil, nil, fmt.Errorf("fleet TLS: --fleet-ca and --fleet-ca-key are needed (make them with `spore fleet ca init`), or --insecure-fleet with --cluster-token-file")
	}
	if c.Listen == "" {
		return nil, nil, fmt.Errorf("fleet TLS: --fleet-listen is needed (where nodes register and enroll)")
	}
	bundle, err := os.ReadFile(c.CAFile)
	if err != nil {
		return nil, nil, fmt.Errorf("fleet CA: %w", err)
	}
	keyPEM, err := os.ReadFile(c.CAKeyFile)
	if err != nil {
		return nil, nil, fmt.Errorf("fleet CA key: %w", err)
	}
	if err := checkKeyMode(c.CAKeyFile); err != nil {
		return nil, nil, err
	}
	ca, err := fleetauth.LoadCA(bundle, keyPEM)
	if err != nil {
		return nil, nil, err
	}
	name := c.Name
	if name == "" {
		host, _ := os.Hostname()
		name = sanitizeName(host) + "-" + ids.New('r')[1:9]
	}
	m, err := fleetauth.ReplicaMember(ca, bundle, name)
	if err != nil {
		return nil, nil, err
	}
	m.WatchBundle(c.CAFile)
	en := &fleetauth.Enroller{CA: ca, Bundle: bundle, BundleFile: c.CAFile, JoinToken: c.JoinToken, Log: log,
		Bind: func(ctx context.Context, nodeID, keyID string) error { return st.BindNodeKey(ctx, nodeID, keyID) }}
	return fleetauth.Secure(m), en, nil
}

// nodeFleet is a node's side of the fleet: its certificate from
// dataDir/fleet, enrolled or renewed now when needed (and kept renewed
// until ctx ends).
func (c FleetConfig) nodeFleet(ctx context.Context, dataDir, nodeID, advertise string, apiURLs []string, log *slog.Logger) (*fleetauth.Fleet, error) {
	if c.Insecure {
		return fleetauth.Insecure(c.Token, log)
	}
	host, _, err := net.SplitHostPort(advertise)
	if err != nil {
		return nil, err
	}
	for _, u := range apiURLs {
		if !strings.HasPrefix(u, "https://") {
			return nil, fmt.Errorf("--api-url %q: a fleet with TLS registers at the replicas' fleet listener, https://host:port", u)
		}
	}
	ne := fleetauth.NodeEnrollment{Dir: filepath.Join(dataDir, "fleet"), CAFile: c.CAFile, Node: nodeID, Hosts: []string{host},
		APIURLs: apiURLs, JoinToken: c.JoinToken, Log: log}
	m, err := ne.Ensure(ctx)
	if err != nil {
		return nil, err
	}
	go ne.Renew(ctx, m)
	return fleetauth.Secure(m), nil
}

// checkKeyMode refuses a key file others can read, with PostgreSQL's rule
// for its own key: mode 0600 (or stricter), or, owned by root, 0640 (a
// group the service is in may read it: Kubernetes gives a Secret's files
// to the pod's fsGroup this way, systemd its credentials).
func checkKeyMode(path string) error {
	st, err := os.Stat(path)
	if err != nil {
		return err
	}
	perm := st.Mode().Perm()
	ownerRoot := false
	if sys, ok := st.Sys().(*syscall.Stat_t); ok {
		ownerRoot = sys.Uid == 0
	}
	if perm&0o077 == 0 || ownerRoot && perm&0o037 == 0 {
		return nil
	}
	return fmt.Errorf("fleet CA key %s: mode %v lets others read it: chmod 600 it (or 640, owned by root)", path, perm)
}

// sanitizeName keeps what a fleet member name may hold.
func sanitizeName(s string) string {
	var b strings.Builder
	for _, r := range s {
		if r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r >= '0' && r <= '9' || r == '.' || r == '-' || r == '_' {
			b.WriteRune(r)
		}
	}
	if b.Len() == 0 {
		return "replica"
	}
	return b.String()
}

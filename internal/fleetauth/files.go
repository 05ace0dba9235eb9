package fleetauth

import (
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"

	"github.com/spore-run/spore/internal/atomicfs"
	"github.com/spore-run/spore/internal/errdefs"
)

// CAFiles are a fleet CA's files in dir: its certificate (give it to every
// member), its key and the join token (replicas only; mode 0600).
func CAFiles(dir string) (cert, key, joinToken string) {
	return filepath.Join(dir, "ca.crt"), filepath.Join(dir, "ca.key"), filepath.Join(dir, "join-token")
}

// InitCA makes a fleet CA and a join token in dir (CAFiles), refusing to
// replace an existing one.
func InitCA(dir string) error {
	certFile, keyFile, tokenFile := CAFiles(dir)
	for _, f := range []string{certFile, keyFile, tokenFile} {
		if _, err := os.Stat(f); err == nil {
			return fmt.Errorf("%s exists: a fleet CA is there already: %w", f, errdefs.ErrAlreadyExists)
		} else if !errors.Is(err, fs.ErrNotExist) {
			return err
		}
	}
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return err
	}
	ca, keyPEM, err := NewCA("Spore fleet CA")
	if err != nil {
		return err
	}
	b := make([]byte, 24)
	rand.Read(b)
	if err := atomicfs.WriteFile(keyFile, keyPEM, 0o600); err != nil {
		return err
	}
	if err := atomicfs.WriteFile(tokenFile, []byte(hex.EncodeToString(b)+"\n"), 0o600); err != nil {
		return err
	}
	return atomicfs.WriteFile(certFile, ca.CertPEM, 0o644)
}

// LoadCAFiles reads the CA in dir (CAFiles).
func LoadCAFiles(dir string) (*CA, error) {
	certFile, keyFile, _ := CAFiles(dir)
	c, err := os.ReadFile(certFile)
	if err != nil {
		return nil, err
	}
	k, err := os.ReadFile(keyFile)
	if err != nil {
		return nil, err
	}
	return LoadCA(c, k)
}

// IssueNodeFiles issues node id a certificate from the CA in caDir, for
// hosts, into outDir as a node keeps it (NodeFiles): for a node that
// does not enroll (its operator issues its certificates).
func IssueNodeFiles(caDir, id string, hosts []string, outDir string) error {
	ca, err := LoadCAFiles(caDir)
	if err != nil {
		return err
	}
	certPEM, keyPEM, err := ca.Issue(Identity{Role: RoleNode, Name: id}, hosts, NodeCertLifetime)
	if err != nil {
		return err
	}
	if err := os.MkdirAll(outDir, 0o700); err != nil {
		return err
	}
	certFile, keyFile, caFile := NodeFiles(outDir)
	if err := atomicfs.WriteFile(keyFile, keyPEM, 0o600); err != nil {
		return err
	}
	if err := atomicfs.WriteFile(caFile, ca.CertPEM, 0o644); err != nil {
		return err
	}
	return atomicfs.WriteFile(certFile, certPEM, 0o644)
}

package envd

import (
	"bytes"
	"crypto/x509"
	"encoding/pem"
	"errors"
	"fmt"
	"os"
	"path/filepath"
)

// Where a sandbox's egress CA goes (Debian's layout, which most images
// share): appended to the system bundle every OpenSSL, GnuTLS and Go
// client reads, and kept alone in SporeCAFile, the one file Node.js'
// NODE_EXTRA_CA_CERTS takes.
var (
	SystemCABundle = "/etc/ssl/certs/ca-certificates.crt"
	SporeCAFile    = "/usr/local/share/ca-certificates/spore-egress.crt"
)

// trustEnv are the variables that point clients with a bundle of their
// own at the system's (set unless the sandbox's environment sets them).
func trustEnv() map[string]string {
	return map[string]string{
		"SSL_CERT_FILE":       SystemCABundle, // OpenSSL (Python's ssl, Ruby), Go
		"REQUESTS_CA_BUNDLE":  SystemCABundle, // Python requests (certifi otherwise)
		"CURL_CA_BUNDLE":      SystemCABundle,
		"NODE_EXTRA_CA_CERTS": SporeCAFile, // Node.js adds it to its own bundle
	}
}

// installCA adds the sandbox's egress CA (one PEM certificate) to its
// trust store: the system bundle and SporeCAFile, each once however
// often it is installed (an init after every restore).
func installCA(certPEM []byte) error {
	b, rest := pem.Decode(certPEM)
	if b == nil || b.Type != "CERTIFICATE" || len(bytes.TrimSpace(rest)) != 0 {
		return errors.New("egress CA: want one PEM certificate")
	}
	c, err := x509.ParseCertificate(b.Bytes)
	if err != nil || !c.IsCA {
		return fmt.Errorf("egress CA: not a CA certificate: %v", err)
	}
	block := pem.EncodeToMemory(b)
	for _, f := range []string{SystemCABundle, SporeCAFile} {
		if err := appendOnce(f, block); err != nil {
			return fmt.Errorf("egress CA: %w", err)
		}
	}
	return nil
}

func appendOnce(path string, block []byte) error {
	old, err := os.ReadFile(path)
	if err != nil && !errors.Is(err, os.ErrNotExist) {
		return err
	}
	if bytes.Contains(old, block) {
		return nil
	}
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		return err
	}
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_CREATE|os.O_APPEND, 0o644)
	if err != nil {
		return err
	}
	if len(old) > 0 && old[len(old)-1] != '\n' {
		f.Write([]byte("\n"))
	}
	if _, err := f.Write(block); err != nil {
		f.Close()
		return err
	}
	return f.Close()
}

package fleetauth

import (
	"bytes"
	"context"
	"crypto"
	"crypto/ecdsa"
	"crypto/ed25519"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/sha256"
	"crypto/subtle"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/json"
	"encoding/pem"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/spore-run/spore/internal/atomicfs"
	"github.com/spore-run/spore/internal/errdefs"
	"github.com/spore-run/spore/internal/ids"
)

// EnrollPath is the replicas' route where a node gets its certificate: at
// its first start with the fleet's join token, later (renewals) with its
// current certificate.
const EnrollPath = "/internal/enroll"

// MaxHosts bounds the host names and addresses a node certificate names.
const MaxHosts = 16

// EnrollRequest is what a node sends to EnrollPath.
type EnrollRequest struct {
	Node  string   `json:"node"`
	CSR   string   `json:"csr"`   // PEM certificate request, signed by the node's key
	Hosts []string `json:"hosts"` // addresses or names it is reached at
}

// EnrollResponse is the signed certificate and the CA bundle to trust.
type EnrollResponse struct {
	Cert string `json:"cert"`
	CA   string `json:"ca"`
}

// Enroller signs node certificates on a replica.
type Enroller struct {
	CA *CA
	// Bundle is the CA bundle nodes are told to trust (the CA's
	// certificate, and the previous or next CA's during a rotation);
	// BundleFile, when set, is read again for each answer instead (a
	// rotation's bundle reaches the nodes at their next renewal).
	Bundle     []byte
	BundleFile string
	// JoinToken admits a first enrollment ("": renewals only; nodes need
	// certificates issued beforehand).
	JoinToken string
	// Bind binds a node ID to the key it enrolls (store.BindNodeKey).
	Bind func(ctx context.Context, nodeID, keyID string) error
	Log  *slog.Logger
}

// Handler serves EnrollPath on the replica's fleet listener (f's
// ServerTLS with tls.VerifyClientCertIfGiven). A caller presenting a node
// certificate renews that node's; anyone else needs the join token as
// "Authorization: Bearer". Either way the node ID is bound to the key
// (the first enrollment of an ID wins: another key is a 409), and the
// certificate names the node and the hosts given.
func (e *Enroller) Handler(f *Fleet) http.Handler {
	join := sha256.Sum256([]byte(e.JoinToken))
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method != http.MethodPost {
			http.Error(w, "POST only", http.StatusMethodNotAllowed)
			return
		}
		var req EnrollRequest
		if err := json.NewDecoder(http.MaxBytesReader(w, r.Body, 64<<10)).Decode(&req); err != nil {
			http.Error(w, "enroll: "+err.Error(), http.StatusBadRequest)
			return
		}
		if err := ids.Validate("node ID", req.Node); err != nil {
			http.Error(w, err.Error(), http.StatusBadRequest)
			return
		}
		peer, renewal := f.PeerIdentity(r)
		switch {
		case renewal && (peer.Role != RoleNode || peer.Name != req.Node):
			http.Error(w, fmt.Sprintf("enroll: %s may renew only its own certificate", peer), http.StatusForbidden)
			return
		case !renewal:
			tok, _ := strings.CutPrefix(r.Header.Get("Authorization"), "Bearer ")
			sum := sha256.Sum256([]byte(tok))
			if e.JoinToken == "" || tok == "" || subtle.ConstantTimeCompare(sum[:], join[:]) != 1 {
				http.Error(w, "enroll: a node certificate or the fleet's join token is needed", http.StatusUnauthorized)
				return
			}
		}
		certPEM, err := e.sign(r.Context(), req)
		switch {
		case errdefs.IsInvalidArgument(err):
			http.Error(w, err.Error(), http.StatusBadRequest)
			return
		case errdefs.IsConflict(err):
			http.Error(w, err.Error(), http.StatusConflict)
			return
		case err != nil:
			e.Log.Error("enroll a node", "node_id", req.Node, "err", err)
			http.Error(w, "enroll: could not sign now", http.StatusServiceUnavailable)
			return
		}
		e.Log.Info("fleet certificate issued", "node_id", req.Node, "renewal", renewal, "hosts", req.Hosts)
		w.Header().Set("Content-Type", "application/json")
		bundle := e.Bundle
		if e.BundleFile != "" {
			if b, err := os.ReadFile(e.BundleFile); err == nil {
				if _, err := pool(b); err == nil {
					bundle = b
				}
			}
		}
		json.NewEncoder(w).Encode(EnrollResponse{Cert: string(certPEM), CA: string(bundle)})
	})
}

func (e *Enroller) sign(ctx context.Context, req EnrollRequest) ([]byte, error) {
	blk, _ := pem.Decode([]byte(req.CSR))
	if blk == nil || blk.Type != "CERTIFICATE REQUEST" {
		return nil, errdefs.Invalidf("enroll: csr is not a PEM certificate request")
	}
	csr, err := x509.ParseCertificateRequest(blk.Bytes)
	if err != nil {
		return nil, errdefs.Invalidf("enroll: csr: %v", err)
	}
	if err := csr.CheckSignature(); err != nil {
		return nil, errdefs.Invalidf("enroll: csr signature: %v", err)
	}
	switch k := csr.PublicKey.(type) {
	case *ecdsa.PublicKey:
		if k.Curve != elliptic.P256() {
			return nil, errdefs.Invalidf("enroll: ECDSA keys on P-256 only")
		}
	case ed25519.PublicKey:
	default:
		return nil, errdefs.Invalidf("enroll: key type %T: want ECDSA P-256 or Ed25519", csr.PublicKey)
	}
	if len(req.Hosts) > MaxHosts {
		return nil, errdefs.Invalidf("enroll: %d hosts, at most %d", len(req.Hosts), MaxHosts)
	}
	for _, h := range req.Hosts {
		if net.ParseIP(h) == nil && !validDNSName(h) {
			return nil, errdefs.Invalidf("enroll: host %q is neither an address nor a DNS name", h)
		}
	}
	keyID, err := KeyID(csr.PublicKey)
	if err != nil {
		return nil, errdefs.Invalidf("enroll: key: %v", err)
	}
	if err := e.Bind(ctx, req.Node, keyID); err != nil {
		if errdefs.IsConflict(err) {
			return nil, fmt.Errorf("%w (start it with another --node-id, or its original key)", err)
		}
		return nil, err
	}
	return e.CA.Sign(csr.PublicKey, Identity{Role: RoleNode, Name: req.Node}, req.Hosts, NodeCertLifetime)
}

func validDNSName(h string) bool {
	if len(h) == 0 || len(h) > 253 {
		return false
	}
	for _, label := range strings.Split(h, ".") {
		if label == "" || len(label) > 63 || label[0] == '-' || label[len(label)-1] == '-' {
			return false
		}
		for _, c := range label {
			if !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '-') {
				return false
			}
		}
	}
	return true
}

// NodeFiles are a node's fleet TLS files in dir: node.key (made once,
// kept: the node's identity is bound to it), node.crt and ca.crt (from
// the enrollment, or placed there beforehand by the operator).
func NodeFiles(dir string) (cert, key, ca string) {
	return filepath.Join(dir, "node.crt"), filepath.Join(dir, "node.key"), filepath.Join(dir, "ca.crt")
}

// NodeEnrollment is how a node gets and keeps its certificate.
type NodeEnrollment struct {
	Dir    string   // NodeFiles's directory
	CAFile string   // the fleet CA bundle to trust the replicas with ("": Dir's ca.crt)
	Node   string   // the node's ID
	Hosts  []string // where replicas reach it
	// APIURLs are the replicas' fleet listeners (https://host:port),
	// tried in turn.
	APIURLs   []string
	JoinToken string
	Log       *slog.Logger
}

// Ensure returns the node's member: its certificate from Dir when valid
// for this node, trusted and not in the last third of its life; else one
// got now from a replica (renewing with the current certificate when it
// still works, else enrolling with the join token). The key is made once
// and kept.
func (ne NodeEnrollment) Ensure(ctx context.Context) (*Member, error) {
	if err := os.MkdirAll(ne.Dir, 0o700); err != nil {
		return nil, err
	}
	certFile, keyFile, caFile := NodeFiles(ne.Dir)
	if ne.CAFile != "" && ne.CAFile != caFile {
		b, err := os.ReadFile(ne.CAFile)
		if err != nil {
			return nil, fmt.Errorf("fleet CA: %w", err)
		}
		if err := atomicfs.WriteFile(caFile, b, 0o644); err != nil {
			return nil, err
		}
	}
	m, err := LoadMember(certFile, keyFile, caFile)
	if err == nil {
		if id := m.Identity(); id.Role != RoleNode || id.Name != ne.Node {
			return nil, errdefs.Invalidf("the fleet certificate in %s names %s, not node %s", ne.Dir, id, ne.Node)
		}
		if !ne.due(m) {
			return m, nil
		}
	}
	if err := ne.renew(ctx, m); err != nil {
		if m != nil && time.Now().Before(m.Expiry()) {
			ne.Log.Warn("fleet certificate: renewal failed; the current one is still valid", "node_id", ne.Node, "expires", m.Expiry(), "err", err)
			return m, nil
		}
		return nil, err
	}
	return LoadMember(certFile, keyFile, caFile)
}

// due: in the last third of its life.
func (ne NodeEnrollment) due(m *Member) bool {
	m.mu.Lock()
	leaf := m.cert.Leaf
	m.mu.Unlock()
	life := leaf.NotAfter.Sub(leaf.NotBefore)
	return time.Until(leaf.NotAfter) < life/3
}

// Renew keeps the node's certificate current until ctx ends: it looks
// every hour and renews in the last third of the certificate's life.
func (ne NodeEnrollment) Renew(ctx context.Context, m *Member) {
	t := time.NewTicker(time.Hour)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		if !ne.due(m) {
			continue
		}
		if err := ne.renew(ctx, m); err != nil {
			ne.Log.Warn("fleet certificate renewal", "node_id", ne.Node, "expires", m.Expiry(), "err", err)
		}
	}
}

// renew asks a replica for a certificate for the node's key: with cur's
// certificate when given (a renewal), else with the join token.
func (ne NodeEnrollment) renew(ctx context.Context, cur *Member) error {
	certFile, keyFile, caFile := NodeFiles(ne.Dir)
	key, err := loadOrMakeKey(keyFile)
	if err != nil {
		return err
	}
	caPEM, err := os.ReadFile(caFile)
	if err != nil {
		return fmt.Errorf("fleet CA (%s): %w", caFile, err)
	}
	roots, err := pool(caPEM)
	if err != nil {
		return err
	}
	csr, err := x509.CreateCertificateRequest(rand.Reader, &x509.CertificateRequest{
		Subject: pkix.Name{CommonName: "node/" + ne.Node}}, key)
	if err != nil {
		return err
	}
	body, _ := json.Marshal(EnrollRequest{Node: ne.Node, CSR: string(pemBlock("CERTIFICATE REQUEST", csr)), Hosts: ne.Hosts})
	tlsCfg := &tls.Config{MinVersion: tls.VersionTLS13, InsecureSkipVerify: true,
		VerifyPeerCertificate: func(raw [][]byte, _ [][]*x509.Certificate) error {
			leaf, err := x509.ParseCertificate(raw[0])
			if err != nil {
				return err
			}
			if _, err := leaf.Verify(x509.VerifyOptions{Roots: roots, KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}}); err != nil {
				return err
			}
			id, err := identityOf(leaf)
			if err == nil && id.Role != RoleReplica {
				err = fmt.Errorf("%s is not a replica", id)
			}
			return err
		}}
	if cur != nil {
		tlsCfg.GetClientCertificate = func(*tls.CertificateRequestInfo) (*tls.Certificate, error) {
			c, _ := cur.current()
			return c, nil
		}
	}
	hc := &http.Client{Timeout: 30 * time.Second, Transport: &http.Transport{TLSClientConfig: tlsCfg, ForceAttemptHTTP2: true}}
	defer hc.CloseIdleConnections()
	var errs []error
	for _, u := range ne.APIURLs {
		req, err := http.NewRequestWithContext(ctx, http.MethodPost, strings.TrimRight(u, "/")+EnrollPath, bytes.NewReader(body))
		if err != nil {
			return errdefs.Invalidf("enroll at %q: %v", u, err)
		}
		req.Header.Set("Content-Type", "application/json")
		if cur == nil && ne.JoinToken != "" {
			req.Header.Set("Authorization", "Bearer "+ne.JoinToken)
		}
		resp, err := hc.Do(req)
		if err != nil {
			errs = append(errs, err)
			continue
		}
		b, _ := io.ReadAll(io.LimitReader(resp.Body, 1<<20))
		resp.Body.Close()
		if resp.StatusCode != http.StatusOK {
			err := fmt.Errorf("enroll at %s: %s: %s", u, resp.Status, strings.TrimSpace(string(b)))
			if resp.StatusCode == http.StatusConflict || resp.StatusCode == http.StatusBadRequest {
				return errdefs.Invalidf("%v", err) // no other replica will answer otherwise
			}
			errs = append(errs, err)
			continue
		}
		var out EnrollResponse
		if err := json.Unmarshal(b, &out); err != nil {
			return fmt.Errorf("enroll at %s: %w", u, err)
		}
		if err := atomicfs.WriteFile(caFile, []byte(out.CA), 0o644); err != nil {
			return err
		}
		kp, err := os.ReadFile(keyFile)
		if err != nil {
			return err
		}
		if cur != nil {
			return cur.SetCertificate([]byte(out.Cert), kp)
		}
		if _, _, err := parsePair([]byte(out.Cert), kp); err != nil {
			return fmt.Errorf("enroll at %s: the certificate answered: %w", u, err)
		}
		return atomicfs.WriteFile(certFile, []byte(out.Cert), 0o644)
	}
	if cur == nil && ne.JoinToken == "" {
		errs = append(errs, errors.New("no certificate in "+ne.Dir+" and no join token to enroll with (--join-token-file)"))
	}
	return fmt.Errorf("%w: fleet certificate for node %s: %w", errdefs.ErrUnavailable, ne.Node, errors.Join(errs...))
}

// loadOrMakeKey reads the node's key, making it (0600) on first use.
func loadOrMakeKey(path string) (crypto.Signer, error) {
	if b, err := os.ReadFile(path); err == nil {
		return parseKey(b)
	} else if !errors.Is(err, os.ErrNotExist) {
		return nil, err
	}
	key, pemKey, err := NewKey()
	if err != nil {
		return nil, err
	}
	return key, atomicfs.WriteFile(path, pemKey, 0o600)
}

// ReplicaMember issues a replica its own certificate from the CA it
// holds (in memory), trusting bundle.
func ReplicaMember(ca *CA, bundle []byte, name string) (*Member, error) {
	certPEM, keyPEM, err := ca.Issue(Identity{Role: RoleReplica, Name: name}, nil, ReplicaCertLifetime)
	if err != nil {
		return nil, err
	}
	return NewMember(certPEM, keyPEM, bundle)
}

// RenewReplica reissues a replica's certificate at half its life until
// ctx ends.
func RenewReplica(ctx context.Context, m *Member, ca *CA, log *slog.Logger) {
	for {
		wait := time.Until(m.Expiry()) - ReplicaCertLifetime/2
		select {
		case <-ctx.Done():
			return
		case <-time.After(max(wait, time.Minute)):
		}
		certPEM, keyPEM, err := ca.Issue(m.Identity(), nil, ReplicaCertLifetime)
		if err == nil {
			err = m.SetCertificate(certPEM, keyPEM)
		}
		if err != nil {
			log.Warn("replica certificate renewal", "err", err)
		}
	}
}

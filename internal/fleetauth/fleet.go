package fleetauth

import (
	"context"
	"crypto/sha256"
	"crypto/subtle"
	"crypto/tls"
	"log/slog"
	"net"
	"net/http"
	"strings"
	"time"

	"github.com/spore-run/spore/internal/errdefs"
)

// Fleet is how one member talks to the others: mutual TLS as Member, or,
// in insecure mode only, cleartext with the shared token.
type Fleet struct {
	m     *Member
	token [sha256.Size]byte
	raw   string
}

// MinTokenLen is the shortest shared token an insecure fleet accepts.
const MinTokenLen = 16

// TokenHeader carries the shared token of an insecure fleet. (Calls
// that are not proxied may send it as "Authorization: Bearer", as
// members before mutual TLS did; a proxied request's Authorization is
// the sandbox's.)
const TokenHeader = "Spore-Cluster-Token"

// Secure is a fleet of mutual TLS as m.
func Secure(m *Member) *Fleet { return &Fleet{m: m} }

// Insecure is a fleet in cleartext under one shared token: anyone who
// holds it is every member, and anyone on the path reads every call
// (secret values, sandboxes' CA keys). It logs that.
func Insecure(token string, log *slog.Logger) (*Fleet, error) {
	if len(token) < MinTokenLen {
		return nil, errdefs.Invalidf("cluster token: %d characters, want at least %d", len(token), MinTokenLen)
	}
	if strings.ContainsAny(token, " \t\r\n") {
		return nil, errdefs.Invalidf("cluster token holds white space")
	}
	if log != nil {
		log.Warn("INSECURE FLEET (--insecure-fleet): calls between replicas and nodes are cleartext and one shared token is every identity; use a fleet CA (docs/deploy.md, \"Fleet TLS\")")
	}
	return &Fleet{token: sha256.Sum256([]byte(token)), raw: token}, nil
}

// IsSecure says whether the fleet uses mutual TLS.
func (f *Fleet) IsSecure() bool { return f.m != nil }

// Member is the fleet's TLS member (nil when insecure).
func (f *Fleet) Member() *Member { return f.m }

// Scheme is the URL scheme of calls to members: https, or http (h2c)
// when insecure.
func (f *Fleet) Scheme() string {
	if f.m != nil {
		return "https"
	}
	return "http"
}

// Token is the shared token of an insecure fleet ("" when secure).
func (f *Fleet) Token() string { return f.raw }

type idKey struct{}

// FromContext returns the identity Guard admitted a request with.
func FromContext(ctx context.Context) (Identity, bool) {
	id, ok := ctx.Value(idKey{}).(Identity)
	return id, ok
}

// WithIdentity returns ctx carrying id (what Guard does; for tests of the
// handlers behind it).
func WithIdentity(ctx context.Context, id Identity) context.Context {
	return context.WithValue(ctx, idKey{}, id)
}

// PeerIdentity is the identity of the client certificate r came with, as
// the TLS handshake verified it against the fleet CAs (the listener's
// ServerTLS: a certificate that does not chain to them ends the
// handshake, or, where certificates are optional, is not verified and
// names no one).
func (f *Fleet) PeerIdentity(r *http.Request) (Identity, bool) {
	if f.m == nil || r.TLS == nil || len(r.TLS.VerifiedChains) == 0 || len(r.TLS.VerifiedChains[0]) == 0 {
		return Identity{}, false
	}
	id, err := identityOf(r.TLS.VerifiedChains[0][0])
	return id, err == nil
}

// Guard serves h only to callers allow admits: a fleet member whose
// client certificate names an identity allow accepts or, when insecure,
// a holder of the token (RoleToken: allow is not asked). Anyone else gets
// a 401 and h never runs. The identity is in the request's context
// (FromContext). hop: the token may come only in TokenHeader (the
// request is proxied; its Authorization belongs to the sandbox), and is
// removed before h.
func (f *Fleet) Guard(h http.Handler, hop bool, allow func(Identity) bool) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		id, ok := f.Admit(r, hop, allow)
		if !ok {
			w.Header().Set("WWW-Authenticate", `Bearer realm="spore-fleet"`)
			http.Error(w, "not a member of this fleet allowed here", http.StatusUnauthorized)
			return
		}
		if hop {
			r.Header.Del(TokenHeader)
		}
		h.ServeHTTP(w, r.WithContext(WithIdentity(r.Context(), id)))
	})
}

// Admit is Guard's decision on r: the caller's identity, and whether it
// may pass.
func (f *Fleet) Admit(r *http.Request, hop bool, allow func(Identity) bool) (Identity, bool) {
	id, ok := f.identify(r, hop)
	if !ok || (id.Role != RoleToken && !allow(id)) {
		return Identity{}, false
	}
	return id, true
}

// TokenOK says whether h carries the shared token of an insecure fleet
// (in TokenHeader or as "Authorization: Bearer"); always false when secure.
func (f *Fleet) TokenOK(h http.Header) bool {
	if f.m != nil {
		return false
	}
	_, ok := f.identify(&http.Request{Header: h}, false)
	return ok
}

// Roles is a Guard allow function admitting members of the roles.
func Roles(roles ...Role) func(Identity) bool {
	return func(id Identity) bool { return IsRole(roles...)(id) == nil }
}

func (f *Fleet) identify(r *http.Request, hop bool) (Identity, bool) {
	if f.m != nil {
		return f.PeerIdentity(r)
	}
	got := r.Header.Get(TokenHeader)
	if got == "" && !hop {
		got, _ = strings.CutPrefix(r.Header.Get("Authorization"), "Bearer ") // a bare token is no bearer
		if got == r.Header.Get("Authorization") {
			got = ""
		}
	}
	sum := sha256.Sum256([]byte(got))
	if got == "" || subtle.ConstantTimeCompare(sum[:], f.token[:]) != 1 {
		return Identity{}, false
	}
	return Identity{Role: RoleToken, Name: "token"}, true
}

// ServerTLS is a member listener's TLS configuration (nil when insecure:
// cleartext). clientAuth: tls.RequireAndVerifyClientCert for listeners
// only members use (a node's), tls.VerifyClientCertIfGiven for one that
// also serves enrollment (a replica's fleet listener).
func (f *Fleet) ServerTLS(clientAuth tls.ClientAuthType) *tls.Config {
	if f.m == nil {
		return nil
	}
	return f.m.ServerConfig(clientAuth)
}

// ClientTLS is the TLS configuration of calls to a member want accepts
// (nil when insecure).
func (f *Fleet) ClientTLS(want func(Identity) error) *tls.Config {
	if f.m == nil {
		return nil
	}
	return f.m.ClientConfig(want)
}

// Transport is an HTTP transport for calls to members want accepts
// (HTTP/1.1 and HTTP/2 over TLS; when insecure, cleartext with the token
// added to every request in TokenHeader).
func (f *Fleet) Transport(want func(Identity) error) http.RoundTripper {
	tr := &http.Transport{
		TLSClientConfig:     f.ClientTLS(want),
		ForceAttemptHTTP2:   true,
		DialContext:         (&net.Dialer{Timeout: 5 * time.Second, KeepAlive: 30 * time.Second}).DialContext,
		TLSHandshakeTimeout: 5 * time.Second,
		MaxIdleConnsPerHost: 64,
		IdleConnTimeout:     90 * time.Second,
	}
	if f.m != nil {
		return tr
	}
	return tokenRT{next: tr, token: f.raw}
}

// Client is an HTTP client for calls to members want accepts, with a
// timeout (0: none, the context bounds each call).
func (f *Fleet) Client(want func(Identity) error, timeout time.Duration) *http.Client {
	return &http.Client{Transport: f.Transport(want), Timeout: timeout}
}

// tokenRT adds the shared token to each request of an insecure fleet.
type tokenRT struct {
	next  http.RoundTripper
	token string
}

func (t tokenRT) RoundTrip(r *http.Request) (*http.Response, error) {
	r = r.Clone(r.Context())
	r.Header.Set(TokenHeader, t.token)
	return t.next.RoundTrip(r)
}

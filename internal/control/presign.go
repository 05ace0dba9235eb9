package control

import (
	"context"
	"crypto/sha256"
	"crypto/subtle"
	"encoding/base64"
	"fmt"
	"net/url"
	"strconv"
	"strings"
	"sync"
	"time"

	"golang.org/x/sync/singleflight"
	"golang.org/x/time/rate"

	"github.com/spore-run/spore/internal/errdefs"
	"github.com/spore-run/spore/internal/store"
)

// Presigned /files URLs (E2B's downloadUrl and uploadUrl) carry a
// signature over the path, the operation, the user and the sandbox's envd
// access token, and nothing that names the sandbox when the SDK uses one
// origin for every sandbox (E2B_SANDBOX_URL): the proxy must find whose
// token signed it. A URL whose Host names its sandbox ({port}-{id}.domain,
// the form without E2B_SANDBOX_URL) never comes here: it is routed like any
// request, and envd checks the signature, O(1).
//
// The search costs no store read and no node call: each replica keeps the
// running sandboxes' tokens in memory (presignIndex), filled from the
// store at most once per PresignRefreshEvery (on a miss, so a URL of a
// sandbox created on another replica a moment ago works) and from every
// sandbox this replica creates or routes to. What a signature that matches
// nothing costs is one hash per running sandbox in memory, and those
// searches are rate limited per replica (PresignSearchRate): past it a
// request is told to retry (429) rather than cost more. A URL that matched
// is remembered (by its signature), so using it again costs one map read.
const (
	PresignRefreshEvery = 250 * time.Millisecond
	PresignSearchRate   = 100 // searches a second, per replica
	presignSearchBurst  = 200
	presignKnownMax     = 4096 // URLs remembered
)

type presignIndex struct {
	mu     sync.RWMutex
	tokens map[string]string // running sandbox ID → envd access token
	known  map[string]string // signature that matched → sandbox ID
	loaded time.Time         // when the last refresh began (zero: never)
	sf     singleflight.Group
	limit  *rate.Limiter
}

func newPresignIndex(perSecond float64) *presignIndex {
	lim := rate.NewLimiter(PresignSearchRate, presignSearchBurst)
	switch {
	case perSecond < 0:
		lim = rate.NewLimiter(rate.Inf, 0)
	case perSecond > 0:
		lim = rate.NewLimiter(rate.Limit(perSecond), max(1, int(2*perSecond)))
	}
	return &presignIndex{tokens: map[string]string{}, known: map[string]string{}, limit: lim}
}

// note records a running sandbox's token (a create, a route, a resume).
func (x *presignIndex) note(id, token string) {
	if token == "" {
		return
	}
	x.mu.Lock()
	x.tokens[id] = token
	x.mu.Unlock()
}

// forget drops a sandbox that is gone or no longer running.
func (x *presignIndex) forget(id string) {
	x.mu.Lock()
	delete(x.tokens, id)
	for sig, sid := range x.known {
		if sid == id {
			delete(x.known, sig)
		}
	}
	x.mu.Unlock()
}

// presignRaw is what a v1 signature hashes: path:op:user:token[:exp]
// (envd's check and the SDKs' signing), built into buf.
func presignRaw(buf []byte, path, op, user, token, exp string) []byte {
	buf = append(append(append(append(append(append(append(buf[:0], path...), ':'), op...), ':'), user...), ':'), token...)
	if exp != "" {
		buf = append(append(buf, ':'), exp...)
	}
	return buf
}

// decodeSignature returns the SHA-256 a v1_ signature carries (base64,
// padding stripped), or false for anything else.
func decodeSignature(sig string) ([]byte, bool) {
	b64, ok := strings.CutPrefix(sig, "v1_")
	if !ok {
		return nil, false
	}
	sum, err := base64.RawStdEncoding.DecodeString(b64)
	return sum, err == nil && len(sum) == sha256.Size
}

// signedWith reports whether want is the signature of the URL's fields
// with token.
func signedWith(buf []byte, want []byte, path, op, user, token, exp string) bool {
	sum := sha256.Sum256(presignRaw(buf, path, op, user, token, exp))
	return subtle.ConstantTimeCompare(sum[:], want) == 1
}

// SignedBy finds the running sandbox whose access token signed a
// presigned /files URL (v1_ signatures, as envd verifies them; see the
// comment above presignIndex): ErrNotFound when none did or the URL
// expired, ErrResourceLimit when this replica searches too much already,
// the context's error when the request went.
func (s *Service) SignedBy(ctx context.Context, q url.Values, op string) (string, error) {
	sig := q.Get("signature")
	want, ok := decodeSignature(sig)
	if !ok {
		return "", errdefs.NotFoundf("the signature matches no sandbox")
	}
	exp := q.Get("signature_expiration")
	if exp != "" {
		n, err := strconv.ParseInt(exp, 10, 64)
		if err != nil || s.cfg.Now().Unix() > n {
			return "", errdefs.NotFoundf("the signature expired")
		}
	}
	x := s.presign
	path, user := q.Get("path"), q.Get("username")
	buf := make([]byte, 0, 256)
	x.mu.RLock()
	id, ok := x.known[sig]
	token := x.tokens[id]
	x.mu.RUnlock()
	if ok && signedWith(buf, want, path, op, user, token, exp) {
		return id, nil
	}
	if !x.limit.Allow() {
		return "", fmt.Errorf("%w: too many presigned URL checks on this server: retry in a second", errdefs.ErrResourceLimit)
	}
	if id, err := x.search(ctx, buf, want, sig, path, op, user, exp); err == nil || !errdefs.IsNotFound(err) {
		return id, err
	}
	// Not among the sandboxes known here: perhaps made on another
	// replica since the last refresh.
	if err := s.refreshPresign(ctx); err != nil {
		return "", err
	}
	return x.search(ctx, buf, want, sig, path, op, user, exp)
}

// search hashes the URL with each known token (one SHA-256 of about 100
// bytes each, no allocation), stopping when the request goes.
func (x *presignIndex) search(ctx context.Context, buf, want []byte, sig, path, op, user, exp string) (string, error) {
	x.mu.RLock()
	found, n := "", 0
	for id, token := range x.tokens {
		if n++; n%256 == 0 && ctx.Err() != nil {
			break
		}
		if signedWith(buf, want, path, op, user, token, exp) {
			found = id
			break
		}
	}
	x.mu.RUnlock()
	if err := ctx.Err(); err != nil && found == "" {
		return "", err
	}
	if found == "" {
		return "", errdefs.NotFoundf("the signature matches no sandbox")
	}
	x.mu.Lock()
	if len(x.known) >= presignKnownMax {
		clear(x.known)
	}
	x.known[sig] = found
	x.mu.Unlock()
	return found, nil
}

// refreshPresign reloads the running sandboxes' tokens from the store,
// unless a refresh began less than PresignRefreshEvery ago; concurrent
// callers share one.
func (s *Service) refreshPresign(ctx context.Context) error {
	x := s.presign
	x.mu.RLock()
	recent := !x.loaded.IsZero() && s.cfg.Now().Sub(x.loaded) < PresignRefreshEvery
	x.mu.RUnlock()
	if recent {
		return nil
	}
	ch := x.sf.DoChan("refresh", func() (any, error) {
		start := s.cfg.Now()
		rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 10*time.Second)
		defer cancel()
		tokens := map[string]string{}
		cursor := ""
		for {
			page, next, err := s.st.ListSandboxes(rctx, store.SandboxFilter{States: []string{store.StateRunning}, Limit: 1000, Cursor: cursor})
			if err != nil {
				s.log.Warn("presigned URLs: list running sandboxes", "err", err)
				return nil, err
			}
			for _, rec := range page {
				if rec.EnvdAccessToken != "" {
					tokens[rec.ID] = rec.EnvdAccessToken
				}
			}
			if next == "" {
				break
			}
			cursor = next
		}
		x.mu.Lock()
		x.tokens, x.loaded = tokens, start
		x.mu.Unlock()
		return nil, nil
	})
	select {
	case r := <-ch:
		if r.Err != nil {
			return fmt.Errorf("%w: presigned URL check: %w", errdefs.ErrUnavailable, r.Err)
		}
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

package control

import (
	"context"
	"crypto/hmac"
	"crypto/sha256"
	"crypto/subtle"
	"encoding/base64"
	"encoding/hex"
	"net/netip"
	"net/url"
	"strconv"
	"strings"
	"time"

	"github.com/spore-run/spore/internal/store"
)

// Lookup tells the proxy where a sandbox's traffic goes; gone is closed
// when that instance goes away.
func (s *Service) Lookup(id string) (addr netip.Addr, running, found bool, gone <-chan struct{}) {
	t, ok := s.Target(id)
	if !ok {
		return netip.Addr{}, false, false, nil
	}
	return t.Addr, t.State == store.StateRunning && t.Addr.IsValid(), true, t.Gone
}

// SignedBy finds the running sandbox whose access token signed a
// presigned /files URL (v1_ signatures, as envd verifies them).
func (s *Service) SignedBy(q url.Values, op string) (string, bool) {
	sig := q.Get("signature")
	if !strings.HasPrefix(sig, "v1_") {
		return "", false
	}
	exp := q.Get("signature_expiration")
	if exp != "" {
		n, err := strconv.ParseInt(exp, 10, 64)
		if err != nil || time.Now().Unix() > n {
			return "", false
		}
	}
	s.mu.RLock()
	var running []string
	for id, t := range s.targets {
		if t.State == store.StateRunning {
			running = append(running, id)
		}
	}
	s.mu.RUnlock()
	for _, id := range running {
		es, err := s.eng.Get(context.Background(), id)
		if err != nil || es.Run.AccessToken == "" {
			continue
		}
		raw := q.Get("path") + ":" + op + ":" + q.Get("username") + ":" + es.Run.AccessToken
		if exp != "" {
			raw += ":" + exp
		}
		sum := sha256.Sum256([]byte(raw))
		want := "v1_" + strings.TrimRight(base64.StdEncoding.EncodeToString(sum[:]), "=")
		if subtle.ConstantTimeCompare([]byte(sig), []byte(want)) == 1 {
			return id, true
		}
	}
	return "", false
}

// TrafficToken is a sandbox's traffic access token, derived from its envd
// access token. The API returns it as E2B's trafficAccessToken; the stock
// code-interpreter SDK sends it (E2B-Traffic-Access-Token) on the calls
// that carry no X-Access-Token (the /contexts routes). It opens the code
// interpreter and nothing else, and it is never the envd token itself.
func TrafficToken(accessToken string) string {
	if accessToken == "" {
		return ""
	}
	m := hmac.New(sha256.New, []byte(accessToken))
	m.Write([]byte("spore traffic access token v1"))
	return "tt_" + hex.EncodeToString(m.Sum(nil)[:20])
}

// TrafficAllowed checks a traffic access token for a sandbox and returns
// the sandbox's envd access token, which the proxy then presents to the
// code interpreter on the client's behalf.
func (s *Service) TrafficAllowed(ctx context.Context, id, trafficToken string) (string, bool) {
	if trafficToken == "" {
		return "", false
	}
	es, err := s.eng.Get(ctx, id)
	if err != nil || es.Run.AccessToken == "" {
		return "", false
	}
	want := TrafficToken(es.Run.AccessToken)
	if subtle.ConstantTimeCompare([]byte(trafficToken), []byte(want)) != 1 {
		return "", false
	}
	return es.Run.AccessToken, true
}

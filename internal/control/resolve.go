package control

import (
	"context"
	"crypto/hmac"
	"crypto/sha256"
	"crypto/subtle"
	"encoding/hex"
	"maps"
	"net/netip"
	"time"

	"github.com/spore-run/spore/internal/errdefs"
	"github.com/spore-run/spore/internal/store"
)

// Lookup tells the proxy where a sandbox's traffic goes, from the
// sandbox's store row; gone is closed when that instance goes away (as
// seen by this process: its own operations and its nodes' events).
func (s *Service) Lookup(id string) (addr netip.Addr, running, found bool, gone <-chan struct{}) {
	_, addr, running, found, gone = s.LookupVia(id)
	return addr, running, found, gone
}

// LookupVia is Lookup plus, for a sandbox on a node this process does not
// reach directly, the address of that node's proxy (Config.Hop), which
// forwards to addr on the node.
func (s *Service) LookupVia(id string) (via string, addr netip.Addr, running, found bool, gone <-chan struct{}) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	rec, err := s.st.GetSandbox(ctx, id)
	if err != nil && !errdefs.IsNotFound(err) {
		// The proxy answers as for a sandbox it cannot find (502, which
		// the SDKs read as "not running"): the log keeps why.
		s.log.Warn("proxy: read the sandbox's row", "sandbox_id", id, "err", err)
	}
	if err != nil || (rec.State != store.StateRunning && rec.State != store.StatePaused) {
		// Being created, hibernated (no instance) or dead: nothing to
		// reach. A target this process kept for a sandbox that is gone,
		// hibernated or dead (killed or hibernated through another
		// replica, which this one did not see) is dropped: its streams end.
		if errdefs.IsNotFound(err) || rec.State == store.StateHibernated || rec.State == store.StateError {
			s.dropTarget(id)
		}
		return "", netip.Addr{}, false, false, nil
	}
	s.noteGate(id, gate{private: rec.PrivateTraffic, accessToken: rec.EnvdAccessToken})
	if rec.State != store.StateRunning || rec.Addr == "" {
		if rec.State == store.StateRunning {
			s.log.Warn("proxy: a running sandbox's row has no address", "sandbox_id", id, "node_id", rec.NodeID)
		}
		return "", netip.Addr{}, false, true, nil
	}
	if s.cfg.Hop != nil {
		if via = s.cfg.Hop(rec.NodeID); via == "" {
			// A node the fleet does not know (yet): nothing reaches it.
			// (Logged: the proxy answers as for a paused sandbox, and
			// flaky-cross-node-resume-502 is a refusal of that kind.)
			s.log.Warn("proxy: the sandbox's node is not in this replica's registry", "sandbox_id", id, "node_id", rec.NodeID)
			return "", netip.Addr{}, false, true, nil
		}
	}
	t := s.target(id, rec.Addr, rec.State)
	if !t.Addr.IsValid() {
		s.log.Warn("proxy: a running sandbox's row has a malformed address", "sandbox_id", id, "node_id", rec.NodeID, "addr", rec.Addr)
	}
	return via, t.Addr, t.Addr.IsValid(), true, t.Gone
}

// target returns the sandbox's target for addr, replacing (and closing)
// one for another address.
func (s *Service) target(id, addr, state string) Target {
	a, _ := netip.ParseAddr(addr)
	s.mu.RLock()
	t, ok := s.targets[id]
	s.mu.RUnlock()
	if ok && t.Addr == a {
		return t
	}
	s.setTarget(id, addr, state)
	t, _ = s.Target(id)
	return t
}

// PruneTargets drops the proxy targets whose sandbox is no longer where
// this process routed it: its row is gone (killed), or neither running nor
// paused (hibernated, dead), or names another address; their Gone channels
// close, so the streams through them end. A replica closes Gone on its own
// operations and its nodes' death events only: before, a sandbox killed
// through another replica kept its entry, and a hop stream to it, for the
// life of the process. RunReconcile prunes every period, and a lookup
// that finds the row gone drops its target at once. It reads the rows of
// running and paused sandboxes page by page and reports how many targets
// it dropped (TestTargetsPrunedAfterAKillThroughAnotherReplica).
func (s *Service) PruneTargets(ctx context.Context) (int, error) {
	// Only the targets set before the rows are read are judged, and each
	// only if it is still the same one then: one set meanwhile (a create
	// or resume that committed after the read) is newer than the rows.
	s.mu.RLock()
	before := maps.Clone(s.targets)
	s.mu.RUnlock()
	if len(before) == 0 {
		return 0, nil
	}
	live := map[string]netip.Addr{}
	for cursor := ""; ; {
		page, next, err := s.st.ListSandboxes(ctx, store.SandboxFilter{States: []string{store.StateRunning, store.StatePaused}, Limit: 1000, Cursor: cursor})
		if err != nil {
			return 0, err
		}
		for _, rec := range page {
			if _, ok := before[rec.ID]; ok {
				live[rec.ID], _ = netip.ParseAddr(rec.Addr)
			}
		}
		if next == "" {
			break
		}
		cursor = next
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	dropped := 0
	for id, t := range before {
		if addr, ok := live[id]; ok && addr == t.Addr {
			continue
		}
		if cur, ok := s.targets[id]; ok && cur.Gone == t.Gone {
			close(cur.Gone)
			delete(s.targets, id)
			delete(s.gates, id)
			dropped++
		}
	}
	return dropped, nil
}

// Wake resumes a paused or hibernated sandbox that was created with
// autoResume, for the proxy, which got traffic for it: woken says it now
// runs (for a timeout as long as the one it was started with). Any other
// sandbox is left alone (woken false, no error).
func (s *Service) Wake(ctx context.Context, id string) (woken bool, err error) {
	rec, err := s.st.GetSandbox(ctx, id)
	if err != nil || !rec.AutoResume || (rec.State != store.StatePaused && rec.State != store.StateHibernated) {
		return false, nil
	}
	timeout := rec.EndAt.Sub(rec.StartedAt)
	if timeout <= 0 {
		timeout = DefaultTimeout
	}
	if _, _, err := s.Connect(ctx, id, timeout); err != nil {
		return false, err
	}
	s.log.Info("sandbox resumed by traffic (autoResume)", "sandbox_id", id)
	return true, nil
}

// PrivateTraffic says whether a sandbox's ports take only requests that
// carry its traffic access token (created with E2B's allowPublicTraffic
// false). A row that cannot be read counts as private: the proxy then
// asks for the token rather than let a request through.
func (s *Service) PrivateTraffic(ctx context.Context, id string) bool {
	if g, ok := s.gateOf(id); ok {
		return g.private
	}
	rec, err := s.st.GetSandbox(ctx, id)
	return err != nil || rec.PrivateTraffic
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
	if g, ok := s.gateOf(id); ok && g.accessToken != "" {
		return g.accessToken, subtle.ConstantTimeCompare([]byte(trafficToken), []byte(TrafficToken(g.accessToken))) == 1
	}
	rec, err := s.st.GetSandbox(ctx, id)
	if err != nil || rec.EnvdAccessToken == "" || rec.State == store.StateCreating || rec.State == store.StatePooled {
		return "", false
	}
	want := TrafficToken(rec.EnvdAccessToken)
	if subtle.ConstantTimeCompare([]byte(trafficToken), []byte(want)) != 1 {
		return "", false
	}
	return rec.EnvdAccessToken, true
}

// gate is what the proxy checks a request against, beyond where the
// sandbox is: both are fixed for a sandbox's life (its envd token, and
// allowPublicTraffic, which a network update cannot change), so what the
// proxy's lookup read serves the checks of the same request and the next
// ones without reading the row again.
type gate struct {
	private     bool
	accessToken string
}

func (s *Service) noteGate(id string, g gate) {
	s.presign.note(id, g.accessToken)
	s.mu.Lock()
	defer s.mu.Unlock()
	if len(s.gates) >= maxGates {
		clear(s.gates) // bounded: the next requests read their rows again
	}
	s.gates[id] = g
}

func (s *Service) gateOf(id string) (gate, bool) {
	s.mu.RLock()
	defer s.mu.RUnlock()
	g, ok := s.gates[id]
	return g, ok
}

// maxGates bounds the remembered gates (one per sandbox routed to).
const maxGates = 1 << 16

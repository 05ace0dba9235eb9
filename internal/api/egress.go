package api

import (
	"net/http"
	"strconv"
	"time"

	"github.com/spore-run/spore/internal/control"
)

// EgressEntry is one outbound connection attempt of a sandbox (GET
// /sandboxes/{id}/egress).
type EgressEntry struct {
	At       string `json:"at"`            // RFC 3339: the attempt, or the connection's start
	End      string `json:"end,omitempty"` // when an allowed connection ended
	Proto    string `json:"proto"`         // tcp, udp, icmp, ...
	Dst      string `json:"dst"`           // address:port
	Domain   string `json:"domain,omitempty"`
	Allowed  bool   `json:"allowed"`
	Rule     string `json:"rule,omitempty"`
	Reason   string `json:"reason,omitempty"`
	BytesOut int64  `json:"bytesOut"`
	BytesIn  int64  `json:"bytesIn"`
	Open     bool   `json:"open,omitempty"`
}

// EgressAudit is the answer of GET /sandboxes/{id}/egress. Complete is
// false when a node could not be asked (its entries are missing).
type EgressAudit struct {
	SandboxID string        `json:"sandboxID"`
	Complete  bool          `json:"complete"`
	Entries   []EgressEntry `json:"entries"`
}

// egressAudit serves GET /sandboxes/{id}/egress?since=&limit=: the
// sandbox's outbound connection attempts, allowed and denied, kept after
// it is gone for the nodes' retention. since is RFC 3339 or a duration
// back from now ("15m"); limit at most control.MaxEgressAudit.
func (s *Server) egressAudit(w http.ResponseWriter, r *http.Request) {
	id, ok := s.sandboxID(w, r)
	if !ok {
		return
	}
	q := r.URL.Query()
	var since time.Time
	if v := q.Get("since"); v != "" {
		if t, err := time.Parse(time.RFC3339Nano, v); err == nil {
			since = t
		} else if d, derr := time.ParseDuration(v); derr == nil && d > 0 {
			since = time.Now().Add(-d)
		} else {
			writeError(w, http.StatusBadRequest, "since: want an RFC 3339 time or a positive duration (15m), got "+strconv.Quote(v))
			return
		}
	}
	limit := 0
	if v := q.Get("limit"); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil || n < 1 || n > control.MaxEgressAudit {
			writeError(w, http.StatusBadRequest, "limit: want 1 to "+strconv.Itoa(control.MaxEgressAudit)+", got "+strconv.Quote(v))
			return
		}
		limit = n
	}
	es, complete, err := s.c.EgressAudit(r.Context(), id, since, limit)
	if err != nil {
		s.fail(w, r, err)
		return
	}
	out := EgressAudit{SandboxID: id, Complete: complete, Entries: make([]EgressEntry, len(es))}
	for i, e := range es {
		out.Entries[i] = EgressEntry{At: rfc3339(e.At), Proto: e.Proto, Dst: e.Dst, Domain: e.Domain, Allowed: e.Allowed,
			Rule: e.Rule, Reason: e.Reason, BytesOut: e.BytesOut, BytesIn: e.BytesIn, Open: e.Open}
		if e.End != nil {
			out.Entries[i].End = rfc3339(*e.End)
		}
	}
	writeJSON(w, http.StatusOK, out)
}

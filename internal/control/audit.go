package control

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/spore-run/spore/internal/audit"
	"github.com/spore-run/spore/internal/store"
)

// The audit trail's sandbox events (docs/teams.md): what happened to a
// sandbox, whoever caused it (a call, the reaper, a death, a drain),
// recorded through Config.Audit.

// event records a lifecycle event of rec.
func (s *Service) event(rec store.Sandbox, action, detail string) {
	audit.Record(s.cfg.Audit, store.AuditRecord{TeamID: rec.TeamID, Kind: store.AuditSandbox, Action: action, Resource: rec.ID, Detail: detail})
}

// egressSummary records, after a sandbox ended, what its egress audit
// holds: connections allowed and denied, bytes, and the destinations
// most often denied and used. In the background, within CleanupTimeout.
func (s *Service) egressSummary(rec store.Sandbox) {
	if s.cfg.Audit == nil {
		return
	}
	s.inBackgroundCleanup(func(ctx context.Context) {
		es, complete, err := s.EgressAudit(ctx, rec.ID, time.Time{}, 0)
		if err != nil || len(es) == 0 {
			return // nothing recorded (or out of reach): no summary
		}
		var allowed, denied int
		var in, out int64
		used, refused := map[string]int{}, map[string]int{}
		for _, e := range es {
			dst := e.Domain
			if dst == "" {
				dst = e.Dst
			}
			if e.Allowed {
				allowed++
				used[dst]++
			} else {
				denied++
				refused[dst]++
			}
			in, out = in+e.BytesIn, out+e.BytesOut
		}
		d := fmt.Sprintf("%d connections allowed, %d denied; %d bytes out, %d in; used: %s; denied: %s",
			allowed, denied, out, in, top(used, 5), top(refused, 5))
		if !complete {
			d += " (partial: a node was out of reach)"
		}
		audit.Record(s.cfg.Audit, store.AuditRecord{TeamID: rec.TeamID, Kind: store.AuditEgress, Action: "egress.summary", Resource: rec.ID, Detail: d})
	})
}

// top is counts' n largest, "name (count)", most first.
func top(counts map[string]int, n int) string {
	if len(counts) == 0 {
		return "-"
	}
	names := make([]string, 0, len(counts))
	for k := range counts {
		names = append(names, k)
	}
	slices.SortFunc(names, func(a, b string) int {
		if counts[a] != counts[b] {
			return counts[b] - counts[a]
		}
		return strings.Compare(a, b)
	})
	var parts []string
	for _, k := range names[:min(n, len(names))] {
		parts = append(parts, fmt.Sprintf("%s (%d)", k, counts[k]))
	}
	return strings.Join(parts, ", ")
}

package node

import (
	"context"
	"log/slog"
	"net/netip"
	"sync"
	"time"

	"github.com/spore-run/spore/internal/egress"
	"github.com/spore-run/spore/internal/engine"
	"github.com/spore-run/spore/internal/netaudit"
	"github.com/spore-run/spore/internal/netns"
)

// auditor feeds the egress audit journal: a collector per gateway
// namespace (netns.Auditor), and the egress proxy's records.
type auditor struct {
	j   *netaudit.Journal
	log *slog.Logger

	mu     sync.Mutex
	owners map[string]string // instance -> sandbox, while its collector runs
}

// sandboxOf is the sandbox whose journal an instance's traffic goes to:
// the owner its network was claimed for (a pre-created instance), else
// the one its name says.
func (a *auditor) sandboxOf(instance string) string {
	a.mu.Lock()
	defer a.mu.Unlock()
	if o, ok := a.owners[instance]; ok {
		return o
	}
	return engine.SandboxOf(instance)
}

// Start implements netns.Auditor.
func (a *auditor) Start(instance, owner string, gwFD int) (func(final bool), error) {
	if owner == "" {
		owner = engine.SandboxOf(instance)
	}
	c, err := netaudit.Start(a.j, owner, gwFD,
		[]netip.Addr{netns.SandboxIP, netns.SandboxIP6}, []netip.Addr{netns.GatewayIP, netns.GatewayIP6}, a.log)
	if err != nil {
		return nil, err
	}
	a.mu.Lock()
	if a.owners == nil {
		a.owners = map[string]string{}
	}
	a.owners[instance] = owner
	a.mu.Unlock()
	return func(final bool) {
		c.Stop(final)
		a.mu.Lock()
		if a.owners[instance] == owner {
			delete(a.owners, instance)
		}
		a.mu.Unlock()
	}, nil
}

// proxied records a connection the egress proxy judged.
func (a *auditor) proxied(instance string, r egress.Record) {
	e := netaudit.Entry{At: r.At, Proto: "tcp", Dst: r.Dst.String(), Domain: r.Domain, Allowed: r.Allowed,
		Rule: r.Rule, Reason: r.Reason, BytesOut: r.BytesOut, BytesIn: r.BytesIn}
	if r.Allowed {
		end := time.Now().UTC()
		e.End = &end
	}
	if err := a.j.Append(a.sandboxOf(instance), e); err != nil {
		a.log.Warn("egress audit: journal", "instance", instance, "err", err)
	}
}

// EgressAudit returns a sandbox's outbound connection attempts at or
// after since (oldest first, at most limit; see netaudit.Journal.Query),
// whether the sandbox still exists or not (its journal outlives it by the
// retention).
func (n *Node) EgressAudit(_ context.Context, sandboxID string, since time.Time, limit int) ([]netaudit.Entry, error) {
	return n.Audit.Query(sandboxID, since, limit)
}

// auditSweepEvery is how often expired egress journals are deleted.
const auditSweepEvery = time.Hour

// sweepAudit deletes the egress journals past their retention, at once
// and then every auditSweepEvery, until stop closes.
func (n *Node) sweepAudit(stop <-chan struct{}) {
	t := time.NewTicker(auditSweepEvery)
	defer t.Stop()
	for {
		if k, err := n.Audit.Sweep(); err != nil {
			n.log.Warn("egress audit: sweep", "err", err)
		} else if k > 0 {
			n.log.Info("egress audit: expired journals deleted", "count", k, "retention", n.Audit.Retention())
		}
		select {
		case <-stop:
			return
		case <-t.C:
		}
	}
}

// EgressTotals are the node's egress proxy connections since it started
// (false without an egress proxy).
func (n *Node) EgressTotals() (egress.Totals, bool) {
	if n.egress == nil {
		return egress.Totals{}, false
	}
	return n.egress.Totals(), true
}

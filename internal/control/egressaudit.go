package control

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"time"

	"github.com/spore-run/spore/internal/errdefs"
	"github.com/spore-run/spore/internal/ids"
	"github.com/spore-run/spore/internal/nodeapi"
	"github.com/spore-run/spore/internal/store"
)

// MaxEgressAudit bounds the entries one EgressAudit returns.
const MaxEgressAudit = 10000

// EgressAudit returns a sandbox's outbound connection attempts, oldest
// first, at or after since, at most limit (<= 0 or over MaxEgressAudit:
// MaxEgressAudit; the newest when there are more). Every node is asked
// (a sandbox may have run on several: moved, resumed elsewhere; and once
// killed its row is gone, but its nodes keep its journal for their
// retention). A node that cannot be asked makes the answer partial:
// complete says so. Nothing recorded anywhere is ErrNotFound.
func (s *Service) EgressAudit(ctx context.Context, id string, since time.Time, limit int) (entries []nodeapi.EgressEntry, complete bool, err error) {
	if err := ids.Validate("sandbox ID", id); err != nil {
		return nil, false, err
	}
	if limit <= 0 || limit > MaxEgressAudit {
		limit = MaxEgressAudit
	}
	var (
		mu     sync.Mutex
		wg     sync.WaitGroup
		failed []error
		found  bool
	)
	for _, nodeID := range s.nodes.IDs() {
		n, ok := s.nodes.Node(nodeID)
		if !ok {
			continue
		}
		if nr, err := s.st.GetNode(ctx, nodeID); err == nil && nr.State == store.NodeLost {
			// Not asked (it would only time out): its journal is out
			// of reach, so the answer is partial. Under mu: the
			// goroutines of the nodes before it append to failed too
			// (without it, a data race: TestEgressAuditLostNodeRace).
			mu.Lock()
			failed = append(failed, fmt.Errorf("node %s is lost", nodeID))
			mu.Unlock()
			continue
		}
		wg.Go(func() {
			es, err := n.EgressAudit(ctx, id, since, limit)
			mu.Lock()
			defer mu.Unlock()
			switch {
			case err == nil:
				found = true
				entries = append(entries, es...)
			case errdefs.IsNotFound(err), errdefs.IsConflict(err):
				// nothing here, or a node that does not audit
			case errdefs.IsInvalidArgument(err):
				failed = append(failed, err)
			default:
				failed = append(failed, fmt.Errorf("node %s: %w", nodeID, err))
			}
		})
	}
	wg.Wait()
	for _, err := range failed {
		if errdefs.IsInvalidArgument(err) {
			return nil, false, err
		}
	}
	if !found {
		if len(failed) > 0 {
			return nil, false, fmt.Errorf("%w: egress audit of %s: %w", errdefs.ErrUnavailable, id, errors.Join(failed...))
		}
		return nil, false, errdefs.NotFoundf("no egress audit recorded for sandbox %s", id)
	}
	if len(failed) > 0 {
		s.log.Warn("egress audit: some nodes could not be asked; the answer is partial", "sandbox_id", id, "err", errors.Join(failed...))
	}
	slices.SortStableFunc(entries, func(a, b nodeapi.EgressEntry) int { return a.At.Compare(b.At) })
	if len(entries) > limit {
		entries = entries[len(entries)-limit:]
	}
	return entries, len(failed) == 0, nil
}

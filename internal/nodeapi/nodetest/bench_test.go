package nodetest_test

import (
	"context"
	"slices"
	"testing"
	"time"

	"github.com/spore-run/spore/internal/control/controltest"
	"github.com/spore-run/spore/internal/ids"
	"github.com/spore-run/spore/internal/nodeapi"
)

// The cost of the Connect-RPC hop: the same operations on the same node
// (engine over the fake runtime) called in process and through a client,
// an h2c listener on loopback and the handler. The p50 difference is what
// the hop adds (goal: at most 3 ms). Fork, rollback, snapshot and
// pause/resume are here too: their fleet figures in `spore bench` move by
// tens of ms between runs on this 2-core host (the runtime's own spread),
// so the hop itself is measured here, with the runtime's time taken out.
//
//	go test -run '^$' -bench 'BenchmarkHop' -benchtime 2000x ./internal/nodeapi/nodetest/

// rollbackSnap is the snapshot the Rollback case returns to.
const rollbackSnap = "s-bench-rollback"

func BenchmarkHop(b *testing.B) {
	for _, op := range []struct {
		name string
		fn   func(ctx context.Context, n nodeapi.Node, sb nodeapi.Sandbox) error
	}{
		{"Get", func(ctx context.Context, n nodeapi.Node, sb nodeapi.Sandbox) error {
			_, err := n.Get(ctx, sb.ID)
			return err
		}},
		{"CreateKill", func(ctx context.Context, n nodeapi.Node, _ nodeapi.Sandbox) error {
			sb, err := n.Create(ctx, nodeapi.CreateRequest{SandboxID: ids.New('i'), AccessToken: ids.New('t'), Template: controltest.Templates[0]})
			if err != nil {
				return err
			}
			return n.Kill(ctx, sb.ID)
		}},
		{"SnapshotDelete", func(ctx context.Context, n nodeapi.Node, sb nodeapi.Sandbox) error {
			snap := ids.New('s')
			if _, err := n.Snapshot(ctx, sb.ID, nodeapi.SnapshotRequest{SnapshotID: snap}); err != nil {
				return err
			}
			return n.DeleteSnapshot(ctx, snap)
		}},
		{"ForkKill", func(ctx context.Context, n nodeapi.Node, sb nodeapi.Sandbox) error {
			child := ids.New('i')
			fr, err := n.Fork(ctx, sb.ID, nodeapi.ForkRequest{Children: []nodeapi.ForkChildSpec{{SandboxID: child, AccessToken: ids.New('t')}}})
			if err != nil {
				return err
			}
			if err := fr.Children[0].Err; err != nil {
				return err
			}
			return n.Kill(ctx, child)
		}},
		{"Rollback", func(ctx context.Context, n nodeapi.Node, sb nodeapi.Sandbox) error {
			_, err := n.Rollback(ctx, sb.ID, rollbackSnap)
			return err
		}},
		{"PauseResume", func(ctx context.Context, n nodeapi.Node, sb nodeapi.Sandbox) error {
			if err := n.Pause(ctx, sb.ID); err != nil {
				return err
			}
			_, err := n.Resume(ctx, sb.ID)
			return err
		}},
	} {
		// Local and remote calls alternate on one node, so a change of
		// the host's load (other tests, other helpers) hits both alike.
		b.Run(op.name, func(b *testing.B) {
			fn := controltest.New(b)
			nodes := []nodeapi.Node{fn.Local, controltest.Remote(b, fn.Local)}
			ctx := context.Background()
			sb, err := fn.Local.Create(ctx, nodeapi.CreateRequest{SandboxID: ids.New('i'), AccessToken: ids.New('t'), Template: controltest.Templates[0]})
			if err != nil {
				b.Fatal(err)
			}
			if _, err := fn.Local.Snapshot(ctx, sb.ID, nodeapi.SnapshotRequest{SnapshotID: rollbackSnap}); err != nil {
				b.Fatal(err)
			}
			for range 20 { // warm the connection and the engine
				for _, n := range nodes {
					if err := op.fn(ctx, n, sb); err != nil {
						b.Fatal(err)
					}
				}
			}
			took := [2][]time.Duration{}
			b.ResetTimer()
			for i := range b.N {
				for j := range nodes {
					k := (i + j) % 2 // alternate which goes first
					start := time.Now()
					if err := op.fn(ctx, nodes[k], sb); err != nil {
						b.Fatal(err)
					}
					took[k] = append(took[k], time.Since(start))
				}
			}
			b.StopTimer()
			p50 := func(d []time.Duration) float64 {
				slices.Sort(d)
				return float64(d[len(d)/2].Microseconds())
			}
			l, r := p50(took[0]), p50(took[1])
			b.ReportMetric(l, "local-p50-µs")
			b.ReportMetric(r, "rpc-p50-µs")
			b.ReportMetric(r-l, "hop-p50-µs")
		})
	}
}

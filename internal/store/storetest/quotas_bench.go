package storetest

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/spore-run/spore/internal/store"
)

// BenchQuotas is what the quota check adds to a sandbox's writes, on the
// store s returns: a create (and its row's removal) for a team without
// quotas and for one with them (every quota set, never reached), with
// 100 running sandboxes of the team beside it; and an everyday
// compare-and-swap (a timeout extended: no growth) of a team with
// quotas. Run by each store's BenchmarkQuotas.
func BenchQuotas(b *testing.B, s store.Store) {
	ctx := context.Background()
	for _, tm := range []store.Team{
		{ID: "tfree", Name: "free"},
		{ID: "tlimited", Name: "limited", Quotas: store.Quotas{Sandboxes: 1 << 20, VCPUs: 1 << 20, MemoryMB: 1 << 40, CreatesPerMinute: 1 << 30}},
	} {
		if err := s.CreateTeam(ctx, tm); err != nil {
			b.Fatal(err)
		}
		for i := range 100 {
			if err := s.CreateSandbox(ctx, quotaBox(fmt.Sprintf("%s-%d", tm.ID, i), tm.ID, 2, 512)); err != nil {
				b.Fatal(err)
			}
		}
		b.Run("create/"+tm.Name, func(b *testing.B) {
			for i := range b.N {
				id := fmt.Sprintf("%s-new-%d", tm.ID, i)
				if err := s.CreateSandbox(ctx, quotaBox(id, tm.ID, 2, 512)); err != nil {
					b.Fatal(err)
				}
				b.StopTimer()
				if err := s.DeleteSandbox(ctx, id); err != nil {
					b.Fatal(err)
				}
				b.StartTimer()
			}
		})
	}
	b.Run("swap-no-growth/limited", func(b *testing.B) {
		cur, err := s.GetSandbox(ctx, "tlimited-0")
		if err != nil {
			b.Fatal(err)
		}
		for range b.N {
			cur.EndAt = cur.EndAt.Add(time.Second)
			if cur, err = s.CompareAndSwapSandbox(ctx, cur); err != nil {
				b.Fatal(err)
			}
		}
	})
}

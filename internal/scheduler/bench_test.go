package scheduler_test

import (
	"fmt"
	"math/rand/v2"
	"testing"

	"github.com/spore-run/spore/internal/scheduler"
)

// benchOrigin is the fork source's node in benchFleet: it has room for 4
// more sandboxes (slots), so a fork fills it and spills the rest.
const benchOrigin = 7

// benchFleet is 1,000 nodes of mixed sizes carrying 100,000 sandboxes,
// with some draining or lost, three zones, two runsc builds, a template
// cached on most nodes and a snapshot on a few (and on the origin). vCPUs
// are overcommitted 4 to 1 (the node's ratio, not its figure). A fixed seed:
// the numbers compare across runs.
func benchFleet() scheduler.View {
	const nodes, sandboxes = 1000, 100_000
	r := rand.New(rand.NewPCG(1, 2))
	v := scheduler.View{Nodes: make([]scheduler.NodeView, nodes)}
	for i := range v.Nodes {
		big := i%4 == 0
		capMem, capCPU, slots := int64(131072), 32.0, 250
		if big {
			capMem, capCPU, slots = 524288, 128.0, 500
		}
		cached := map[string]bool{"base": r.IntN(10) < 8, "code-interpreter-v1": r.IntN(2) == 0}
		if r.IntN(100) == 0 {
			cached["snap-hot"] = true
		}
		v.Nodes[i] = scheduler.NodeView{
			ID:          fmt.Sprintf("node-%04d", i),
			Labels:      map[string]string{"zone": []string{"a", "b", "c"}[i%3], "pool": "general"},
			Capacity:    scheduler.Resources{MemoryMB: capMem, VCPUs: capCPU, Sandboxes: slots},
			Reserved:    scheduler.Resources{MemoryMB: 4096},
			Overcommit:  scheduler.Overcommit{Memory: 1, VCPUs: 4},
			Draining:    r.IntN(20) == 0,
			Lost:        r.IntN(100) == 0,
			RunscBuild:  []string{"release-20250601.0", "release-20250701.0"}[r.IntN(2)],
			CPUFeatures: []string{"sse4_2", "avx", "avx2", "avx512f", "aes", "pclmulqdq"},
			Cached:      cached,
		}
	}
	o := &v.Nodes[benchOrigin]
	o.Draining, o.Lost = false, false
	o.Cached["snap-hot"] = true
	o.Used = scheduler.Resources{MemoryMB: 200 * 512, VCPUs: 100, Sandboxes: o.Capacity.Sandboxes - 4}
	// Spread the other sandboxes, of 256..1024 MB and 0.25..1 vCPU, unevenly.
	for range sandboxes - o.Used.Sandboxes {
		n := &v.Nodes[r.IntN(nodes)]
		if n == o {
			n = &v.Nodes[benchOrigin+1]
		}
		n.Used.Sandboxes++
		n.Used.MemoryMB += 256 * (1 + r.Int64N(4))
		n.Used.VCPUs += 0.25 * float64(1+r.IntN(4))
	}
	return v
}

// BenchmarkPlace: placement decisions against 1,000 nodes holding 100,000
// sandboxes. placements/s counts items placed (a fork of 100 is 100).
// create: one sandbox of a template most nodes cache; create-gated: the
// same with a selector, a runsc build and CPU features to check; fork-N: N
// children of a snapshot whose origin has room for 4, the rest spilling
// (first to the few nodes caching the snapshot, then by spreading);
// fork-100-spread: no locality, so the 96 that spill go to 96 nodes.
//
//	go test -run '^$' -bench . -benchmem ./internal/scheduler/
func BenchmarkPlace(b *testing.B) {
	v := benchFleet()
	total := 0
	for _, n := range v.Nodes {
		total += n.Used.Sandboxes
	}
	if total != 100_000 {
		b.Fatalf("fleet holds %d sandboxes", total)
	}
	origin := v.Nodes[benchOrigin].ID
	each := scheduler.Resources{MemoryMB: 512, VCPUs: 1}
	cases := []struct {
		name string
		req  scheduler.Request
	}{
		{"create", scheduler.Request{Count: 1, Each: each, Source: "base"}},
		{"create-gated", scheduler.Request{Count: 1, Each: each, Source: "base",
			Selector: map[string]string{"zone": "b", "pool": "general"}, RunscBuild: "release-20250701.0",
			CPUFeatures: []string{"avx2", "avx512f"}}},
		{"fork-10", scheduler.Request{Count: 10, Each: each, Source: "snap-hot", Origin: origin}},
		{"fork-100", scheduler.Request{Count: 100, Each: each, Source: "snap-hot", Origin: origin}},
		{"fork-100-spread", scheduler.Request{Count: 100, Each: each, Origin: origin}},
	}
	for _, c := range cases {
		b.Run(c.name, func(b *testing.B) {
			if _, err := scheduler.Place(v, c.req); err != nil {
				b.Fatal(err)
			}
			for b.Loop() {
				if _, err := scheduler.Place(v, c.req); err != nil {
					b.Fatal(err)
				}
			}
			s := b.Elapsed().Seconds()
			b.ReportMetric(float64(b.N)/s, "decisions/s")
			b.ReportMetric(float64(b.N*c.req.Count)/s, "placements/s")
		})
	}
}

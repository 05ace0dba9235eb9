package node

import (
	"context"
	"sync"
	"time"
)

// DefaultMemoryPressureEvery is how often a node compares its host's
// MemAvailable with the memory floor (Config.MemoryPressureEvery): memory
// a sandbox allocates at ~1 GB/s costs ~250 MB of the floor's slack
// before the relief looks.
const DefaultMemoryPressureEvery = 250 * time.Millisecond

// activityEvery is how often the sandboxes' CPU time is read to tell the
// active from the cold (engine.SampleActivity): one host-side read per
// running sandbox. On a host with so many that a sample takes longer than
// a twentieth of this, the samples are spaced to keep them at 5 % of a
// core.
const activityEvery = 2 * time.Second

// watchMemory runs the node's memory pressure relief every `every` (0:
// DefaultMemoryPressureEvery; negative: never) and samples the sandboxes'
// activity it ranks them by (also their resource history, kept whether
// the relief runs or not), until the returned stop is called; stop waits
// for a hibernation under way to end.
func (n *Node) watchMemory(every time.Duration) (stop func()) {
	if every == 0 {
		every = DefaultMemoryPressureEvery
	}
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	run := func(fn func(context.Context) time.Duration) {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				select {
				case <-ctx.Done():
					return
				case <-time.After(fn(ctx)):
				}
			}
		}()
	}
	if every > 0 {
		run(func(ctx context.Context) time.Duration {
			n.Engine.RelievePressure(ctx)
			return every
		})
	}
	run(func(ctx context.Context) time.Duration {
		t0 := time.Now()
		n.Engine.SampleActivity(ctx)
		return max(activityEvery, 20*time.Since(t0))
	})
	return func() {
		cancel()
		wg.Wait()
	}
}

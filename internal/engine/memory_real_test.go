package engine_test

import (
	"context"
	"errors"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/spore-run/spore/internal/engine"
	"github.com/spore-run/spore/internal/errdefs"
	"github.com/spore-run/spore/internal/runtime"
	"github.com/spore-run/spore/internal/snapshot"
)

// hogScript holds MiB of touched memory (non-zero, so every page is in the
// checkpoint) and says so in /tmp/ready, then sleeps.
const hogScript = `import sys, time
x = bytearray(b'\x01') * (int(sys.argv[1]) << 20)
open('/tmp/ready', 'w').close()
time.sleep(10**9)`

// buildHog builds template name whose init holds mib MiB of memory.
func (e *env) buildHog(ctx context.Context, name string, mib int) {
	e.t.Helper()
	if _, err := e.eng.BuildTemplate(ctx, engine.TemplateSpec{
		Name:  name,
		Run:   snapshot.RunConfig{Args: []string{"/usr/bin/python3", "-c", hogScript, strconv.Itoa(mib)}, Limits: runtime.Limits{DiskMB: 512}},
		Ready: []string{"test", "-f", "/tmp/ready"},
	}); err != nil {
		e.t.Fatalf("build template %s: %v", name, err)
	}
}

// A real sandbox holding 256 MiB, forked 10 times with the memory floor
// set so that only ~3 children fit above it: the children that fit are
// made, the others refused at once with a resource-limit error naming
// memory; the memory the children made are charged fits the room above
// the floor there was when the fork began; and another sandbox answers
// commands throughout. Before, each child was admitted as long as
// MemAvailable was above the floor when its launch began: the first four
// were admitted on the same free memory and the host went under the
// floor. The host's own MemAvailable is sampled and reported, not
// asserted: other tests of a CI run (the fleet group runs beside this
// package) take and free memory on the same host meanwhile, by hundreds
// of MiB in seconds; the children's own charge is this test's to judge.
func TestForkTrimmedToTheHostsMemoryReal(t *testing.T) {
	e := newEnv(t)
	ctx := ctxFor(t)
	e.buildHog(ctx, "hog", 256)
	src := e.create(ctx, "hog")
	bystander := e.create(ctx, e.counter)
	e.bump(ctx, bystander.ID)

	// Room above the floor for ~3.5 children of ~290 MiB (256 MiB of
	// image, python, the sandbox's own).
	avail, err := engine.MemAvailable()
	if err != nil {
		t.Fatal(err)
	}
	floor := avail - 7*290<<20/2
	e.eng.SetMemoryFloor(floor)
	defer e.eng.SetMemoryFloor(0)

	stop := make(chan struct{})
	var wg sync.WaitGroup
	var minAvail atomic.Int64
	minAvail.Store(avail)
	var answered, failed atomic.Int64
	var slowest atomic.Int64
	wg.Add(2)
	go func() { // MemAvailable all along
		defer wg.Done()
		for {
			if a, err := engine.MemAvailable(); err == nil && a < minAvail.Load() {
				minAvail.Store(a)
			}
			select {
			case <-stop:
				return
			case <-time.After(10 * time.Millisecond):
			}
		}
	}()
	go func() { // the bystander's commands
		defer wg.Done()
		for {
			t0 := time.Now()
			if out, code, err := e.execer(bystander.ID)(ctx, "/bin/echo", "alive"); err != nil || code != 0 || out != "alive\n" {
				failed.Add(1)
			} else {
				answered.Add(1)
				if d := int64(time.Since(t0)); d > slowest.Load() {
					slowest.Store(d)
				}
			}
			select {
			case <-stop:
				return
			default:
			}
		}
	}()
	fr, err := e.eng.Fork(ctx, src.ID, engine.ForkOptions{Count: 10})
	time.Sleep(time.Second) // children loading in the background are sampled too
	close(stop)
	wg.Wait()
	if err != nil {
		t.Fatalf("fork: %v", err)
	}
	made := 0
	for i, c := range fr.Children {
		switch {
		case c.Err == nil:
			made++
		case !errors.Is(c.Err, errdefs.ErrResourceLimit) || !strings.Contains(c.Err.Error(), "memory"):
			t.Fatalf("child %d: %v, want made or refused for memory", i, c.Err)
		}
	}
	t.Logf("floor %d MiB (MemAvailable was %d MiB): %d of 10 children made; MemAvailable's minimum %d MiB; bystander answered %d commands, slowest %v, %d failed",
		floor>>20, avail>>20, made, minAvail.Load()>>20, answered.Load(), time.Duration(slowest.Load()), failed.Load())
	if made < 1 || made > 3 {
		t.Errorf("%d children made, want the 1-3 that fit above the floor", made)
	}
	var charged int64
	for _, c := range fr.Children {
		if c.Err == nil {
			st, err := e.eng.Stats(ctx, c.Sandbox.ID)
			if err != nil {
				t.Fatalf("child %s: stats: %v", c.Sandbox.ID, err)
			}
			charged += st.MemoryBytes
		}
	}
	t.Logf("the %d children made are charged %d MiB; the room above the floor was %d MiB", made, charged>>20, (avail-floor)>>20)
	if charged > avail-floor {
		t.Errorf("the children made are charged %d MiB, more than the %d MiB above the floor the fork began with", charged>>20, (avail-floor)>>20)
	}
	if failed.Load() > 0 || answered.Load() == 0 {
		t.Errorf("bystander: %d commands answered, %d failed during the fork", answered.Load(), failed.Load())
	}
	for _, c := range fr.Children {
		if c.Err == nil {
			if got := e.sh(ctx, c.Sandbox.ID, "test -f /tmp/ready && echo yes"); got != "yes\n" {
				t.Errorf("child %s: %q", c.Sandbox.ID, got)
			}
		}
	}
	e.bump(ctx, bystander.ID)
}

package node_test

import (
	"strings"
	"testing"
	"time"

	"github.com/spore-run/spore/internal/engine"
	"github.com/spore-run/spore/internal/node"
	"github.com/spore-run/spore/internal/runtime"
)

// TestMemoryPressureHibernatesTheColdest: two real sandboxes, a cold one
// holding 512 MiB and idle, a hot one running commands now and then. When
// the memory floor is raised above the host's MemAvailable, the node's
// relief (every 250 ms) hibernates the cold one, sees MemAvailable back
// above the floor plus the margin, and stops: the hot one keeps running
// and answering. The cold one resumes with its memory. Before, nothing
// watched MemAvailable: the host went on under the floor.
func TestMemoryPressureHibernatesTheColdest(t *testing.T) {
	e := newEnvTuned(t, func(c *node.Config) { c.MemoryMargin = 64 << 20 })
	ctx := ctxFor(t)
	cold := e.create(ctx, engine.CreateOptions{Template: node.TemplateBase})
	hot := e.create(ctx, engine.CreateOptions{Template: node.TemplateBase})
	cc, hc := e.client(cold), e.client(hot)
	hog := strings.TrimSpace(cc.sh(ctx, `nohup python3 -c "
import time
x = bytearray(b'\x01') * (512 << 20)
open('/tmp/held', 'w').close()
time.sleep(10**6)" >/dev/null 2>&1 & echo $!`))
	for cc.sh(ctx, "test -f /tmp/held && echo held || true") != "held\n" {
		time.Sleep(100 * time.Millisecond)
	}
	// The cold one's last activity is now: a command through the engine
	// (its memory allocation may or may not have been sampled as CPU).
	if code, err := e.n.Engine.Exec(ctx, cold.ID, runtime.ExecSpec{Args: []string{"true"}}); err != nil || code != 0 {
		t.Fatalf("exec in the cold sandbox: %d %v", code, err)
	}
	if order := e.n.Engine.Coldest(); len(order) != 2 || order[0] != hot.ID {
		t.Fatalf("after a command in the cold sandbox the relief's order is %v, want the hot one first", order)
	}
	// The hot one uses some CPU every half second (its activity, as a
	// command through the proxy would); the cold one is idle from now on.
	// The work is sized in CPU, not in time, so that a loaded host slows
	// it without bringing its share under the 2 % that counts as active
	// (with a tenth of it, CI saw the hot one hibernated first).
	hc.sh(ctx, `nohup sh -c 'while :; do i=0; while [ $i -lt 100000 ]; do i=$((i+1)); done; sleep 0.5; done' >/dev/null 2>&1 &`)
	// The node samples activity every 2 s or more (more on a loaded
	// host): wait until a sample saw the hot one active after the cold
	// one's command.
	for order := e.n.Engine.Coldest(); len(order) != 2 || order[0] != cold.ID; order = e.n.Engine.Coldest() {
		if ctx.Err() != nil {
			t.Fatalf("the hot sandbox was never seen more recently active than the cold one: %v", order)
		}
		time.Sleep(200 * time.Millisecond)
	}
	for _, sb := range []engine.Sandbox{cold, hot} {
		st, err := e.n.Engine.Stats(ctx, sb.ID)
		t.Logf("%s: %d MiB, CPU %v", sb.ID, st.MemoryBytes>>20, st.CPUUsage)
		if err != nil {
			t.Fatal(err)
		}
	}

	avail, err := engine.MemAvailable()
	if err != nil {
		t.Fatal(err)
	}
	floor := avail + 32<<20
	e.n.Engine.SetMemoryFloor(floor)
	raised := time.Now()
	for {
		sb, err := e.n.Engine.Get(ctx, cold.ID)
		if err != nil {
			t.Fatal(err)
		}
		if sb.State == engine.StateHibernated {
			break
		}
		if ctx.Err() != nil {
			t.Fatalf("the cold sandbox was never hibernated (%s) with MemAvailable under the floor", sb.State)
		}
		time.Sleep(50 * time.Millisecond)
	}
	took := time.Since(raised)
	time.Sleep(time.Second) // the relief looks a few more times
	after, _ := engine.MemAvailable()
	t.Logf("floor %d MiB raised above MemAvailable %d MiB: cold sandbox hibernated after %v; MemAvailable a second later %d MiB",
		floor>>20, avail>>20, took, after>>20)
	if sb, err := e.n.Engine.Get(ctx, hot.ID); err != nil || sb.State != engine.StateRunning {
		t.Fatalf("the hot sandbox: %v %v, want running", sb.State, err)
	}
	if got := hc.sh(ctx, "echo alive"); got != "alive\n" {
		t.Fatalf("the hot sandbox answered %q", got)
	}
	e.n.Engine.SetMemoryFloor(0)
	if err := e.n.Engine.Resume(ctx, cold.ID); err != nil {
		t.Fatalf("resume the hibernated sandbox: %v", err)
	}
	back, err := e.n.Engine.Get(ctx, cold.ID)
	if err != nil {
		t.Fatal(err)
	}
	if got := e.client(back).sh(ctx, "kill -0 "+hog+" && test -f /tmp/held && echo yes"); got != "yes\n" {
		t.Fatalf("the resumed sandbox's memory holder: %q", got)
	}
}

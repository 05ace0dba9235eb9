package bench

import (
	"bytes"
	"context"
	"crypto/rand"
	"fmt"
	"io"
	"strconv"
	"strings"
	"time"

	"connectrpc.com/connect"

	"github.com/spore-run/spore/internal/api"
	"github.com/spore-run/spore/internal/client"
	processpb "github.com/spore-run/spore/proto/gen/process"
	"github.com/spore-run/spore/proto/gen/process/processpbconnect"
)

// The default templates `spore up` builds.
const (
	templateBase = "base"
	templateCode = "code-interpreter-v1"
)

// run runs a shell command in a sandbox the way the E2B SDK's
// commands.run does (bash -l -c) and returns its output; a non-zero exit
// is an error.
func run(ctx context.Context, sb *client.Sandbox, script string) (string, error) {
	return runProc(ctx, sb.Proc, script)
}

// runProc is run on any process client (the proxied one, or envd's own).
func runProc(ctx context.Context, proc processpbconnect.ProcessClient, script string) (string, error) {
	req := connect.NewRequest(&processpb.StartRequest{Process: &processpb.ProcessConfig{Cmd: "/bin/bash", Args: []string{"-l", "-c", script}}})
	st, err := proc.Start(ctx, req)
	if err != nil {
		return "", err
	}
	defer st.Close()
	var out bytes.Buffer
	code := -1
	for st.Receive() {
		ev := st.Msg().GetEvent()
		if d := ev.GetData(); d != nil {
			out.Write(d.GetStdout())
			out.Write(d.GetStderr())
		}
		if e := ev.GetEnd(); e != nil {
			code = int(e.GetExitCode())
		}
	}
	if err := st.Err(); err != nil {
		return out.String(), err
	}
	if code != 0 {
		return out.String(), fmt.Errorf("%q exited %d: %s", script, code, strings.TrimSpace(out.String()))
	}
	return out.String(), nil
}

// tickerScript runs in a sandbox and logs every gap of more than 3 ms in
// a 1 ms sleep loop: "<unix time> <gap ms>". A live snapshot stops the
// sandbox; the gap is how long the guest saw it stopped, plus at most the
// one sleep the stop fell in (an upper bound, within ~1 ms).
const tickerScript = `import time
p = time.time()
f = open("/tmp/spore-bench-gaps", "a", buffering=1)
while True:
    time.sleep(0.001)
    n = time.time()
    if n - p > 0.003:
        f.write("%.6f %.3f\n" % (n, (n - p) * 1000))
    p = n
`

// guestGap reads the longest stop the ticker logged in [from, to].
func guestGap(ctx context.Context, sb *client.Sandbox, from, to time.Time) (float64, error) {
	var buf bytes.Buffer
	if err := sb.Download(ctx, "/tmp/spore-bench-gaps", &buf, ""); err != nil {
		return 0, err
	}
	var worst float64
	lo, hi := float64(from.UnixMicro())/1e6, float64(to.UnixMicro())/1e6+0.05
	for _, line := range strings.Split(buf.String(), "\n") {
		f := strings.Fields(line)
		if len(f) != 2 {
			continue
		}
		at, err1 := strconv.ParseFloat(f[0], 64)
		gap, err2 := strconv.ParseFloat(f[1], 64)
		if err1 == nil && err2 == nil && at >= lo && at <= hi {
			worst = max(worst, gap)
		}
	}
	return worst, nil
}

func (r *runner) runOps(ctx context.Context) error {
	n := r.cfg.Count
	if err := r.createOps(ctx, n); err != nil {
		return err
	}
	if err := r.snapshotOps(ctx, n); err != nil {
		return err
	}
	src, err := r.create(ctx, api.CreateRequest{TemplateID: templateBase})
	if err != nil {
		return err
	}
	snap, err := r.snapshot(ctx, src)
	if err != nil {
		return err
	}
	if err := r.restoreOps(ctx, n, src, snap.SnapshotID); err != nil {
		return err
	}
	if err := r.rollbackOps(ctx, n, src, snap.SnapshotID); err != nil {
		return err
	}
	if err := r.pauseOps(ctx, n, src); err != nil {
		return err
	}
	if err := r.hibernateOps(ctx, max(2, n/2), src); err != nil {
		return err
	}
	if err := r.commandOps(ctx, n, src); err != nil {
		return err
	}
	if err := r.fileOps(ctx, n, src); err != nil {
		return err
	}
	if err := r.codeOps(ctx, n); err != nil {
		return err
	}
	if err := r.kill(ctx, src); err != nil {
		return err
	}
	return r.deleteSnapshot(ctx, snap.SnapshotID)
}

// snapshotOps: live snapshots of a small idle sandbox beside bare runsc
// checkpoints of the same instance; then, on a second sandbox running a
// ticker, how long each snapshot stopped the source as seen from inside.
func (r *runner) snapshotOps(ctx context.Context, n int) error {
	id, err := r.create(ctx, api.CreateRequest{TemplateID: templateBase})
	if err != nil {
		return err
	}
	o := r.op("snapshot", "lifecycle", "ms")
	for range n {
		var si api.SnapshotInfo
		if _, err := r.sample(ctx, o, func(ctx context.Context) error {
			var err error
			si, err = r.snapshot(ctx, id)
			return err
		}); err != nil {
			return err
		}
		if err := r.deleteSnapshot(ctx, si.SnapshotID); err != nil {
			return err
		}
	}
	if b := r.cfg.Bare; b != nil {
		inst, err := b.Instance(id)
		if err != nil {
			return err
		}
		if err := r.bare(o, "runsc checkpoint --leave-running", n, func() (float64, error) { return b.Checkpoint(ctx, inst) }); err != nil {
			return err
		}
	}
	if err := r.kill(ctx, id); err != nil {
		return err
	}
	return r.pausedOps(ctx, n)
}

// pausedOps measures a snapshot's stop from inside the source: a ticker
// sleeping 1 ms at a time logs every gap over 3 ms.
func (r *runner) pausedOps(ctx context.Context, n int) error {
	id, err := r.create(ctx, api.CreateRequest{TemplateID: templateBase})
	if err != nil {
		return err
	}
	sb, err := r.c.Open(ctx, id)
	if err != nil {
		return err
	}
	if err := sb.Upload(ctx, "/tmp/ticker.py", strings.NewReader(tickerScript), ""); err != nil {
		return err
	}
	if _, err := run(ctx, sb, "nohup python3 /tmp/ticker.py >/dev/null 2>&1 & sleep 0.5"); err != nil {
		return err
	}
	paused := r.op("snapshot: source paused", "lifecycle", "ms")
	paused.Note = "the longest stop a 1 ms sleep loop inside the source saw during each live snapshot (an upper bound: the stop plus at most the one 1 ms sleep it fell in; before 2026-12-01 a 5 ms loop, up to 5 ms over)"
	for range n {
		t0 := time.Now()
		si, err := r.snapshot(ctx, id)
		if err != nil {
			return err
		}
		r.addParts(paused.Name, map[string]float64{"the snapshot's own time": round(ms(time.Since(t0)), 3)})
		gap, err := guestGap(ctx, sb, t0, time.Now())
		if err != nil {
			return err
		}
		paused.Samples = append(paused.Samples, gap)
		r.detail("snapshot stopped the source for %.1f ms", gap)
		if err := r.deleteSnapshot(ctx, si.SnapshotID); err != nil {
			return err
		}
	}
	return r.kill(ctx, id)
}

func ptr[T any](v T) *T { return &v }

// bare samples the bare-runsc counterpart of o n times.
func (r *runner) bare(o *Op, name string, n int, fn func() (float64, error)) error {
	var samples []float64
	for range n {
		v, err := fn()
		if err != nil {
			return err
		}
		samples = append(samples, round(v, 3))
		r.detail("bare %s %d: %.1f ms", name, len(samples), v)
	}
	o.BareName, o.Bare = name, ptr(Summarize(samples))
	return nil
}

// restoreOps: a new sandbox from a live snapshot (restore, network,
// daemon re-identity), beside bare `runsc restore` of the same image.
func (r *runner) restoreOps(ctx context.Context, n int, src, snap string) error {
	o := r.op("create from snapshot", "lifecycle", "ms")
	for range n {
		var id string
		if _, err := r.sample(ctx, o, func(ctx context.Context) error {
			var err error
			id, err = r.create(ctx, api.CreateRequest{TemplateID: snap})
			return err
		}); err != nil {
			return err
		}
		if err := r.kill(ctx, id); err != nil {
			return err
		}
	}
	// "restore" is the runtime restore inside those creates, from the
	// API's Server-Timing (a fleet replica relays the node's phases; an
	// older one did not: then there is none).
	var restore *Op
	if phases := r.parts[o.Name]["restore"]; len(phases) > 0 {
		restore = r.op("restore", "lifecycle", "ms")
		restore.Samples = append(restore.Samples, phases...)
		restore.Note = "the runtime restore inside each create from a snapshot (Server-Timing: restore)"
	} else {
		r.note("no restore phase in the API's Server-Timing: the restore row is left out")
	}
	if b := r.cfg.Bare; b != nil {
		inst, err := b.Instance(src)
		if err != nil {
			return err
		}
		if err := r.bare(o, "runsc restore", n, func() (float64, error) { return b.Restore(ctx, inst, b.ImageDir(snap)) }); err != nil {
			return err
		}
		if restore != nil {
			restore.BareName, restore.Bare = o.BareName, ptr(*o.Bare)
		}
	}
	return nil
}

// rollbackOps: rollbacks in place, spaced and back to back. The replaced
// instance is freed after the answer while holding the sandbox's lock, so
// a rollback right behind another waits for that cleanup: the spaced
// figure is what a rollback costs alone, the back-to-back one what a
// caller rolling back repeatedly sees.
func (r *runner) rollbackOps(ctx context.Context, n int, src, snap string) error {
	spaced := r.op("rollback", "lifecycle", "ms")
	spaced.Note = "300 ms between rollbacks, so the previous one's background cleanup (the replaced instance's kill and network teardown, which hold the sandbox's lock) is done: see the back-to-back row"
	b2b := r.op(opRollbackB2B, "lifecycle", "ms")
	b2b.Note = "no pause between rollbacks: each waits for the previous one's background cleanup"
	for _, o := range []*Op{spaced, b2b} {
		for range n {
			if o == spaced {
				time.Sleep(300 * time.Millisecond)
			}
			if _, err := r.sample(ctx, o, func(ctx context.Context) error {
				_, err := r.c.Rollback(ctx, src, snap)
				return err
			}); err != nil {
				return err
			}
		}
	}
	return nil
}

const opRollbackB2B = "rollback: back to back"

func (r *runner) pauseOps(ctx context.Context, n int, src string) error {
	p, re := r.op("pause", "lifecycle", "ms"), r.op("resume", "lifecycle", "ms")
	if err := r.stopStart(ctx, n, src, p, re, r.c.Pause); err != nil {
		return err
	}
	if b := r.cfg.Bare; b != nil {
		inst, err := b.Instance(src)
		if err != nil {
			return err
		}
		var bp, br []float64
		for range n {
			v, err := b.Pause(ctx, inst)
			if err != nil {
				return err
			}
			w, err := b.Resume(ctx, inst)
			if err != nil {
				return err
			}
			bp, br = append(bp, v), append(br, w)
		}
		p.BareName, p.Bare = "runsc pause", ptr(Summarize(bp))
		re.BareName, re.Bare = "runsc resume", ptr(Summarize(br))
	}
	return nil
}

func (r *runner) hibernateOps(ctx context.Context, n int, src string) error {
	return r.stopStart(ctx, n, src, r.op("hibernate", "lifecycle", "ms"), r.op("resume from hibernation", "lifecycle", "ms"), r.c.Hibernate)
}

// stopStart samples n rounds of stopping the sandbox and resuming it the
// way the SDK does (connect).
func (r *runner) stopStart(ctx context.Context, n int, id string, stopOp, startOp *Op, stop func(context.Context, string) error) error {
	for range n {
		if _, err := r.sample(ctx, stopOp, func(ctx context.Context) error { return stop(ctx, id) }); err != nil {
			return err
		}
		if _, err := r.sample(ctx, startOp, func(ctx context.Context) error {
			_, err := r.c.Connect(ctx, id, time.Hour)
			return err
		}); err != nil {
			return err
		}
	}
	return nil
}

// commandOps: commands.run("true") through the API server's proxy and
// the daemon, beside the same request sent to the daemon directly; back to
// back, and spaced as an agent's commands are (the daemon then has a login
// shell started ahead for the next command: see docs/envd.md, "Warm
// shells"). `runsc exec` is no baseline: Spore never uses it for a command
// (envd, already running inside the sandbox, spawns it), and it pays a
// runsc process and a new exec session that commands.run does not.
func (r *runner) commandOps(ctx context.Context, n int, src string) error {
	for _, gap := range []time.Duration{0, CommandGap} {
		if err := r.commandOp(ctx, n, src, gap); err != nil {
			return err
		}
	}
	return nil
}

// CommandGap is the pause before each command of the spaced commands.run
// figure.
const CommandGap = 100 * time.Millisecond

func (r *runner) commandOp(ctx context.Context, n int, src string, gap time.Duration) error {
	sb, err := r.c.Open(ctx, src)
	if err != nil {
		return err
	}
	name, spacing := `commands.run("true")`, "back to back"
	if gap > 0 {
		name += fmt.Sprintf(", %s apart", gap)
		spacing = fmt.Sprintf("each after a %s pause, as an agent's commands come", gap)
	}
	o := r.op(name, "data", "ms")
	if _, err := run(ctx, sb, "true"); err != nil { // warm the connection
		return err
	}
	for range 2 * n {
		time.Sleep(gap)
		if _, err := r.sample(ctx, o, func(ctx context.Context) error {
			_, err := run(ctx, sb, "true")
			return err
		}); err != nil {
			return err
		}
	}
	if b := r.cfg.Bare; b != nil {
		addr, err := b.Addr(src)
		if err != nil {
			return err
		}
		proc := envdDirect(addr, sb.Token)
		if _, err := runProc(ctx, proc, "true"); err != nil { // warm the connection
			return fmt.Errorf("envd direct: %w", err)
		}
		if err := r.bare(o, bareEnvdDirect, 2*n, func() (float64, error) {
			time.Sleep(gap)
			t0 := time.Now()
			if _, err := runProc(ctx, proc, "true"); err != nil {
				return 0, fmt.Errorf("envd direct: %w", err)
			}
			return ms(time.Since(t0)), nil
		}); err != nil {
			return err
		}
		o.Note = "the SDK's request (Process.Start of /bin/bash -l -c true, as the E2B SDK sends it), " + spacing + ", through the API server's proxy, beside the same request sent straight to the sandbox's envd (no API server, no proxy): the ratio is what Spore's routing adds. `runsc exec` is not compared: Spore never runs a command through it"
	}
	return nil
}

// bareEnvdDirect names the commands.run baseline.
const bareEnvdDirect = "envd direct: the same request, no API server"

// fileOps: upload and download of 1 MB (latency) and 100 MB (throughput).
func (r *runner) fileOps(ctx context.Context, n int, src string) error {
	sb, err := r.c.Open(ctx, src)
	if err != nil {
		return err
	}
	bigMB, bigN := 100, 3
	if r.cfg.Quick {
		bigMB, bigN = 4, 1
	}
	for _, size := range []struct {
		mb, n int
		unit  string
	}{{1, n, "ms"}, {bigMB, bigN, "MB/s"}} {
		data := make([]byte, size.mb<<20)
		rand.Read(data)
		up := r.op(fmt.Sprintf("upload %d MB", size.mb), "data", size.unit)
		down := r.op(fmt.Sprintf("download %d MB", size.mb), "data", size.unit)
		path := fmt.Sprintf("/tmp/bench-%d", size.mb)
		for range size.n {
			v, _, err := timed(ctx, func(ctx context.Context) error { return sb.Upload(ctx, path, bytes.NewReader(data), "") })
			if err != nil {
				return fmt.Errorf("%s: %w", up.Name, err)
			}
			var got countWriter
			w, _, err := timed(ctx, func(ctx context.Context) error { return sb.Download(ctx, path, &got, "") })
			if err != nil {
				return fmt.Errorf("%s: %w", down.Name, err)
			}
			if int(got) != len(data) {
				return fmt.Errorf("%s: got %d bytes, want %d", down.Name, got, len(data))
			}
			up.Samples = append(up.Samples, perUnit(size.unit, size.mb, v))
			down.Samples = append(down.Samples, perUnit(size.unit, size.mb, w))
			r.detail("%s: %.1f ms, %s: %.1f ms", up.Name, v, down.Name, w)
		}
		if _, err := run(ctx, sb, "rm -f "+path); err != nil {
			return err
		}
	}
	return nil
}

func perUnit(unit string, mb int, msTaken float64) float64 {
	if unit == "MB/s" {
		return round(float64(mb)/(msTaken/1000), 1)
	}
	return round(msTaken, 3)
}

type countWriter int64

func (c *countWriter) Write(p []byte) (int, error) { *c += countWriter(len(p)); return len(p), nil }

var _ io.Writer = (*countWriter)(nil)

// codeOps: runCode("1+1") in a code-interpreter sandbox.
func (r *runner) codeOps(ctx context.Context, n int) error {
	id, err := r.create(ctx, api.CreateRequest{TemplateID: templateCode})
	if err != nil {
		return err
	}
	sb, err := r.c.Open(ctx, id)
	if err != nil {
		return err
	}
	o := r.op(`runCode("1+1")`, "data", "ms")
	if _, err := sb.RunCode(ctx, "0"); err != nil { // warm the kernel's connection
		return err
	}
	for range n {
		if _, err := r.sample(ctx, o, func(ctx context.Context) error {
			got, err := sb.RunCode(ctx, "1+1")
			if err == nil && strings.TrimSpace(got) != "2" {
				err = fmt.Errorf("runCode(1+1) = %q, want 2", got)
			}
			return err
		}); err != nil {
			return err
		}
	}
	return r.kill(ctx, id)
}

package node_test

import (
	"context"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/spore-run/spore/internal/engine"
	"github.com/spore-run/spore/internal/errdefs"
	"github.com/spore-run/spore/internal/ids"
	"github.com/spore-run/spore/internal/node"
	"github.com/spore-run/spore/internal/runtime"
)

// Hostile code cannot read or write host files: /proc/1/root, symlinks
// and .. all stay inside the sandbox's own root.
//
// Each probe has a positive control: the same command, through the same
// exec channel as the same user, aimed at a file inside the sandbox must
// read it (or, for the mount tricks, be visibly refused). So "the probe
// did not read the host file" means the boundary held, not that the
// channel, the shell or the command was broken.
func TestHostileFilesystem(t *testing.T) {
	e := newEnv(t)
	ctx := ctxFor(t)
	secret := filepath.Join(os.TempDir(), "spore-host-secret-"+ids.New('x'))
	os.WriteFile(secret, []byte("host secret\n"), 0o644)
	defer os.Remove(secret)
	sb := e.create(ctx, engine.CreateOptions{Template: node.TemplateBase})
	c := e.client(sb)
	c.user = "root"
	// The sandbox's own file, at a path of the same shape, and a copy in
	// its pid 1's working directory (for the /proc/1/cwd probe).
	inside := "/tmp/spore-sandbox-file-" + ids.New('x')
	c.sh(ctx, "echo 'sandbox file' > "+inside+" && cp "+inside+" \"$(readlink /proc/1/cwd)\"/")
	type probe struct {
		cmd   func(path string) string
		mount bool // may be refused outright (no CAP_SYS_ADMIN)
	}
	probes := []probe{
		{cmd: func(p string) string { return "cat " + p }},
		{cmd: func(p string) string { return "cat /proc/1/root" + p }},
		{cmd: func(p string) string { return "cat /proc/self/root" + p }},
		{cmd: func(p string) string { return "cat /../../../.." + p }},
		{cmd: func(p string) string { return "ln -sf " + p + " /tmp/l && cat /tmp/l" }},
		{cmd: func(p string) string { return "ln -sf /proc/1/root /tmp/r && cat /tmp/r" + p }},
		{cmd: func(p string) string { return "cat /proc/1/cwd/" + filepath.Base(p) }},
		// Bind tricks: root in the sandbox has no CAP_SYS_ADMIN, and even
		// its own mounts only see the sandbox's tree.
		{mount: true, cmd: func(p string) string {
			return "mkdir -p /mnt/x && mount --bind / /mnt/x && cat /mnt/x" + p + "; umount /mnt/x 2>/dev/null"
		}},
		{mount: true, cmd: func(p string) string {
			return "mkdir -p /mnt/p && mount -t proc proc /mnt/p && cat /mnt/p/1/root" + p + "; umount /mnt/p 2>/dev/null"
		}},
		{mount: true, cmd: func(p string) string { return "unshare -m sh -c 'mount --bind / /mnt && cat /mnt" + p + "'" }},
	}
	refused := regexp.MustCompile(`(?i)permission denied|operation not permitted|must be superuser|not permitted`)
	// exec runs a probe and fails the test if the channel or the shell
	// broke: the marker after it must come back.
	exec := func(cmd string) string {
		t.Helper()
		r, err := c.run(ctx, "( "+cmd+" ) 2>&1; echo probe-exit=$?")
		if err != nil || !strings.Contains(r.stdout, "probe-exit=") {
			t.Fatalf("exec channel broken running %q: %v %q %q", cmd, err, r.stdout, r.stderr)
		}
		return r.stdout
	}
	for _, p := range probes {
		control := exec(p.cmd(inside))
		switch {
		case strings.Contains(control, "sandbox file"):
		case p.mount && refused.MatchString(control):
			t.Logf("refused: %q: %s", p.cmd(inside), strings.TrimSpace(control))
		default:
			t.Fatalf("positive control failed: %q read nothing inside the sandbox and was not refused: %q", p.cmd(inside), control)
		}
		if out := exec(p.cmd(secret)); strings.Contains(out, "host secret") {
			t.Fatalf("sandbox read a host file with %q", p.cmd(secret))
		}
	}
	// Writes land in the sandbox, not on the host; the same writes to a
	// sandbox path work (positive control).
	escape := filepath.Join(os.TempDir(), "spore-escape-"+ids.New('x'))
	for _, w := range []func(string) string{
		func(p string) string { return "echo x > " + p },
		func(p string) string { return "echo x > /proc/1/root" + p },
		func(p string) string { return "mkdir -p /tmp/a && echo x > /tmp/a/../../.." + p },
	} {
		ok := "/tmp/spore-write-ok-" + ids.New('x')
		if out := exec(w(ok) + " && cat " + ok); !strings.Contains(out, "x\nprobe-exit=0") {
			t.Fatalf("positive control: %q did not write inside the sandbox: %q", w(ok), out)
		}
		exec(w(escape))
		if _, err := os.Stat(escape); err == nil {
			os.Remove(escape)
			t.Fatalf("sandbox wrote a host file with %q", w(escape))
		}
	}
	// The sandbox's processes are its own: no host process is visible, but
	// its own are (the listing works).
	out := c.sh(ctx, "ps -e -o comm= | sort -u | tr '\\n' ' '")
	if !strings.Contains(out, "ps") {
		t.Fatalf("positive control: ps does not list itself: %q", out)
	}
	if strings.Contains(out, "runsc") || strings.Contains(out, "go") || strings.Contains(out, "systemd") {
		t.Fatalf("host processes visible: %s", out)
	}
}

// Another sandbox's processes and files are invisible.
func TestHostileNeighbours(t *testing.T) {
	e := newEnv(t)
	ctx := ctxFor(t)
	a := e.client(e.create(ctx, engine.CreateOptions{Template: node.TemplateBase}))
	b := e.client(e.create(ctx, engine.CreateOptions{Template: node.TemplateBase}))
	a.sh(ctx, "echo a-secret > /home/user/a-secret.txt; nohup sleep 321 >/dev/null 2>&1 &")
	b.user = "root"
	// Positive control: the same search finds b's own file and process.
	b.sh(ctx, "echo b > /home/user/b-own.txt; nohup sleep 322 >/dev/null 2>&1 &")
	if out := b.sh(ctx, "find / -xdev -name b-own.txt 2>/dev/null; pgrep -f '[s]leep 322' >/dev/null && echo own-process"); out != "/home/user/b-own.txt\nown-process\n" {
		t.Fatalf("positive control: b does not find its own file and process: %q", out)
	}
	if out := b.sh(ctx, "find / -xdev -name a-secret.txt 2>/dev/null; pgrep -f '[s]leep 321' || true"); strings.TrimSpace(out) != "" {
		t.Fatalf("b sees a's file or process: %q", out)
	}
}

// A fork bomb, a memory hog and a disk filler each hit the sandbox's
// limits; the host and a neighbour carry on; the sandbox stays killable.
func TestHostileLimits(t *testing.T) {
	e := newEnv(t)
	ctx := ctxFor(t)
	spec := e.n.TemplateSpecs()[0]
	spec.Name = "small"
	spec.Run.Limits = runtime.Limits{VCPUs: 1, MemoryMB: 384, MaxProcs: 64, DiskMB: 64}
	if _, err := e.n.Engine.BuildTemplate(ctx, spec); err != nil {
		t.Fatal(err)
	}
	neighbour := e.client(e.create(ctx, engine.CreateOptions{Template: node.TemplateBase}))
	alive := func(what string) {
		t.Helper()
		if got := neighbour.sh(ctx, "echo alive"); got != "alive\n" {
			t.Fatalf("neighbour after %s: %q", what, got)
		}
	}

	// Fork bomb: stopped by the process limit (EAGAIN), then killed.
	bomb := e.create(ctx, engine.CreateOptions{Template: "small"})
	bc := e.client(bomb)
	bctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	bc.run(bctx, `bomb() { bomb | bomb & }; bomb; sleep 3`)
	cancel()
	alive("fork bomb")
	if err := e.n.Engine.Kill(ctx, bomb.ID); err != nil {
		t.Fatalf("kill after fork bomb: %v", err)
	}

	// Disk filler: ENOSPC at the disk limit; the sandbox keeps working.
	disk := e.create(ctx, engine.CreateOptions{Template: "small"})
	dc := e.client(disk)
	r, _ := dc.run(ctx, "dd if=/dev/zero of=/home/user/fill bs=1M count=200 2>&1; echo rc=$?")
	if !strings.Contains(r.stdout, "No space left on device") {
		t.Fatalf("disk filler: %q", r.stdout)
	}
	if got := dc.sh(ctx, "rm /home/user/fill && echo ok"); got != "ok\n" {
		t.Fatalf("after disk filler: %q", got)
	}
	alive("disk filler")

	// Memory hog: the memory limit stops it (the host kills the sandbox's
	// processes when its cgroup is exhausted); the neighbour carries on and
	// the sandbox is still killable and freed.
	hog := e.create(ctx, engine.CreateOptions{Template: "small"})
	hc := e.client(hog)
	hctx, cancel2 := context.WithTimeout(ctx, 15*time.Second)
	r, _ = hc.run(hctx, `python3 -c "
chunks = []
for i in range(4096):
    chunks.append(bytearray(1 << 20))
print('allocated 4 GiB')"`)
	cancel2()
	if strings.Contains(r.stdout, "allocated 4 GiB") {
		t.Fatal("a 384 MB sandbox allocated 4 GiB")
	}
	alive("memory hog")
	if err := e.n.Engine.Kill(ctx, hog.ID); err != nil && !errdefs.IsNotFound(err) {
		t.Fatalf("kill after memory hog: %v", err)
	}
	insts, _ := e.n.Runtime.List(ctx)
	for _, i := range insts {
		if strings.HasPrefix(i.ID, hog.ID) || strings.HasPrefix(i.ID, bomb.ID) {
			t.Fatalf("instance %s left", i.ID)
		}
	}
}

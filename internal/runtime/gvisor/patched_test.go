package gvisor_test

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"testing"
	"time"

	"github.com/spore-run/spore/internal/ids"
	"github.com/spore-run/spore/internal/runtime"
	"github.com/spore-run/spore/internal/runtime/gvisor"
	"github.com/spore-run/spore/internal/testenv"
)

// sparseGuest maps 32 MiB and shapes it page by page, so that a checkpoint
// meets every kind of page: data, pages written and zeroed again (a save
// decommits them: they become holes), pages never touched, and pages
// written into holes after a checkpoint. Page i holds fill(gen, i) or
// zeros; sparseHash computes the same memory's SHA-256 outside the guest.
// Commands arrive in /tmp/ask: "mutate" moves to the second shape, "hash"
// reads all the memory and answers its SHA-256; any other is answered as
// unknown.
const sparseGuest = `import hashlib, mmap, os, time
PAGES = 8192
m = mmap.mmap(-1, PAGES * 4096)
def fill(gen, i):
    return hashlib.sha256(b"%d:%d" % (gen, i)).digest() * 128
def put(i, b):
    m[i * 4096:(i + 1) * 4096] = b
zero = bytes(4096)
for i in range(0, PAGES, 4):
    put(i, fill(1, i))
    put(i + 1, fill(1, i + 1))
    put(i + 1, zero)
def answer(s):
    open("/tmp/answer.new", "w").write(s)
    os.rename("/tmp/answer.new", "/tmp/answer")
answer("ready")
while True:
    if os.path.exists("/tmp/ask"):
        cmd = open("/tmp/ask").read().strip()
        os.remove("/tmp/ask")
        if cmd == "mutate":
            for i in range(0, PAGES, 4):
                put(i + 1, fill(2, i + 1))
                put(i + 3, fill(2, i + 3))
                if i % 8 == 0:
                    put(i, zero)
            answer("mutated")
        elif cmd == "hash":
            answer(hashlib.sha256(m).hexdigest())
        else:
            answer("unknown command %r" % cmd)
    time.sleep(0.005)
`

// sparseHash is the SHA-256 of sparseGuest's memory in shape gen (1 after
// start, 2 after "mutate").
func sparseHash(gen int) string {
	const pages = 8192
	fill := func(g, i int) []byte {
		s := sha256.Sum256(fmt.Appendf(nil, "%d:%d", g, i))
		return bytes.Repeat(s[:], 128)
	}
	zero := make([]byte, 4096)
	h := sha256.New()
	for i := range pages {
		page := zero
		switch {
		case i%4 == 0 && (gen == 1 || i%8 == 4):
			page = fill(1, i)
		case gen == 2 && (i%4 == 1 || i%4 == 3):
			page = fill(2, i)
		}
		h.Write(page)
	}
	return hex.EncodeToString(h.Sum(nil))
}

var holesNotRead = regexp.MustCompile(`save scanning took .* (\d+) bytes in holes not read`)

// TestCheckpointSkipsHoles checks a checkpoint of memory with holes in it
// (the pgalloc patch of internal/setup/patches reads only what the host
// says holds data): a guest's memory is whole in the image after every
// kind of page, through a second checkpoint and through a checkpoint of a
// restored sandbox. runsc's own log shows the holes were skipped, so a
// runsc built without the patch fails here too.
func TestCheckpointSkipsHoles(t *testing.T) {
	ctx := context.Background()
	logs := t.TempDir()
	d := newDriverWith(t, gvisor.Config{ExtraFlags: []string{"--debug", "--debug-log=" + logs + "/"}})
	spec := func() runtime.Spec {
		return runtime.Spec{ID: ids.New('t'), RootFS: testenv.BaseRootFS(t), Args: []string{"/usr/bin/python3", "-c", sparseGuest},
			Limits: runtime.Limits{MemoryMB: 512, DiskMB: 256}}
	}
	out := func(id string, args ...string) (string, int) {
		t.Helper()
		return execOut(t, d, id, args...)
	}
	// ask sends the guest a command and returns its answer.
	ask := func(id, cmd string) string {
		t.Helper()
		// The command is renamed into place whole: a guest that found
		// /tmp/ask between the shell creating it and writing it read an
		// empty command, and waited for the next one (a CI run hung here).
		if _, code := out(id, "/bin/sh", "-c", "rm -f /tmp/answer && echo "+cmd+" > /tmp/ask.new && mv /tmp/ask.new /tmp/ask"); code != 0 {
			t.Fatalf("ask %s: exit %d", id, code)
		}
		return await(t, out, id)
	}

	src := spec()
	if err := d.Start(ctx, src); err != nil {
		t.Fatal(err)
	}
	if got := await(t, out, src.ID); got != "ready" {
		t.Fatalf("guest: %q", got)
	}
	check := func(id string, gen int, when string) {
		t.Helper()
		if got, want := ask(id, "hash"), sparseHash(gen); got != want {
			t.Fatalf("memory %s: sha256 %s, want %s", when, got, want)
		}
	}
	check(src.ID, 1, "before any checkpoint")
	// The first checkpoint finds the zero pages and decommits them; the
	// guest then writes into some of those holes and zeroes some data.
	if err := d.Checkpoint(ctx, src.ID, t.TempDir(), runtime.CheckpointOptions{LeaveRunning: true}); err != nil {
		t.Fatal(err)
	}
	if got := ask(src.ID, "mutate"); got != "mutated" {
		t.Fatalf("mutate: %q", got)
	}
	img := t.TempDir()
	if err := d.Checkpoint(ctx, src.ID, img, runtime.CheckpointOptions{LeaveRunning: true}); err != nil {
		t.Fatal(err)
	}
	check(src.ID, 2, "of the source after two checkpoints")

	a := spec()
	if err := d.Restore(ctx, a, img); err != nil {
		t.Fatal(err)
	}
	// A restored sandbox's zero pages were never loaded: they are holes
	// for its first checkpoint.
	b := spec()
	if err := d.Restore(ctx, b, mustCheckpoint(t, d, a.ID, t.TempDir())); err != nil {
		t.Fatal(err)
	}
	check(b.ID, 2, "restored from a checkpoint of a restored sandbox")

	skipped := int64(0)
	for _, m := range logMatches(t, logs, holesNotRead) {
		n, _ := strconv.ParseInt(string(m[1]), 10, 64)
		skipped += n
	}
	if skipped == 0 {
		t.Fatalf("no checkpoint skipped a hole: runsc's logs in %s hold no %q with bytes (is runsc built with the pgalloc patch?)", logs, "bytes in holes not read")
	}
	t.Logf("checkpoints skipped %d MiB of holes", skipped>>20)
}

// startLogged starts a sandbox that sleeps, with runsc's debug logs in the
// returned directory.
func startLogged(t *testing.T) (d *gvisor.Driver, id, logs string) {
	t.Helper()
	logs = t.TempDir()
	d = newDriverWith(t, gvisor.Config{ExtraFlags: []string{"--debug", "--debug-log=" + logs + "/"}})
	spec := runtime.Spec{ID: ids.New('t'), RootFS: testenv.BaseRootFS(t), Args: []string{"/bin/sleep", "1000000"},
		Limits: runtime.Limits{MemoryMB: 256, DiskMB: 64}}
	if err := d.Start(context.Background(), spec); err != nil {
		t.Fatal(err)
	}
	return d, spec.ID, logs
}

// TestSeccompPrecompiled checks that the sandbox and the gofer of runsc as
// setup builds it install precompiled seccomp programs (seccompgen) rather
// than compiling them on every start, restore and fork child.
func TestSeccompPrecompiled(t *testing.T) {
	_, _, logs := startLogged(t)
	for _, part := range []string{"boot", "gofer"} {
		files, _ := filepath.Glob(filepath.Join(logs, "*."+part+".txt"))
		if len(files) == 0 {
			t.Fatalf("no %s log in %s", part, logs)
		}
		for _, f := range files {
			text, err := os.ReadFile(f)
			if err != nil {
				t.Fatal(err)
			}
			if bytes.Contains(text, []byte("No precompiled program found")) || !bytes.Contains(text, []byte("Loaded precompiled seccomp instructions")) {
				t.Errorf("the %s compiled its seccomp program instead of loading a precompiled one (%s)", part, f)
			}
		}
	}
}

// logMatches returns re's matches in every runsc log file in dir.
func logMatches(t *testing.T, dir string, re *regexp.Regexp) [][][]byte {
	t.Helper()
	files, _ := filepath.Glob(filepath.Join(dir, "*"))
	var all [][][]byte
	for _, f := range files {
		text, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		all = append(all, re.FindAllSubmatch(text, -1)...)
	}
	return all
}

// await waits for the guest's answer in /tmp/answer.
func await(t *testing.T, out func(string, ...string) (string, int), id string) string {
	t.Helper()
	// A hang guard: the guest hashes its sparse memory, which took over a
	// minute on two cores busy with the rest of the suite (3.4 s for the
	// whole test alone), and once in CI more than three. Each look is a
	// runsc exec, a process as heavy as the guest's work: looking every
	// 20 ms took much of the CPU the guest needed; every 250 ms does not.
	for deadline := time.Now().Add(5 * time.Minute); time.Now().Before(deadline); time.Sleep(250 * time.Millisecond) {
		if s, code := out(id, "cat", "/tmp/answer"); code == 0 && s != "" {
			return s
		}
	}
	t.Fatalf("guest %s did not answer", id)
	return ""
}

// TestTraceSessionAtBoot checks that gVisor's trace points, now registered
// when a session first needs them rather than at every boot (the seccheck
// patch of internal/setup/patches), are there for a session configured at
// boot (--pod-init-config): runsc logs a session it cannot configure (a
// warning, not an error), and logs nothing for one it can. A point that
// does not exist is logged.
func TestTraceSessionAtBoot(t *testing.T) {
	ctx := context.Background()
	for _, tc := range []struct {
		point string
		ok    bool
	}{{"syscall/openat/enter", true}, {"container/start", true}, {"syscall/no-such-call/enter", false}} {
		dir := t.TempDir()
		conf := filepath.Join(dir, "init.json")
		text := `{"trace_session": {"name": "Default", "points": [{"name": "` + tc.point + `"}], "sinks": [{"name": "null"}]}}`
		if err := os.WriteFile(conf, []byte(text), 0o644); err != nil {
			t.Fatal(err)
		}
		logs := filepath.Join(dir, "logs")
		d := newDriverWith(t, gvisor.Config{ExtraFlags: []string{"--pod-init-config=" + conf, "--debug-log=" + logs + "/"}})
		spec := runtime.Spec{ID: ids.New('t'), RootFS: testenv.BaseRootFS(t), Args: []string{"/bin/sleep", "1000"},
			Limits: runtime.Limits{MemoryMB: 256, DiskMB: 64}}
		if err := d.Start(ctx, spec); err != nil {
			t.Fatalf("a session on point %q: %v", tc.point, err)
		}
		if out, code := execOut(t, d, spec.ID, "/bin/cat", "/etc/hostname"); code != 0 {
			t.Fatalf("exec with a trace session on %q: exit %d: %s", tc.point, code, out)
		}
		failed := logMatches(t, logs, regexp.MustCompile(`unable to configure event session: (.*)`))
		switch {
		case tc.ok && len(failed) > 0:
			t.Errorf("a session on point %q was not configured: %s", tc.point, failed[0][1])
		case !tc.ok && (len(failed) == 0 || !bytes.Contains(failed[0][1], []byte("not found"))):
			t.Errorf("a session on point %q: runsc logged %q, want the point not found", tc.point, failed)
		}
	}
}

// TestRestoreGCHeldForTheLoad checks the restore's GC patch of
// internal/setup/patches: the sentry holds its garbage collector off while
// it decodes the kernel's state, then gives it back its setting (runsc
// logs it; a runsc without the patch logs nothing), and the restored
// sandbox runs.
func TestRestoreGCHeldForTheLoad(t *testing.T) {
	ctx := context.Background()
	logs := t.TempDir()
	d := newDriverWith(t, gvisor.Config{ExtraFlags: []string{"--debug", "--debug-log=" + logs + "/"}})
	spec := func() runtime.Spec {
		return runtime.Spec{ID: ids.New('t'), RootFS: testenv.BaseRootFS(t), Args: []string{"/bin/sh", "-c", "echo kept > /tmp/f; sleep 1000000"},
			Limits: runtime.Limits{MemoryMB: 256, DiskMB: 64}}
	}
	src := spec()
	if err := d.Start(ctx, src); err != nil {
		t.Fatal(err)
	}
	for deadline := time.Now().Add(time.Minute); ; time.Sleep(20 * time.Millisecond) {
		if s, _ := execOut(t, d, src.ID, "cat", "/tmp/f"); s == "kept" {
			break
		} else if time.Now().After(deadline) {
			t.Fatalf("the source's /tmp/f: %q", s)
		}
	}
	b := spec()
	if err := d.Restore(ctx, b, mustCheckpoint(t, d, src.ID, t.TempDir())); err != nil {
		t.Fatal(err)
	}
	if s, code := execOut(t, d, b.ID, "cat", "/tmp/f"); s != "kept" || code != 0 {
		t.Fatalf("the restored sandbox's /tmp/f: %q (exit %d)", s, code)
	}
	ms := logMatches(t, logs, regexp.MustCompile(`Kernel load ran with the garbage collector held off; GOGC back to (-?\d+)%`))
	if len(ms) != 1 {
		t.Fatalf("%d logs of the kernel load's GC, want 1 (is runsc built with the restore's GC patch?)", len(ms))
	}
	if got := string(ms[0][1]); got != "100" {
		t.Fatalf("the sentry's GOGC after the load: %s%%, want its default 100%%", got)
	}
}

// TestProcUmounterFromMemfd checks the /proc umounter patch of
// internal/setup/patches: the sandbox's helper that unmounts /proc from
// its chroot is the small program started from a memfd (runsc logs it; a
// runsc without the patch starts its own `umount` command, which writes a
// debug log of its own), and the sandbox runs. runsc's boot verifies the
// unmount itself: it stops the sandbox when /proc is still reachable
// after the helper has exited, or when the helper failed.
func TestProcUmounterFromMemfd(t *testing.T) {
	d, id, logs := startLogged(t)
	if s, code := execOut(t, d, id, "echo", "up"); s != "up" || code != 0 {
		t.Fatalf("the sandbox answers %q (exit %d)", s, code)
	}
	if ms := logMatches(t, logs, regexp.MustCompile(`Started the /proc umounter from a memfd \((\d+) bytes\), not runsc`)); len(ms) == 0 {
		t.Fatal("no log of the /proc umounter started from a memfd (is runsc built with the umounter patch?)")
	} else if got := string(ms[0][1]); got != "200" {
		t.Fatalf("the umounter program has %s bytes, want 200", got)
	}
	if m, _ := filepath.Glob(filepath.Join(logs, "*umount*")); len(m) > 0 {
		t.Fatalf("runsc's own umount command ran: %v", m)
	}
}

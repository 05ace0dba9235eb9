package fleet

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/spore-run/spore/internal/errdefs"
)

func TestParseStat(t *testing.T) {
	// The command name may hold spaces and parentheses.
	line := "4242 (a) b) c) S 1 4242 4242 0 -1 4194560 100 0 0 0 1 2 0 0 20 0 1 0 987654 1000 100 18446744073709551615"
	st, state, err := parseStat([]byte(line))
	if err != nil || st != 987654 || state != 'S' {
		t.Fatalf("parseStat = %d %c %v, want 987654 S", st, state, err)
	}
	if _, _, err := parseStat([]byte("12 (x) S 1 2")); err == nil {
		t.Fatal("a short stat line parsed")
	}
}

func sleeper(t *testing.T) Proc {
	t.Helper()
	p, err := start(exec.Command("sleep", "300"), filepath.Join(t.TempDir(), "log"), "")
	if err != nil {
		t.Fatal(err)
	}
	p.Name = "sleeper"
	t.Cleanup(func() { syscall.Kill(p.PID, syscall.SIGKILL) })
	return p
}

// A process is stopped by PID only while the PID still has the start time
// recorded: a recycled PID (another start time) is never signalled.
func TestStopOnlyTheRecordedProcess(t *testing.T) {
	ctx := context.Background()
	p := sleeper(t)
	if !p.alive() {
		t.Fatal("the started process is not alive")
	}
	other := p
	other.StartTime++ // as if the PID now belonged to another process
	if other.alive() {
		t.Fatal("a PID with another start time counts as the recorded process")
	}
	if err := other.stop(ctx, syscall.SIGTERM, time.Second); err != nil {
		t.Fatal(err)
	}
	if !p.alive() {
		t.Fatal("stop signalled a process whose start time differs from the record")
	}
	if err := p.stop(ctx, syscall.SIGTERM, 10*time.Second); err != nil {
		t.Fatal(err)
	}
	if p.alive() {
		t.Fatal("still alive after stop")
	}
	// Stopping again is a no-op.
	if err := p.stop(ctx, syscall.SIGTERM, time.Second); err != nil {
		t.Fatal(err)
	}
}

// A process that ignores SIGTERM gets SIGKILL after the grace.
func TestStopEscalatesToKill(t *testing.T) {
	p, err := start(exec.Command("sh", "-c", "trap '' TERM; sleep 300 & wait; sleep 300"), filepath.Join(t.TempDir(), "log"), "")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { syscall.Kill(-p.PID, syscall.SIGKILL) }) // its session: sleep too
	time.Sleep(100 * time.Millisecond)
	if err := p.stop(context.Background(), syscall.SIGTERM, 300*time.Millisecond); err != nil {
		t.Fatal(err)
	}
	if p.alive() {
		t.Fatal("alive after stop")
	}
}

func TestStateRoundTrip(t *testing.T) {
	dir := t.TempDir()
	if _, err := Load(dir); !errdefs.IsNotFound(err) {
		t.Fatalf("Load of an empty dir = %v, want not found", err)
	}
	s := &State{Version: stateVersion, Dir: dir, Prefix: "s", Processes: []Proc{{Role: "api", Name: "api-0", PID: 7, StartTime: 9}},
		Netns: []string{"sf1"}, Veths: []string{"sf1h"}, NftTables: []NftName{{"inet", "spore-fleet-s"}}}
	if err := s.save(); err != nil {
		t.Fatal(err)
	}
	fi, err := os.Stat(statePath(dir))
	if err != nil || fi.Mode().Perm() != 0o600 {
		t.Fatalf("state file mode %v %v, want 0600", fi.Mode().Perm(), err)
	}
	got, err := Load(dir)
	if err != nil || got.Processes[0].StartTime != 9 || got.Netns[0] != "sf1" || got.NftTables[0].Name != "spore-fleet-s" {
		t.Fatalf("Load = %+v, %v", got, err)
	}
	s.Version = 99
	s.save()
	if _, err := Load(dir); !errdefs.IsInvalidArgument(err) {
		t.Fatalf("Load of another version = %v, want invalid", err)
	}
}

// up refuses a directory holding a fleet, before it makes anything.
func TestUpRefusesAFleetThatIsUp(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "fleet")
	os.MkdirAll(dir, 0o700)
	s := &State{Version: stateVersion, Dir: dir, Prefix: "s", Started: time.Now(), Nodes: []Node{{Index: 1}}}
	if err := s.save(); err != nil {
		t.Fatal(err)
	}
	_, err := Up(context.Background(), Config{Dir: dir, Nodes: 1, Replicas: 1})
	if !errdefs.IsAlreadyExists(err) || !strings.Contains(err.Error(), "fleet down") {
		t.Fatalf("Up over a fleet = %v, want already exists naming `spore fleet down`", err)
	}
	if _, err := Load(dir); err != nil {
		t.Fatalf("the state of the fleet that is up was touched: %v", err)
	}
	// A non-empty directory that is not a fleet's is refused too.
	other := t.TempDir()
	os.WriteFile(filepath.Join(other, "precious"), []byte("x"), 0o600)
	if _, err := Up(context.Background(), Config{Dir: other, Nodes: 1, Replicas: 1}); !errdefs.IsAlreadyExists(err) {
		t.Fatalf("Up into a non-empty directory = %v, want already exists", err)
	}
}

func TestConfigValidation(t *testing.T) {
	for _, c := range []Config{
		{Dir: "x", Nodes: 0, Replicas: 1},
		{Dir: "x", Nodes: 1, Replicas: 0},
		{Dir: "x", Nodes: 10, Replicas: 1, Prefix: "ab"}, // ab f10 is 5 characters: too long a network prefix
		{Dir: "x", Nodes: 1, Replicas: 1, Prefix: "A1"},
		{Dir: "", Nodes: 1, Replicas: 1},
	} {
		if err := c.validate(); !errdefs.IsInvalidArgument(err) {
			t.Errorf("%+v: %v, want invalid", c, err)
		}
	}
	c := Config{Dir: "x", Nodes: 99, Replicas: 2}
	if err := c.validate(); err != nil || c.Prefix != DefaultPrefix || c.BasePort != DefaultBasePort {
		t.Fatalf("defaults: %+v %v", c, err)
	}
	if ns := netnsName(c.Prefix, 99); len(ns) > 4 {
		t.Fatalf("network prefix %q longer than 4", ns)
	}
}

func TestNodeAddrs(t *testing.T) {
	h, n := nodeAddrs(7)
	if h.String() != "10.201.7.1" || n.String() != "10.201.7.2" {
		t.Fatalf("nodeAddrs(7) = %v %v", h, n)
	}
}

func TestMountsUnder(t *testing.T) {
	if got := unescapeMount(`/a\040b/c`); got != "/a b/c" {
		t.Fatalf("unescape = %q", got)
	}
	if m := mountsUnder("/proc"); len(m) == 0 || m[0] != "/proc" {
		t.Fatalf("mountsUnder(/proc) = %v", m)
	}
	if m := mountsUnder(t.TempDir()); len(m) != 0 {
		t.Fatalf("mounts under a fresh temp dir: %v", m)
	}
}

package gvisor_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/spore-run/spore/internal/ids"
	"github.com/spore-run/spore/internal/runtime"
	"github.com/spore-run/spore/internal/testenv"
)

// TestMemoryAlertsSignalInit: when an instance's memory crosses a share
// of its limit, the driver sends the instance's alert signal to its init
// (which envd's OOM watchdog takes as "check now"); an idle instance gets
// none. (Instances without one get none at all: TestStatsFromHost's init,
// which has no handler, outlives its memory rising past half the limit.)
func TestMemoryAlertsSignalInit(t *testing.T) {
	d := newDriver(t)
	if !d.MemoryAlerts() {
		t.Fatal("this host's memory cgroups take no thresholds (cgroup v1 memory with cgroup.event_control needed)")
	}
	ctx := context.Background()
	id := ids.New('t')
	if err := d.Start(ctx, runtime.Spec{ID: id, RootFS: testenv.BaseRootFS(t), MemoryAlertSignal: "USR2",
		Args:   []string{"/bin/sh", "-c", `trap 'echo alert >> /tmp/alerts' USR2; while :; do sleep 0.1; done`},
		Limits: runtime.Limits{VCPUs: 1, MemoryMB: 512, MaxProcs: 64, DiskMB: 256}}); err != nil {
		t.Fatal(err)
	}
	alerts := func() string {
		var out strings.Builder
		if _, err := d.Exec(ctx, id, runtime.ExecSpec{Args: []string{"/bin/sh", "-c", "cat /tmp/alerts 2>/dev/null; true"}, Stdout: &out}); err != nil {
			t.Fatal(err)
		}
		return out.String()
	}
	time.Sleep(time.Second)
	if got := alerts(); got != "" {
		t.Fatalf("idle instance alerted: %q", got)
	}
	var out strings.Builder
	if code, err := d.Exec(ctx, id, runtime.ExecSpec{Args: []string{"python3", "-c", "import time; x = bytearray(360 << 20); time.sleep(1)"}, Stdout: &out, Stderr: &out}); err != nil || code != 0 {
		t.Fatalf("allocate 360 MiB of 512: %d %v %s", code, err, out.String())
	}
	// Up to 30 s: the alert passes through the host's cgroup event, the
	// driver and the guest's shell, each slow on a loaded host.
	deadline := time.Now().Add(30 * time.Second)
	for alerts() == "" {
		if time.Now().After(deadline) {
			t.Fatal("no alert reached init after memory rose to 70 % of the limit")
		}
		time.Sleep(100 * time.Millisecond)
	}
	t.Logf("init saw: %q", alerts())
}

// TestMemoryAlertsArmedBesideTheStart: thresholds are registered after
// Start returns (each registration waits for a kernel RCU grace period,
// ~65 ms for all: measured as the whole restore overhead over runsc) and
// count as armed meanwhile; a kill right after the start leaves nothing
// armed behind it. (The kill waits for the registration in progress;
// without that wait a late registration fails on the removed cgroup, so
// this test cannot tell the two apart: it pins the outcome.)
func TestMemoryAlertsArmedBesideTheStart(t *testing.T) {
	d := newDriver(t)
	ctx := context.Background()
	for range 3 {
		id := ids.New('t')
		if err := d.Start(ctx, runtime.Spec{ID: id, RootFS: testenv.BaseRootFS(t), MemoryAlertSignal: "USR2",
			Args:   []string{"/bin/sh", "-c", `trap 'true' USR2; while :; do sleep 0.1; done`},
			Limits: runtime.Limits{VCPUs: 1, MemoryMB: 256, MaxProcs: 64, DiskMB: 128}}); err != nil {
			t.Fatal(err)
		}
		if !d.AlertsArmed(id) {
			t.Fatal("alerts neither armed nor being armed after Start")
		}
		if err := d.Kill(ctx, id); err != nil {
			t.Fatal(err)
		}
		if d.AlertsArmed(id) {
			t.Fatal("alerts left armed after the kill")
		}
	}
}

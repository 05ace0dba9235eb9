package control_test

import (
	"errors"
	"os"
	"path/filepath"
	goruntime "runtime"
	"strconv"
	"strings"
	"testing"

	"github.com/spore-run/spore/internal/control"
	"github.com/spore-run/spore/internal/control/controltest"
	"github.com/spore-run/spore/internal/errdefs"
	"github.com/spore-run/spore/internal/nodeapi"
	"github.com/spore-run/spore/internal/nodeapi/local"
	"github.com/spore-run/spore/internal/store"
	"github.com/spore-run/spore/internal/store/sqlite"
)

// A node registers its real capacity and the operator's overcommit
// ratios; the node row keeps both as they are, the fleet list shows them,
// and placement hands out capacity × ratio − reserve: here 2048 MB × 2 −
// 1024 MB = 3 default sandboxes (1024 MB, 2 vCPUs; 2 CPUs × 4 = 8 vCPUs
// would take 4), the fourth is refused for memory. Without the ratio the
// node would take one.
func TestPlacementAppliesNodeOvercommit(t *testing.T) {
	ctx := ctxFor(t)
	st, err := sqlite.Open(ctx, filepath.Join(t.TempDir(), "spore.db"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { st.Close() })
	fake := controltest.New(t)
	ln := local.New(fake.Engine, local.Config{ID: "na",
		Capacity:   nodeapi.Resources{MemoryMB: 2048, VCPUs: 2, Sandboxes: 100},
		Reserved:   nodeapi.Resources{MemoryMB: 1024},
		Overcommit: nodeapi.Overcommit{Memory: 2, VCPUs: 4}})
	ctl := control.New(control.Config{Store: st, Nodes: control.Nodes{"na": ln}})
	t.Cleanup(ctl.Close)
	info, err := ln.Info(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := ctl.Heartbeat(ctx, "na", "na:1", info, true); err != nil {
		t.Fatal(err)
	}
	if err := ctl.Joined(ctx, "na"); err != nil {
		t.Fatal(err)
	}
	row, err := st.GetNode(ctx, "na")
	if err != nil {
		t.Fatal(err)
	}
	if row.Capacity.MemoryMB != 2048 || row.Capacity.VCPUs != 2 || row.Overcommit != (store.Overcommit{Memory: 2, VCPUs: 4}) {
		t.Fatalf("node row: capacity %+v overcommit %+v; want the real 2048 MB, 2 CPUs and ratios 2, 4", row.Capacity, row.Overcommit)
	}
	for i := range 3 {
		if _, err := ctl.Create(ctx, control.CreateRequest{Timeout: control.DefaultTimeout}); err != nil {
			t.Fatalf("create %d of the 3 that fit 2048 MB × 2 − 1024 MB: %v", i+1, err)
		}
	}
	_, err = ctl.Create(ctx, control.CreateRequest{Timeout: control.DefaultTimeout})
	if !errors.Is(err, errdefs.ErrResourceLimit) || !strings.Contains(err.Error(), "lacks 1024 MB free beyond its reserve") {
		t.Fatalf("the fourth create: %v; want a resource limit for memory", err)
	}
	list, err := ctl.Nodes(ctx)
	if err != nil || len(list) != 1 {
		t.Fatalf("nodes: %+v %v", list, err)
	}
	if n := list[0]; n.Sandboxes != 3 || n.MemoryUsedMB != 3072 || n.Capacity.MemoryMB != 2048 || n.Overcommit.Memory != 2 {
		t.Fatalf("node status %+v", n)
	}
}

// A node in process advertises the host's real memory and CPUs, and the
// default ratios unless the operator set others.
func TestLocalNodeAdvertisesRealCapacity(t *testing.T) {
	fake := controltest.New(t)
	info, err := local.New(fake.Engine, local.Config{ID: "na"}).Info(ctxFor(t))
	if err != nil {
		t.Fatal(err)
	}
	var memTotalKB int64
	b, err := os.ReadFile("/proc/meminfo")
	if err != nil {
		t.Fatal(err)
	}
	for _, line := range strings.Split(string(b), "\n") {
		if rest, ok := strings.CutPrefix(line, "MemTotal:"); ok {
			memTotalKB, _ = strconv.ParseInt(strings.TrimSuffix(strings.TrimSpace(rest), " kB"), 10, 64)
		}
	}
	if info.Capacity.MemoryMB != memTotalKB>>10 || info.Capacity.VCPUs != float64(goruntime.NumCPU()) {
		t.Fatalf("capacity %+v: want the host's own %d MB and %d CPUs", info.Capacity, memTotalKB>>10, goruntime.NumCPU())
	}
	if info.Overcommit != (nodeapi.Overcommit{Memory: local.DefaultMemoryOvercommit, VCPUs: local.DefaultCPUOvercommit}) {
		t.Fatalf("overcommit %+v, want the defaults", info.Overcommit)
	}
	set := nodeapi.Overcommit{Memory: 1.5, VCPUs: 3}
	if info, _ := local.New(fake.Engine, local.Config{ID: "nb", Overcommit: set}).Info(ctxFor(t)); info.Overcommit != set {
		t.Fatalf("overcommit %+v, want the operator's %+v", info.Overcommit, set)
	}
}

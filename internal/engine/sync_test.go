package engine_test

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/spore-run/spore/internal/engine"
	"github.com/spore-run/spore/internal/errdefs"
)

// TestSnapshotSyncedAfterTheAnswer: a snapshot answers before its image is
// synced, and is synced in the background. A restart in the same boot
// (the process crashed before the sync) keeps it and syncs it; a restart
// after a power loss (another boot) drops it whole and says so, and the
// rest carries on.
func TestSnapshotSyncedAfterTheAnswer(t *testing.T) {
	f := newFake(t)
	sb := f.create()
	f.set(sb.ID, "x", "1")
	take := func(name string) string {
		t.Helper()
		res, err := f.eng.Snapshot(fctx(t), sb.ID, engine.SnapshotOptions{Names: []string{name}})
		if err != nil {
			t.Fatal(err)
		}
		return res.Manifest.ID
	}
	kept, lost := take("kept"), take("lost")
	f.eng.Settle()
	for _, id := range []string{kept, lost} {
		if !f.eng.Snapshots().Synced(id) {
			t.Fatalf("snapshot %s not synced once the engine settled", id)
		}
	}
	// As if neither sync had ended: one committed in this boot, one in a
	// boot before a power loss.
	boot, err := os.ReadFile("/proc/sys/kernel/random/boot_id")
	if err != nil {
		t.Fatal(err)
	}
	markers := filepath.Join(f.dir, "snapshots", ".unsynced")
	for id, b := range map[string]string{kept: string(boot), lost: "00000000-0000-0000-0000-000000000000\n"} {
		if err := os.WriteFile(filepath.Join(markers, id), []byte(b), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	f.reopen()
	if !strings.Contains(f.logged(), "snapshot lost") || !strings.Contains(f.logged(), lost) {
		t.Fatalf("the lost snapshot was not reported:\n%s", f.logged())
	}
	if _, err := f.eng.Create(fctx(t), engine.CreateOptions{Template: "lost"}); !errdefs.IsNotFound(err) {
		t.Fatalf("create from the lost snapshot = %v, want not found", err)
	}
	if !f.eng.Snapshots().Synced(kept) {
		t.Fatal("the snapshot of this boot was not synced at the restart")
	}
	child, err := f.eng.Create(fctx(t), engine.CreateOptions{Template: "kept"})
	if err != nil {
		t.Fatal(err)
	}
	if got := f.get(child.ID, "x"); got != "1" {
		t.Fatalf("restored x = %q, want 1", got)
	}
	if got := f.get(sb.ID, "x"); got != "1" {
		t.Fatalf("the source after the restart: x = %q", got)
	}
	if take("lost") == lost {
		t.Fatal("the name of the lost snapshot was not free")
	}
}

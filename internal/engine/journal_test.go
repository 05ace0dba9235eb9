package engine_test

import (
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/spore-run/spore/internal/engine"
	"github.com/spore-run/spore/internal/runtime/fake"
)

// Fast tier (fake runtime): recovery never takes the node down, and a
// failed cleanup is never forgotten.

// A corrupted sandbox record (garbage, truncated, a newer version, an
// impossible content) is quarantined: Open succeeds, the other sandboxes
// recover, the bad ones are set aside with their reason, logged at error
// level at every start and listed by Quarantined.
func TestFakeQuarantine(t *testing.T) {
	f := newFake(t)
	good := f.create()
	f.set(good.ID, "x", "kept")
	bad := map[string]func([]byte) []byte{
		"garbage":      func([]byte) []byte { return []byte("{{{ not json") },
		"truncated":    func(b []byte) []byte { return b[:len(b)/2] },
		"version":      func(b []byte) []byte { return setField(t, b, "version", 99) },
		"bad-instance": func(b []byte) []byte { return setField(t, b, "instance", "../etc") },
	}
	byKind := map[string]string{}
	for kind, mangle := range bad {
		sb := f.create()
		byKind[kind] = sb.ID
		b, err := os.ReadFile(f.recordPath(sb.ID))
		if err != nil {
			t.Fatal(err)
		}
		if m := mangle(b); string(m) == string(b) {
			t.Fatalf("%s: mangling changed nothing in %s", kind, b)
		} else if err := os.WriteFile(f.recordPath(sb.ID), m, 0o600); err != nil {
			t.Fatal(err)
		}
	}
	f.reopen()
	list := f.eng.List(fctx(t))
	if len(list) != 1 || list[0].ID != good.ID {
		t.Fatalf("sandboxes after reopen = %v, want only %s", list, good.ID)
	}
	if got := f.get(good.ID, "x"); got != "kept" {
		t.Fatalf("good sandbox's memory x = %q", got)
	}
	check := func() {
		t.Helper()
		q := f.eng.Quarantined()
		if len(q) != len(bad) {
			t.Fatalf("Quarantined() = %+v, want %d records", q, len(bad))
		}
		for kind, id := range byKind {
			i := slices.IndexFunc(q, func(r engine.QuarantinedRecord) bool { return r.Sandbox == id })
			if i < 0 {
				t.Fatalf("%s record %s not quarantined: %+v", kind, id, q)
			}
			if q[i].Reason == "" || filepath.Dir(q[i].File) != filepath.Join(f.dir, "engine", "quarantine") {
				t.Fatalf("%s: quarantined as %+v", kind, q[i])
			}
			if _, err := os.Stat(q[i].File); err != nil {
				t.Fatalf("%s: quarantined file: %v", kind, err)
			}
			if _, err := os.Stat(f.recordPath(id)); !os.IsNotExist(err) {
				t.Fatalf("%s: record still in sandboxes/: %v", kind, err)
			}
			if !strings.Contains(f.logged(), "level=ERROR") || !strings.Contains(f.logged(), id) {
				t.Fatalf("%s: no error logged naming %s", kind, id)
			}
		}
		t.Logf("quarantined: %+v", q)
	}
	check()
	// Their instances, claimed by no valid record, were removed as orphans.
	if got := f.rt.Instances(); len(got) != 1 || got[0] != list[0].Instance {
		t.Fatalf("instances = %v, want only %s", got, list[0].Instance)
	}
	// Still quarantined, still reported, after another restart.
	f.logs.Reset()
	f.reopen()
	check()
	if !strings.Contains(f.logged(), "quarantined sandbox record awaits the operator") {
		t.Fatalf("second start did not report the quarantine:\n%s", f.logged())
	}
}

// setField rewrites one top-level field of a JSON record.
func setField(t *testing.T, b []byte, key string, v any) []byte {
	var m map[string]any
	if err := json.Unmarshal(b, &m); err != nil {
		t.Fatal(err)
	}
	m[key] = v
	out, err := json.Marshal(m)
	if err != nil {
		t.Fatal(err)
	}
	return out
}

// A rollback whose freeing of the replaced instance fails keeps the
// cleanup journaled, across the sandbox's next operations, and retries it
// in the background until the instance is freed.
func TestFakeCleanupRetried(t *testing.T) {
	f := newFake(t)
	ctx := fctx(t)
	sb := f.create()
	f.set(sb.ID, "x", "1")
	snap, err := f.eng.Snapshot(ctx, sb.ID, engine.SnapshotOptions{Names: []string{"one"}})
	if err != nil {
		t.Fatal(err)
	}
	f.set(sb.ID, "x", "2")
	old := sb.Instance
	boom := errors.New("kill failed")
	f.rt.Fail(fake.OpKill, old, 3, boom)
	rb, err := f.eng.Rollback(ctx, sb.ID, snap.Manifest.ID)
	if err != nil {
		t.Fatalf("rollback: %v", err)
	}
	f.eng.Settle()
	if got := f.get(sb.ID, "x"); got != "1" {
		t.Fatalf("x after rollback = %q, want 1", got)
	}
	// The sandbox goes on; its next operations must not lose the entry.
	if _, err := f.eng.Snapshot(ctx, sb.ID, engine.SnapshotOptions{}); err != nil {
		t.Fatal(err)
	}
	if err := f.eng.Pause(ctx, sb.ID); err != nil {
		t.Fatal(err)
	}
	if err := f.eng.Resume(ctx, sb.ID); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "the replaced instance to be freed", func() bool {
		return !slices.Contains(f.rt.Instances(), old)
	})
	waitFor(t, "the cleanup journal to empty", func() bool { return len(f.eng.PendingCleanups()) == 0 })
	if n := f.rt.Calls(fake.OpKill); n < 4 {
		t.Fatalf("kill called %d times, want the 3 failures and a success", n)
	}
	if got := f.rt.Instances(); len(got) != 1 || got[0] != rb.Instance {
		t.Fatalf("instances = %v, want only %s", got, rb.Instance)
	}
}

// A cleanup still failing when the engine stops is finished by the next
// Open.
func TestFakeCleanupAfterRestart(t *testing.T) {
	f := newFake(t)
	ctx := fctx(t)
	sb := f.create()
	snap, err := f.eng.Snapshot(ctx, sb.ID, engine.SnapshotOptions{})
	if err != nil {
		t.Fatal(err)
	}
	old := sb.Instance
	f.rt.Fail(fake.OpKill, old, 1<<20, errors.New("kill failed"))
	if _, err := f.eng.Rollback(ctx, sb.ID, snap.Manifest.ID); err != nil {
		t.Fatal(err)
	}
	f.eng.Settle()
	pc := f.eng.PendingCleanups()
	if len(pc) != 1 || pc[0].Instance != old || pc[0].Sandbox != sb.ID {
		t.Fatalf("pending cleanups = %+v, want the old instance %s", pc, old)
	}
	if !strings.Contains(f.logged(), "cleanup failed: kept in the journal") {
		t.Fatalf("the failure was not logged:\n%s", f.logged())
	}
	f.close()
	if !slices.Contains(f.rt.Instances(), old) {
		t.Fatalf("old instance %s freed although every kill failed", old)
	}
	f.rt.ClearFaults()
	f.open()
	if slices.Contains(f.rt.Instances(), old) {
		t.Fatalf("old instance %s still there after Open", old)
	}
	if pc := f.eng.PendingCleanups(); len(pc) != 0 {
		t.Fatalf("pending cleanups after Open = %+v", pc)
	}
	if _, err := f.eng.Get(ctx, sb.ID); err != nil {
		t.Fatal(err)
	}
}

// A sandbox whose recovery fails (the runtime errs re-attaching to it)
// does not fail Open: it is logged and left as recorded, the others
// recover, and the next Open recovers it.
func TestFakeOpenSurvivesRecoveryFailure(t *testing.T) {
	f := newFake(t)
	a, b := f.create(), f.create()
	f.set(a.ID, "x", "a")
	f.close()
	f.rt.Fail(fake.OpRecover, b.Instance, 1, errors.New("runtime hiccup"))
	f.open()
	if got := f.get(a.ID, "x"); got != "a" {
		t.Fatalf("a's x = %q", got)
	}
	if !strings.Contains(f.logged(), "cannot recover sandbox") {
		t.Fatalf("the failure was not logged:\n%s", f.logged())
	}
	if !slices.Contains(f.rt.Instances(), b.Instance) {
		t.Fatalf("b's instance %s was removed although its record is intact", b.Instance)
	}
	f.reopen()
	if sb, err := f.eng.Get(fctx(t), b.ID); err != nil || sb.State != engine.StateRunning {
		t.Fatalf("b after the next Open = %+v, %v", sb, err)
	}
	if _, err := f.run(b.ID, "true"); err != nil {
		t.Fatal(err)
	}
}

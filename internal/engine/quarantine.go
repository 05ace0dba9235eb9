package engine

import (
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/spore-run/spore/internal/atomicfs"
	"github.com/spore-run/spore/internal/ids"
)

// A sandbox record the engine cannot trust (unreadable, truncated, written
// by a newer engine, naming impossible things) must not stop the engine
// from starting: it is quarantined, moved to engine/quarantine/ beside a
// <file>.reason saying why, logged at error level at every Open while it
// is there, and listed by Quarantined. Its sandbox is gone for the engine
// (an instance only it claimed is removed as an orphan); the file is kept
// for the operator to inspect and delete.

// QuarantinedRecord is a sandbox record set aside at Open.
type QuarantinedRecord struct {
	Sandbox string    `json:"sandbox"` // from the file name
	File    string    `json:"file"`    // where the record now is
	Reason  string    `json:"reason"`
	At      time.Time `json:"at"`
}

func (e *Engine) quarantineDir() string { return filepath.Join(e.dir, "quarantine") }

// validate checks a record read from file <id>.json before recovery acts
// on it: recovery kills instances and deletes snapshots a record names, so
// it must name only well-formed things in a state this engine knows.
func (r *record) validate(id string) error {
	if r.Version > recordVersion || r.Version < 0 {
		return fmt.Errorf("record version %d: this engine reads versions up to %d", r.Version, recordVersion)
	}
	if r.ID != id {
		return fmt.Errorf("record of sandbox %q in the file of %q", r.ID, id)
	}
	if err := ids.Validate("sandbox ID", id); err != nil {
		return err
	}
	opt := func(kind, v string) error {
		if v == "" {
			return nil
		}
		return ids.Validate(kind, v)
	}
	switch r.State {
	case StateRunning, StatePaused:
		// A create journals its record before the instance exists.
		if r.Instance == "" && (r.Pending == nil || r.Pending.Op != opCreate) {
			return fmt.Errorf("%s sandbox names no instance", r.State)
		}
	case StateHibernated:
		if err := ids.Validate("hibernation snapshot ID", r.Hibernation); err != nil {
			return err
		}
	case StateDead:
	default:
		return fmt.Errorf("unknown state %q", r.State)
	}
	if err := opt("instance ID", r.Instance); err != nil {
		return err
	}
	if err := opt("snapshot ID", r.Hibernation); err != nil {
		return err
	}
	if p := r.Pending; p != nil {
		if _, ok := opState[p.Op]; !ok && p.Op != opDiscard {
			return fmt.Errorf("unknown journaled operation %q", p.Op)
		}
		if err := opt("journaled instance ID", p.Instance); err != nil {
			return err
		}
		if err := opt("journaled snapshot ID", p.Snapshot); err != nil {
			return err
		}
	}
	return nil
}

// quarantine moves the record file at path aside with its reason.
func (e *Engine) quarantine(path, id string, reason error) {
	dir := e.quarantineDir()
	name := filepath.Base(path)
	dst := filepath.Join(dir, name)
	if _, err := os.Stat(dst); err == nil {
		name = strings.TrimSuffix(name, ".json") + "-" + strconv.FormatInt(time.Now().UnixNano(), 10) + ".json"
		dst = filepath.Join(dir, name)
	}
	q := QuarantinedRecord{Sandbox: id, File: dst, Reason: reason.Error(), At: time.Now().UTC()}
	err := os.MkdirAll(dir, 0o700)
	if err == nil {
		err = atomicfs.WriteJSON(dst+".reason", q)
	}
	if err == nil {
		err = os.Rename(path, dst)
	}
	if err == nil {
		err = atomicfs.SyncDir(filepath.Dir(path))
	}
	if err != nil {
		// Leave it in place: the next Open tries again; this one goes on
		// without the sandbox.
		e.log.Error("quarantine sandbox record", "file", path, "err", err)
	}
	e.log.Error("sandbox record quarantined: its sandbox is not recovered; inspect and delete the file",
		"sandbox_id", id, "file", dst, "reason", reason)
}

// Quarantined lists the sandbox records set aside at Open, oldest first.
func (e *Engine) Quarantined() []QuarantinedRecord {
	m, _ := filepath.Glob(filepath.Join(e.quarantineDir(), "*.json.reason"))
	var out []QuarantinedRecord
	for _, p := range m {
		var q QuarantinedRecord
		if err := atomicfs.ReadJSON(p, &q); err != nil {
			q = QuarantinedRecord{File: strings.TrimSuffix(p, ".reason"), Reason: "unknown (reason file unreadable: " + err.Error() + ")"}
		}
		if _, err := os.Stat(q.File); err != nil {
			continue // deleted by the operator (the reason file is left)
		}
		out = append(out, q)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].At.Before(out[j].At) })
	return out
}

// reportQuarantine logs, at every Open, the records still in quarantine.
func (e *Engine) reportQuarantine() {
	for _, q := range e.Quarantined() {
		e.log.Error("quarantined sandbox record awaits the operator", "sandbox_id", q.Sandbox, "file", q.File, "reason", q.Reason, "since", q.At)
	}
}

package sdk

import (
	"encoding/json"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/spore-run/spore/internal/testenv"
)

// snapshotRow is GET /snapshots/{id}.
type snapshotRow struct {
	SnapshotID  string `json:"snapshotID"`
	Storage     string `json:"storage"`
	SizeBytes   int64  `json:"sizeBytes"`
	StoredBytes int64  `json:"storedBytes"`
}

// baseSandbox creates a base sandbox for 15 minutes.
func (s *server) baseSandbox() sandboxResp {
	s.t.Helper()
	code, b := s.rest("POST", "/sandboxes", `{"templateID":"base","timeout":900}`)
	if code != 201 {
		s.t.Fatalf("create: %d %s", code, b)
	}
	var sb sandboxResp
	json.Unmarshal(b, &sb)
	return sb
}

// holdMemory starts, in sandbox id, a process holding mib MiB of random
// bytes (its PID in /tmp/holder.pid, the size in /tmp/held once held).
func (s *server) holdMemory(id string, mib int) {
	s.t.Helper()
	s.ok("exec", id, "--", fmt.Sprintf(`rm -f /tmp/held; nohup python3 -c "import os,time
b=bytearray(os.urandom(%d<<20))
open('/tmp/held','w').write(str(len(b)))
time.sleep(100000)" >/dev/null 2>&1 &
echo $! > /tmp/holder.pid
for i in $(seq 600); do [ -s /tmp/held ] && break; sleep 0.1; done; cat /tmp/held`, mib))
}

func (s *server) durableSnapshot(id string) snapshotRow {
	s.t.Helper()
	code, b := s.rest("POST", "/sandboxes/"+id+"/snapshots", `{}`)
	if code != 201 {
		s.t.Fatalf("snapshot: %d %s", code, b)
	}
	var sn snapshotRow
	json.Unmarshal(b, &sn)
	deadline := time.Now().Add(3 * time.Minute)
	for {
		code, b := s.rest("GET", "/snapshots/"+sn.SnapshotID, "")
		json.Unmarshal(b, &sn)
		if code == 200 && sn.Storage == "durable" {
			return sn
		}
		if time.Now().After(deadline) {
			s.t.Fatalf("snapshot %s never durable: %d %s", sn.SnapshotID, code, b)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// `spore up` keeps snapshots in its embedded blob store (a directory):
// each becomes durable in the background, reporting what it stored. A
// sandbox holding 256 MiB of random memory is snapshotted, 1 MiB is
// written, and it is snapshotted again: the second stores under 10 % of
// the first's bytes (content-defined chunks shared). The first is deleted
// and `spore gc` frees its chunks; the second still restores, with the
// file and the memory.
func TestSnapshotDedupeAndGC(t *testing.T) {
	s := newServer(t, "--pool", "0")
	sb := s.baseSandbox()
	s.holdMemory(sb.SandboxID, 256)
	first := s.durableSnapshot(sb.SandboxID)
	if first.StoredBytes < 200<<20 {
		t.Fatalf("first snapshot stored %d bytes, want the 256 MiB of random memory", first.StoredBytes)
	}
	s.ok("exec", sb.SandboxID, "--", "head -c 1048576 /dev/urandom > /home/user/one-mib && sync")
	second := s.durableSnapshot(sb.SandboxID)
	ratio := float64(second.StoredBytes) / float64(first.StoredBytes)
	t.Logf("first snapshot: %d bytes, %d stored; second: %d bytes, %d stored (%.1f %%)",
		first.SizeBytes, first.StoredBytes, second.SizeBytes, second.StoredBytes, 100*ratio)
	if ratio >= 0.10 {
		t.Fatalf("the second snapshot stored %.1f %% of the first's bytes, want under 10 %%", 100*ratio)
	}
	// Delete the first; GC frees what only it used.
	if code, b := s.rest("DELETE", "/templates/"+first.SnapshotID, ""); code != 204 {
		t.Fatalf("delete: %d %s", code, b)
	}
	time.Sleep(1100 * time.Millisecond)
	out := s.ok("gc", "--grace", "1s")
	t.Logf("spore gc: %s", out)
	var freed int
	if _, err := fmt.Sscanf(out, "freed %d chunks", &freed); err != nil || freed == 0 {
		t.Fatalf("gc freed nothing: %q", out)
	}
	code, b := s.rest("POST", "/sandboxes", fmt.Sprintf(`{"templateID":%q,"timeout":300}`, second.SnapshotID))
	if code != 201 {
		t.Fatalf("create from the kept snapshot: %d %s", code, b)
	}
	var again sandboxResp
	json.Unmarshal(b, &again)
	if got := s.ok("exec", again.SandboxID, "--", "wc -c < /home/user/one-mib; cat /tmp/held"); !strings.Contains(got, "1048576") || !strings.Contains(got, "268435456") {
		t.Fatalf("restored from the kept snapshot: %q", got)
	}
	for _, id := range []string{sb.SandboxID, again.SandboxID} {
		s.rest("DELETE", "/sandboxes/"+id, "")
	}
	s.rest("DELETE", "/templates/"+second.SnapshotID, "")
}

// `spore up` SIGKILLed while a snapshot of 256 MiB uploads: after the
// restart the upload starts again and finishes (the snapshot becomes
// durable, nothing half-visible meanwhile: it stays restorable from the
// node's disk), and a sandbox restored from it has its memory.
func TestUploadSurvivesSIGKILL(t *testing.T) {
	s := newServer(t, "--pool", "0")
	sb := s.baseSandbox()
	s.holdMemory(sb.SandboxID, 256)
	code, b := s.rest("POST", "/sandboxes/"+sb.SandboxID+"/snapshots", `{}`)
	if code != 201 {
		t.Fatalf("snapshot: %d %s", code, b)
	}
	var sn snapshotRow
	json.Unmarshal(b, &sn)
	_, b = s.rest("GET", "/snapshots/"+sn.SnapshotID, "")
	s.kill9()
	t.Logf("killed with the snapshot at %s", b)
	s.start()
	code, b = s.rest("GET", "/snapshots/"+sn.SnapshotID, "")
	if code != 200 {
		t.Fatalf("after the restart: %d %s", code, b)
	}
	t.Logf("after the restart: %s", b)
	deadline := time.Now().Add(3 * time.Minute)
	for {
		_, b := s.rest("GET", "/snapshots/"+sn.SnapshotID, "")
		json.Unmarshal(b, &sn)
		if sn.Storage == "durable" {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("never durable after the restart: %s", b)
		}
		time.Sleep(200 * time.Millisecond)
	}
	if sn.StoredBytes <= 0 {
		t.Fatalf("durable: %+v", sn)
	}
	code, b = s.rest("POST", "/sandboxes", fmt.Sprintf(`{"templateID":%q,"timeout":300}`, sn.SnapshotID))
	if code != 201 {
		t.Fatalf("create from it: %d %s", code, b)
	}
	var again sandboxResp
	json.Unmarshal(b, &again)
	if got := s.ok("exec", again.SandboxID, "--", "cat /tmp/held"); got != "268435456" {
		t.Fatalf("restored: %q", got)
	}
	for _, id := range []string{sb.SandboxID, again.SandboxID} {
		s.rest("DELETE", "/sandboxes/"+id, "")
	}
	s.rest("DELETE", "/templates/"+sn.SnapshotID, "")
}

// `spore up` SIGKILLed while `spore gc` deletes (at a seeded moment):
// after the restart the snapshot that was kept restores with its memory,
// and a second gc finishes the job, freeing the rest of what the deleted
// snapshot alone used.
func TestGCSurvivesSIGKILL(t *testing.T) {
	rng := testenv.Rand(t)
	s := newServer(t, "--pool", "0")
	sb := s.baseSandbox()
	s.holdMemory(sb.SandboxID, 128)
	doomed := s.durableSnapshot(sb.SandboxID)
	s.ok("exec", sb.SandboxID, "--", "kill $(cat /tmp/holder.pid); echo kept > /home/user/kept")
	s.holdMemory(sb.SandboxID, 16)
	kept := s.durableSnapshot(sb.SandboxID)
	if code, b := s.rest("DELETE", "/templates/"+doomed.SnapshotID, ""); code != 204 {
		t.Fatalf("delete: %d %s", code, b)
	}
	time.Sleep(1100 * time.Millisecond)
	delay := time.Duration(rng.IntN(150)) * time.Millisecond
	done := make(chan string, 1)
	go func() {
		_, b := s.restQuiet("POST", "/blobs/gc", `{"graceSeconds":1}`)
		done <- string(b)
	}()
	time.Sleep(delay)
	s.kill9()
	t.Logf("killed %v into the gc (it answered: %q)", delay, <-done)
	s.start()
	code, b := s.rest("POST", "/sandboxes", fmt.Sprintf(`{"templateID":%q,"timeout":300}`, kept.SnapshotID))
	if code != 201 {
		t.Fatalf("create from the kept snapshot after the kill: %d %s", code, b)
	}
	var again sandboxResp
	json.Unmarshal(b, &again)
	if got := s.ok("exec", again.SandboxID, "--", "cat /home/user/kept /tmp/held"); !strings.Contains(got, "kept") || !strings.Contains(got, "16777216") {
		t.Fatalf("restored after the kill: %q", got)
	}
	// The killed run's marker may make this one wait (its budget); it then
	// frees what the first left.
	out := s.ok("gc", "--grace", "1s")
	t.Logf("second gc: %s", out)
	if code, b := s.rest("POST", "/blobs/gc", `{"graceSeconds":1,"dryRun":true}`); code != 200 || !strings.Contains(string(b), `"deletedChunks":0`) {
		t.Fatalf("a dry run after both: %d %s", code, b)
	}
	for _, id := range []string{sb.SandboxID, again.SandboxID} {
		s.rest("DELETE", "/sandboxes/"+id, "")
	}
	s.rest("DELETE", "/templates/"+kept.SnapshotID, "")
}

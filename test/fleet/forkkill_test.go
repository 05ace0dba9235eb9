package fleet

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/spore-run/spore/internal/fleet"
	"github.com/spore-run/spore/internal/testenv"
)

// upFleet starts a fleet of nodes node agents and one API replica under
// prefix p with `spore fleet up`, removed with `spore fleet down` when t
// ends (and checked to leave nothing behind).
func upFleet(t testing.TB, nodes int, p string, extra ...string) *harness {
	t.Helper()
	testenv.RequireRoot(t)
	rootfs, runsc := testenv.RootFSDir(t), testenv.Runsc(t)
	sdkModules, _ := filepath.Abs("../sdk/node_modules")
	if _, err := os.Stat(filepath.Join(sdkModules, "e2b", "package.json")); err != nil {
		t.Fatal("test/sdk/node_modules missing: `make sdk-deps` installs it")
	}
	h := &harness{t: t, bin: buildBinaries(t), http: &http.Client{Timeout: 3 * time.Minute}}
	tmp := t.TempDir()
	os.Chmod(tmp, 0o711) // the postgres user reaches its cluster inside
	os.Chmod(filepath.Dir(tmp), 0o711)
	h.dir = filepath.Join(tmp, "fleet")
	h.js = filepath.Join(tmp, "js")
	os.MkdirAll(h.js, 0o755)
	os.Symlink(sdkModules, filepath.Join(h.js, "node_modules"))
	b, _ := os.ReadFile("run.mjs")
	os.WriteFile(filepath.Join(h.js, "run.mjs"), b, 0o644)
	t0 := time.Now()
	args := []string{"fleet", "up", "--nodes", strconv.Itoa(nodes), "--replicas", "1", "--dir", h.dir,
		"--base-port", strconv.Itoa(basePort(t)), "--prefix", p, "--node-arg=--rootfs-dir=" + rootfs, "--node-arg=--runsc=" + runsc,
		// No warm pool: its sandboxes have no user-visible rows, and the
		// test accounts for every sandbox a node holds.
		"--api-arg=--pool=0"}
	out, err := h.spore(append(args, extra...)...)
	t.Cleanup(func() {
		if t.Failed() {
			h.dumpLogs()
		}
		st, lerr := fleet.Load(h.dir)
		if lerr != nil {
			return
		}
		if out, err := h.spore("fleet", "down", "--dir", h.dir); err != nil {
			t.Errorf("cleanup: fleet down: %v\n%s", err, out)
		} else if left := fleet.Leftovers(st); len(left) > 0 {
			t.Errorf("left after down: %v", left)
		}
	})
	if err != nil {
		t.Fatalf("fleet up: %v\n%s", err, out)
	}
	t.Logf("fleet of %d nodes up in %v", nodes, time.Since(t0).Round(time.Second))
	h.reload()
	kb, _ := os.ReadFile(h.st.KeyFile)
	h.key = strings.TrimSpace(string(kb))
	return h
}

// forkResult is one child of a fork's answer.
type forkResult struct {
	Sandbox *sandbox `json:"sandbox"`
	Error   *struct {
		Code    int    `json:"code"`
		Message string `json:"message"`
	} `json:"error"`
}

// fork forks id count times through base; the children the API reported
// created, and the answer.
func (h *harness) fork(base, id string, count int) ([]string, int, string) {
	code, b := h.rest(base, "POST", "/sandboxes/"+id+"/fork", fmt.Sprintf(`{"count":%d,"timeout":1800}`, count))
	var made []string
	if code == 201 {
		var res []forkResult
		if err := json.Unmarshal(b, &res); err != nil {
			h.t.Fatalf("fork answer %s: %v", b, err)
		}
		for _, r := range res {
			if r.Sandbox != nil {
				made = append(made, r.Sandbox.SandboxID)
			}
		}
	}
	return made, code, string(b)
}

// onNode creates sandboxes through base until one lands on node k, and
// kills the others.
func (h *harness) onNode(base string, k int) sandbox {
	h.t.Helper()
	want := h.st.Nodes[k-1].ID
	for range 12 {
		s := h.create(base, 1800)
		if s.ClientID == want {
			return s
		}
		h.rest(base, "DELETE", "/sandboxes/"+s.SandboxID, "")
	}
	h.t.Fatalf("12 creates and none on node %d", k)
	return sandbox{}
}

// TestForkWhileNodeKilled: node K's agent is SIGKILLed at a seeded random
// moment of a fork of 4 of a sandbox on K (before, during or after the
// node makes the children). Afterwards: no child exists twice (on any
// node, or in the list); every child the API reported created is marked
// error/node-lost while K is lost and runs again (and answers) once K is
// back; a child the API did not report is not kept (K's reconcile kills
// it); K is lost and its sandboxes error; the other node's sandbox runs
// untouched; K rejoins after a restart. SPORE_FORKKILL_ROUNDS rounds
// (default 3) on one fleet, each with its own victim and moment; the seed
// is logged (SPORE_TEST_SEED replays).
func TestForkWhileNodeKilled(t *testing.T) {
	rounds := 3
	if v := os.Getenv("SPORE_FORKKILL_ROUNDS"); v != "" {
		rounds, _ = strconv.Atoi(v)
	}
	rng := testenv.Rand(t)
	h := upFleet(t, 2, "k")
	api := h.st.APIURLs[0]

	// How long a fork of 4 takes here: the kill moments spread over it.
	src := h.onNode(api, 1)
	t0 := time.Now()
	made, code, body := h.fork(api, src.SandboxID, 4)
	forkTime := time.Since(t0)
	if code != 201 || len(made) != 4 {
		t.Fatalf("warm-up fork: %d %s", code, body)
	}
	for _, id := range append(made, src.SandboxID) {
		h.rest(api, "DELETE", "/sandboxes/"+id, "")
	}
	t.Logf("a fork of 4 takes %v on this fleet: kills land within 0-%v of the request", forkTime.Round(time.Millisecond), (forkTime * 6 / 5).Round(time.Millisecond))

	for round := 1; round <= rounds; round++ {
		victim := 1 + rng.IntN(2)
		other := 3 - victim
		delay := time.Duration(rng.Int64N(int64(forkTime * 6 / 5)))
		t.Run(fmt.Sprintf("round%d", round), func(t *testing.T) {
			h.t = t
			h.forkKillRound(api, victim, other, delay)
		})
		h.t = t
		if t.Failed() {
			return
		}
	}
}

func (h *harness) forkKillRound(api string, victim, other int, delay time.Duration) {
	t := h.t
	h.reload()
	victimID := h.st.Nodes[victim-1].ID
	src := h.onNode(api, victim)
	bystander := h.onNode(api, other)

	type answer struct {
		made []string
		code int
		body string
	}
	res := make(chan answer, 1)
	go func() {
		made, code, body := h.fork(api, src.SandboxID, 4)
		res <- answer{made, code, body}
	}()
	time.Sleep(delay)
	vp := h.proc(fmt.Sprintf("node-%d", victim))
	if err := syscall.Kill(vp.PID, syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	a := <-res
	t.Logf("node %d (pid %d) killed %v into a fork of %s; the fork answered %d with %d children: %s",
		victim, vp.PID, delay.Round(time.Millisecond), src.SandboxID, a.code, len(a.made), a.body)

	// What the dead agent left on its disk: children it made that the
	// API did not report are the ones its reconcile must kill later.
	onDisk := 0
	for _, on := range h.sandboxRecords() {
		if len(on) == 1 && on[0] == victim {
			onDisk++
		}
	}
	t.Logf("node %d's disk holds %d sandbox records after the kill (source + %d committed children + uncommitted ones)", victim, onDisk, len(a.made))
	if !waitFor(45*time.Second, func() bool { return h.nodes(api)[victimID] == "lost" }) {
		t.Fatalf("node %d not marked lost within 45 s: %v", victim, h.nodes(api))
	}
	// The victim's sandboxes, the committed children among them, error.
	for _, id := range append([]string{src.SandboxID}, a.made...) {
		var got sandbox
		if !waitFor(30*time.Second, func() bool { _, got = h.get(api, id); return got.SporeState == "error" }) {
			t.Fatalf("sandbox %s on the lost node: %s/%s, want error", id, got.SporeState, got.Reason)
		}
		if got.Reason != "node-lost" {
			t.Errorf("sandbox %s on the lost node: reason %q, want node-lost", id, got.Reason)
		}
	}
	if code, got := h.get(api, bystander.SandboxID); code != 200 || got.SporeState != "running" {
		t.Fatalf("the other node's sandbox %s: %d %s", bystander.SandboxID, code, got.SporeState)
	}
	if out := h.run(api, bystander.SandboxID, "echo alive"); out != "alive" {
		t.Fatalf("the other node's sandbox while node %d is lost: %q", victim, out)
	}

	if _, err := fleet.RestartProc(context.Background(), h.dir, fmt.Sprintf("node-%d", victim)); err != nil {
		t.Fatal(err)
	}
	if !waitFor(2*time.Minute, func() bool { return h.nodes(api)[victimID] == "ready" }) {
		t.Fatalf("node %d did not rejoin: %v", victim, h.nodes(api))
	}
	// Committed children survived the agent (runsc kept them): running
	// again, and they answer.
	for _, id := range append([]string{src.SandboxID}, a.made...) {
		var got sandbox
		if !waitFor(30*time.Second, func() bool { _, got = h.get(api, id); return got.SporeState == "running" }) {
			t.Fatalf("sandbox %s after node %d rejoined: %s/%s, want running", id, victim, got.SporeState, got.Reason)
		}
		if out := h.run(api, id, "echo back-"+id); out != "back-"+id {
			t.Fatalf("sandbox %s after the rejoin: %q", id, out)
		}
	}
	// Nothing twice, nothing the store does not know: every sandbox a
	// node holds a record of is one row, on that node.
	var recs map[string][]int
	ok := waitFor(30*time.Second, func() bool {
		recs = h.sandboxRecords()
		for id, on := range recs {
			if code, _ := h.get(api, id); len(on) != 1 || code != 200 {
				return false
			}
		}
		return true
	})
	for id, on := range recs {
		code, got := h.get(api, id)
		switch {
		case len(on) > 1:
			t.Errorf("sandbox %s is on nodes %v: duplicated", id, on)
		case code != 200:
			t.Errorf("node %v keeps sandbox %s the API does not know (%d): an uncommitted child was not cleaned up", on, id, code)
		case h.st.Nodes[on[0]-1].ID != got.ClientID:
			t.Errorf("sandbox %s is on node %d, its row says %s", id, on[0], got.ClientID)
		}
	}
	if !ok {
		t.Fatalf("records after the rejoin: %v", recs)
	}
	code, lb := h.rest(api, "GET", "/v2/sandboxes?limit=100", "")
	var listed []sandbox
	json.Unmarshal(lb, &listed)
	seen := map[string]bool{}
	for _, s := range listed {
		if seen[s.SandboxID] {
			t.Errorf("sandbox %s listed twice", s.SandboxID)
		}
		seen[s.SandboxID] = true
	}
	want := 2 + len(a.made)
	if code != 200 || len(listed) != want {
		t.Errorf("listed %d sandboxes (%d), want %d (source, bystander, %d committed children): %s", len(listed), code, want, len(a.made), lb)
	}
	t.Logf("after the rejoin: %d sandboxes listed, node records %v", len(listed), recs)
	for _, s := range listed {
		if c, b := h.rest(api, "DELETE", "/sandboxes/"+s.SandboxID, ""); c != 204 {
			t.Errorf("kill %s: %d %s", s.SandboxID, c, b)
		}
	}
}

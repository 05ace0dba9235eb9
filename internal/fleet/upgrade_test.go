package fleet

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/spore-run/spore/internal/errdefs"
	"github.com/spore-run/spore/internal/ids"
)

// fakeSpore writes an executable standing in for a spore binary: `version`
// prints "spore <tag>"; anything else appends "start <tag> <args>" to the
// events file, and "stop <tag> <args>" when it gets SIGTERM. With exitAtOnce
// it exits right after its start line (a binary that cannot run here).
func fakeSpore(t *testing.T, dir, tag, events string, exitAtOnce bool) string {
	t.Helper()
	body := fmt.Sprintf(`#!/bin/sh
if [ "$1" = version ]; then echo "spore %[1]s"; exit 0; fi
echo "start %[1]s $*" >> %[2]s
`, tag, events)
	if exitAtOnce {
		body += "exit 3\n"
	} else {
		body += fmt.Sprintf(`trap 'echo "stop %[1]s $*" >> %[2]s; exit 0' TERM
while :; do sleep 0.02; done
`, tag, events)
	}
	p := filepath.Join(dir, tag)
	if err := os.WriteFile(p, []byte(body), 0o755); err != nil {
		t.Fatal(err)
	}
	return p
}

// fakeAPI stands in for the fleet's API replicas (replica I under /rI/):
// GET /nodes, drain, undrain, the snapshot and sandbox lists, /health.
// Each call that acts is appended to the events file, among the fake
// processes' lines. A process the fleet state records has "registered"
// once it has run for registerAfter (a binary that exits at its start
// never does): a node's heartbeat is fresh from then on, and a replica
// answers; before, the replica's connections are closed unanswered, as
// a replica being replaced refuses them.
type fakeAPI struct {
	t      *testing.T
	dir    string // the fleet's
	events string
	mu     sync.Mutex
	nodes  map[string]*fakeNode
	seen   map[int]time.Time // when each process was first seen running
	heard  map[int]bool      // replica processes that answered a request
	st     *State            // the fleet state, read at each request
}

const registerAfter = 300 * time.Millisecond

type fakeNode struct {
	name       string
	state      string
	draining   bool
	sandboxes  int
	perDrain   []int // sandboxes the nth drain leaves (a create racing the drain)
	drains     int
	uploading  int // polls of the snapshot list that still show one uploading
	drainFails bool
}

func (f *fakeAPI) event(format string, args ...any) {
	fh, err := os.OpenFile(f.events, os.O_APPEND|os.O_CREATE|os.O_WRONLY, 0o600)
	if err != nil {
		f.t.Error(err)
		return
	}
	defer fh.Close()
	fmt.Fprintf(fh, format+"\n", args...)
}

func (f *fakeAPI) registered(name string) bool {
	p, ok := f.running(name)
	if !ok {
		return false
	}
	if _, ok := f.seen[p.PID]; !ok {
		f.seen[p.PID] = time.Now()
	}
	return time.Since(f.seen[p.PID]) >= registerAfter
}

// running finds the process the state records as name, if it runs.
func (f *fakeAPI) running(name string) (Proc, bool) {
	for _, p := range f.st.Processes {
		if p.Name == name && p.alive() {
			return p, true
		}
	}
	return Proc{}, false
}

func (f *fakeAPI) handler() http.Handler {
	inner := http.NewServeMux()
	for _, p := range []string{"GET /health", "GET /nodes", "POST /nodes/{id}/drain", "POST /nodes/{id}/undrain", "GET /snapshots", "GET /v2/sandboxes"} {
		inner.HandleFunc(p, f.serve)
	}
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		f.mu.Lock()
		defer f.mu.Unlock()
		var err error
		if f.st, err = Load(f.dir); err != nil {
			f.t.Error(err)
			return
		}
		replica, rest, _ := strings.Cut(strings.TrimPrefix(r.URL.Path, "/r"), "/")
		if !f.registered("api-" + replica) {
			if c, _, err := http.NewResponseController(w).Hijack(); err == nil {
				c.Close()
			}
			return
		}
		// The first answer of each replica process is an event: the next
		// replica must not be stopped before the new one answers.
		if p, _ := f.running("api-" + replica); !f.heard[p.PID] {
			f.heard[p.PID] = true
			f.event("api-%s answers", replica)
		}
		r2 := r.Clone(r.Context())
		r2.URL.Path, r2.URL.RawPath = "/"+rest, ""
		inner.ServeHTTP(w, r2)
	})
}

// serve answers one request (under f.mu).
func (f *fakeAPI) serve(w http.ResponseWriter, r *http.Request) {
	if r.URL.Path != "/health" && r.Header.Get("X-API-KEY") != "the-key" {
		w.WriteHeader(http.StatusUnauthorized)
		return
	}
	id := r.PathValue("id")
	switch r.Pattern {
	case "GET /health":
	case "GET /nodes":
		var out []nodeStatus
		for id, n := range f.nodes {
			age := int64(60_000)
			if f.registered(n.name) {
				age = 0
			}
			out = append(out, nodeStatus{NodeID: id, State: n.state, Draining: n.draining, Sandboxes: n.sandboxes, HeartbeatAgeMs: age})
		}
		json.NewEncoder(w).Encode(out)
	case "POST /nodes/{id}/drain":
		n := f.nodes[id]
		if n.drainFails {
			http.Error(w, "drain: hibernate: unavailable", http.StatusServiceUnavailable)
			return
		}
		f.event("drain %s", n.name)
		n.draining = true
		hib := n.sandboxes
		n.sandboxes = 0
		if n.drains < len(n.perDrain) {
			n.sandboxes = n.perDrain[n.drains]
		}
		n.drains++
		json.NewEncoder(w).Encode(map[string]any{"nodeID": id, "hibernated": hib})
	case "POST /nodes/{id}/undrain":
		n := f.nodes[id]
		f.event("undrain %s", n.name)
		n.draining = false
		w.WriteHeader(http.StatusNoContent)
	case "GET /snapshots":
		var out []map[string]string
		for id, n := range f.nodes {
			if n.uploading > 0 {
				n.uploading--
				out = append(out, map[string]string{"nodeID": id, "storage": "uploading"})
				if n.uploading == 0 {
					f.event("durable %s", n.name)
				}
			}
		}
		json.NewEncoder(w).Encode(out)
	case "GET /v2/sandboxes":
		// The sandboxes each node holds now, running, named after it.
		out := []map[string]string{}
		for id, n := range f.nodes {
			for k := range n.sandboxes {
				out = append(out, map[string]string{"sandboxID": fmt.Sprintf("%s-sb%d", n.name, k), "clientID": id, "sporeState": "running"})
			}
		}
		json.NewEncoder(w).Encode(out)
	}
}

type upgradeFixture struct {
	dir, events, oldExe, newExe string
	api                         *fakeAPI
	ids                         []string // node IDs
}

// newUpgradeFixture records a fleet of two nodes and two replicas whose
// processes run oldExe, and a fake API for them. Node 1 has a blob store
// and 2 sandboxes; node 2 none, and was draining before.
func newUpgradeFixture(t *testing.T) *upgradeFixture {
	tmp := t.TempDir()
	fx := &upgradeFixture{dir: filepath.Join(tmp, "fleet"), events: filepath.Join(tmp, "events")}
	os.MkdirAll(fx.dir, 0o700)
	fx.oldExe = fakeSpore(t, tmp, "old", fx.events, false)
	fx.newExe = fakeSpore(t, tmp, "new", fx.events, false)
	fx.api = &fakeAPI{t: t, dir: fx.dir, events: fx.events, nodes: map[string]*fakeNode{}, seen: map[int]time.Time{}, heard: map[int]bool{}}
	srv := httptest.NewServer(fx.api.handler())
	t.Cleanup(srv.Close)
	st := &State{Version: stateVersion, Dir: fx.dir, Complete: true, Executable: fx.oldExe,
		KeyFile: filepath.Join(fx.dir, "api-key"), APIURLs: []string{srv.URL + "/r0", srv.URL + "/r1"}}
	os.WriteFile(st.KeyFile, []byte("the-key\n"), 0o600)
	stores := []string{"s3://spore?endpoint=http://{host}:9000", "none"}
	for k := 1; k <= 2; k++ {
		id := ids.New('n')
		fx.ids = append(fx.ids, id)
		st.Nodes = append(st.Nodes, Node{Index: k, ID: id, PurgeArgs: []string{"--data-dir", "d", "--blob-store", stores[k-1]}})
		fx.api.nodes[id] = &fakeNode{name: fmt.Sprintf("node-%d", k), state: "ready"}
	}
	n1, n2 := fx.api.nodes[fx.ids[0]], fx.api.nodes[fx.ids[1]]
	n1.sandboxes, n1.uploading = 2, 3
	n2.sandboxes, n2.perDrain, n2.draining = 1, []int{1, 0}, true
	for i, name := range []string{"node-1", "node-2", "api-0", "api-1"} {
		p, err := start(exec.Command(fx.oldExe, name), filepath.Join(tmp, name+".log"), "")
		if err != nil {
			t.Fatal(err)
		}
		p.Role, p.Name = strings.Split(name, "-")[0], name
		st.Processes = append(st.Processes, p)
		waitLines(t, fx.events, i+1) // its start line, in this order
	}
	st.Processes = append(st.Processes, Proc{Role: "postgres", Name: "postgres", PID: 1, Args: []string{"postgres"}})
	if err := st.save(); err != nil {
		t.Fatal(err)
	}
	started := append([]Proc{}, st.Processes[:4]...)
	t.Cleanup(func() {
		procs := started
		if st, err := Load(fx.dir); err == nil {
			procs = append(procs, st.Processes[:4]...)
		}
		for _, p := range procs {
			if p.alive() {
				syscall.Kill(p.PID, syscall.SIGKILL)
			}
		}
	})
	return fx
}

// actions are the events that change something: everything but the
// fixture's starts and the replicas' first answers.
func actions(fx *upgradeFixture) []string {
	b, _ := os.ReadFile(fx.events)
	var out []string
	for _, l := range strings.Split(strings.TrimSpace(string(b)), "\n") {
		if !strings.HasPrefix(l, "start old ") && !strings.HasSuffix(l, " answers") {
			out = append(out, l)
		}
	}
	return out
}

func waitLines(t *testing.T, path string, n int) []string {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		b, _ := os.ReadFile(path)
		lines := strings.Split(strings.TrimSpace(string(b)), "\n")
		if len(b) == 0 {
			lines = nil // not one empty line: the first start must be waited for
		}
		if len(lines) >= n || time.Now().After(deadline) {
			return lines
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// testTimeouts: short polls; the drain's 3 s is what a failing drain
// waits. The waits for a process to come up and for the uploads end as
// soon as that happens (or the process exits): 30 s, not 5, as a loaded
// host starts processes slowly.
var testTimeouts = upgradeTimeouts{drain: 3 * time.Second, durable: 30 * time.Second, ready: 30 * time.Second, poll: 20 * time.Millisecond}

// The rolling upgrade's order: each node drained (again while it still
// holds a sandbox), what it held durable, stopped, started on the new
// binary, ready, undrained (unless it was draining before); then each
// replica, one at a time. Every spore process ends on the new binary,
// recorded in the state; PostgreSQL is not touched.
func TestRollingUpgradeOrder(t *testing.T) {
	fx := newUpgradeFixture(t)
	steps, err := rollingUpgrade(context.Background(), fx.dir, fx.newExe, "", nil, testTimeouts)
	if err != nil {
		t.Fatal(err)
	}
	want := []string{
		"start old node-1", "start old node-2", "start old api-0", "start old api-1",
		"api-0 answers", "api-1 answers", // the checks before anything changes
		"drain node-1", "durable node-1", "stop old node-1", "start new node-1", "undrain node-1",
		"drain node-2", "drain node-2", "stop old node-2", "start new node-2", // node 2 was draining before: stays so
		"stop old api-0", "start new api-0", "api-0 answers",
		"stop old api-1", "start new api-1", "api-1 answers",
	}
	got := waitLines(t, fx.events, len(want))
	if strings.Join(got, "\n") != strings.Join(want, "\n") {
		t.Fatalf("events:\n%s\nwant:\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
	}
	st, err := Load(fx.dir)
	if err != nil {
		t.Fatal(err)
	}
	if st.Executable != fx.newExe {
		t.Errorf("state executable %s, want %s", st.Executable, fx.newExe)
	}
	for _, p := range st.Processes[:4] {
		if p.Args[0] != fx.newExe || p.Args[1] != p.Name || !p.alive() {
			t.Errorf("%s: args %v alive %v, want %s %s running", p.Name, p.Args, p.alive(), fx.newExe, p.Name)
		}
	}
	if p := st.Processes[4]; p.PID != 1 || p.Args[0] != "postgres" {
		t.Errorf("postgres touched: %+v", p)
	}
	if len(steps) != 4 || steps[0].Hibernated != 2 || steps[0].Drains != 1 || steps[1].Hibernated != 2 || steps[1].Drains != 2 {
		t.Fatalf("steps %+v", steps)
	}
	// Each node's sandboxes, listed before its drain (node 2's second,
	// a create racing the first drain, is listed after it).
	if got := fmt.Sprint(steps[0].Sandboxes, steps[1].Sandboxes, steps[2].Sandboxes); got != "[node-1-sb0 node-1-sb1] [node-2-sb0] []" {
		t.Errorf("sandboxes the drains dealt with: %s", got)
	}
	for _, s := range steps {
		if !(s.Began.Before(s.Stopped) || s.Began.Equal(s.Stopped)) || !s.Stopped.Before(s.Ready) || s.Done.Before(s.Ready) {
			t.Errorf("step %s: times out of order %+v", s.Name, s)
		}
		if s.NodeID != "" && (s.Drained.Before(s.Began) || s.Stopped.Before(s.Drained)) {
			t.Errorf("step %s: drained at %v, not between its start and its stop %+v", s.Name, s.Drained, s)
		}
	}
}

// A node whose drain keeps failing is never stopped: the upgrade ends
// there, saying the node is left drained, and nothing else is touched.
func TestRollingUpgradeStopsWhenADrainFails(t *testing.T) {
	fx := newUpgradeFixture(t)
	fx.api.nodes[fx.ids[0]].drainFails = true
	before, _ := Load(fx.dir)
	_, err := rollingUpgrade(context.Background(), fx.dir, fx.newExe, "", nil, testTimeouts)
	if err == nil || !strings.Contains(err.Error(), "left drained") || !strings.Contains(err.Error(), "spore node undrain "+fx.ids[0]) {
		t.Fatalf("err = %v, want the node left drained", err)
	}
	after, _ := Load(fx.dir)
	for i, p := range after.Processes[:4] {
		if p.PID != before.Processes[i].PID || p.Args[0] != fx.oldExe || !p.alive() {
			t.Errorf("%s replaced or stopped after a failed drain: %+v", p.Name, p)
		}
	}
	if acts := actions(fx); len(acts) != 0 {
		t.Errorf("acted: %v", acts)
	}
}

// A new binary that exits at its start leaves its node drained and the
// rest on the old binary; the error carries its log's tail.
func TestRollingUpgradeStopsWhenTheNewNodeDoesNotComeUp(t *testing.T) {
	fx := newUpgradeFixture(t)
	bad := fakeSpore(t, t.TempDir(), "bad", fx.events, true)
	_, err := rollingUpgrade(context.Background(), fx.dir, bad, "", nil, testTimeouts)
	if err == nil || !strings.Contains(err.Error(), "exited after its start") || !strings.Contains(err.Error(), "left drained") {
		t.Fatalf("err = %v", err)
	}
	waitLines(t, fx.events, 10)
	want := []string{"drain node-1", "durable node-1", "stop old node-1", "start bad node-1"} // no undrain, nothing after
	if acts := actions(fx); strings.Join(acts, ",") != strings.Join(want, ",") {
		t.Fatalf("acted %v, want %v", acts, want)
	}
	st, _ := Load(fx.dir)
	for _, p := range st.Processes[1:4] {
		if p.Args[0] != fx.oldExe || !p.alive() {
			t.Errorf("%s touched: %+v", p.Name, p)
		}
	}
}

// Bad input changes nothing: no such file, not executable, not spore;
// a fleet with a node not ready; a process that is not spore's or none.
func TestUpgradeRefusals(t *testing.T) {
	fx := newUpgradeFixture(t)
	ctx := context.Background()
	tmp := t.TempDir()
	plain := filepath.Join(tmp, "plain")
	os.WriteFile(plain, []byte("#!/bin/sh\necho spore 1\n"), 0o644)
	for _, exe := range []string{"", filepath.Join(tmp, "missing"), plain, "/bin/true", tmp} {
		if _, err := rollingUpgrade(ctx, fx.dir, exe, "", nil, testTimeouts); !errdefs.IsInvalidArgument(err) {
			t.Errorf("executable %q: %v, want invalid", exe, err)
		}
		if _, err := UpgradeProc(ctx, fx.dir, "api-0", exe); !errdefs.IsInvalidArgument(err) {
			t.Errorf("UpgradeProc with %q: %v, want invalid", exe, err)
		}
	}
	if _, err := UpgradeProc(ctx, fx.dir, "postgres", fx.newExe); !errdefs.IsInvalidArgument(err) {
		t.Errorf("UpgradeProc postgres: %v, want invalid", err)
	}
	if _, err := UpgradeProc(ctx, fx.dir, "api-7", fx.newExe); !errdefs.IsNotFound(err) {
		t.Errorf("UpgradeProc api-7: %v, want not found", err)
	}
	fx.api.mu.Lock()
	fx.api.nodes[fx.ids[1]].state = "lost"
	fx.api.mu.Unlock()
	if _, err := rollingUpgrade(ctx, fx.dir, fx.newExe, "", nil, testTimeouts); !errdefs.IsConflict(err) || !strings.Contains(err.Error(), "not ready") {
		t.Errorf("a lost node: %v, want conflict", err)
	}
	if _, err := rollingUpgrade(ctx, fx.dir, fx.newExe, "wrong-key", nil, testTimeouts); err == nil {
		t.Error("a wrong API key: no error")
	}
	if acts := actions(fx); len(acts) != 0 {
		t.Errorf("refused upgrades acted: %v", acts)
	}
	if st, _ := Load(fx.dir); st.Executable != fx.oldExe {
		t.Errorf("state executable changed to %s", st.Executable)
	}
}

// UpgradeProc replaces one process with the same arguments, and records it.
func TestUpgradeProc(t *testing.T) {
	fx := newUpgradeFixture(t)
	before, _ := Load(fx.dir)
	p, err := UpgradeProc(context.Background(), fx.dir, "api-1", fx.newExe)
	if err != nil {
		t.Fatal(err)
	}
	if before.Processes[3].alive() || !p.alive() || p.Role != "api" || strings.Join(p.Args, " ") != fx.newExe+" api-1" {
		t.Fatalf("old alive %v, new %+v", before.Processes[3].alive(), p)
	}
	st, _ := Load(fx.dir)
	if st.Processes[3].PID != p.PID || st.Processes[3].Args[0] != fx.newExe {
		t.Fatalf("state not updated: %+v", st.Processes[3])
	}
	want := []string{"stop old api-1", "start new api-1"}
	waitLines(t, fx.events, 6)
	if got := actions(fx); strings.Join(got, ",") != strings.Join(want, ",") {
		t.Fatalf("acted %v, want %v", got, want)
	}
}

func TestSharedStore(t *testing.T) {
	for args, want := range map[string]bool{
		"--data-dir d --blob-store s3://b?endpoint=x": true,
		"--blob-store /srv/blobs":                     true,
		"--blob-store=/srv/blobs":                     true,
		"--blob-store none":                           false,
		"--blob-store /srv/blobs --blob-store=none":   false, // the last one counts
		"--data-dir d":                                false,
	} {
		if got := sharedStore(Node{PurgeArgs: strings.Fields(args)}); got != want {
			t.Errorf("%s: %v, want %v", args, got, want)
		}
	}
}

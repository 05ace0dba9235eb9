package sdk

import (
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/spore-run/spore/internal/api"
)

// 50 concurrent clients create, use (through the proxy), snapshot, fork
// and kill for a bounded time. Only documented statuses may come back
// (2xx, 409, 429, 503); afterwards nothing has leaked: sandboxes,
// instances, namespaces, the server's goroutines, files and heap.
func TestLoad(t *testing.T) {
	// A fixed number of restore targets: the leak check below compares the
	// server's goroutines and files with the warm-up's, and every target
	// holds some (its network's egress listeners). The load's bursts would
	// grow the pools to 16 per shape for 5 minutes; that growth, the
	// release and the freeing are tested in internal/engine and
	// internal/node.
	s := newServer(t, "--pool", "0", "--restore-targets-burst", "0")
	stats := func() api.Stats {
		code, b := s.rest("GET", "/debug/stats", "")
		var st api.Stats
		if code != 200 || json.Unmarshal(b, &st) != nil {
			t.Fatalf("stats: %d %s", code, b)
		}
		return st
	}
	// Warm up once so lazily created state (connection pools, caches) is
	// in the baseline. On an idle server the whole iteration succeeds: the
	// positive control for the run below.
	if got, complete := s.loadIteration(0); !complete {
		t.Fatalf("one client on an idle server did not complete an iteration: %v", got)
	}
	time.Sleep(500 * time.Millisecond)
	before := stats()

	const clients = 50
	deadline := time.Now().Add(20 * time.Second)
	var mu sync.Mutex
	statuses := map[string]int{}
	iterations, complete := 0, 0
	var wg sync.WaitGroup
	for c := range clients {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for time.Now().Before(deadline) {
				got, ok := s.loadIteration(c)
				mu.Lock()
				for k, v := range got {
					statuses[k] += v
				}
				iterations++
				if ok {
					complete++
				}
				mu.Unlock()
			}
		}()
	}
	wg.Wait()
	summary, problems := judgeLoad(statuses, complete)
	t.Logf("%d clients, %d iterations (%d complete) in 20 s: %s", clients, iterations, complete, summary)
	for _, p := range problems {
		t.Error(p)
	}
	// The server's metrics counted the load's creates, and show its
	// engine's launch slots (spore up's engine collector).
	if code, body := s.rest("GET", "/metrics", ""); code != 200 ||
		!regexp.MustCompile(`(?m)^spore_api_requests_total\{code="201",route="POST /v2/sandboxes"\} [1-9]`).Match(body) ||
		!regexp.MustCompile(`(?m)^spore_engine_launch_slots [1-9]`).Match(body) {
		t.Errorf("metrics after the load: %d, creates or launch slots missing:\n%.3000s", code, body)
	}

	// Clean up whatever the clients left (iterations cut by the deadline).
	code, body := s.rest("GET", "/v2/sandboxes", "")
	if code != 200 {
		t.Errorf("list sandboxes after the load: %d %s", code, body)
	}
	var left []sandboxResp
	json.Unmarshal(body, &left)
	for _, sb := range left {
		s.rest("DELETE", "/sandboxes/"+sb.SandboxID, "")
	}
	code, body = s.rest("GET", "/snapshots?limit=1000", "")
	if code != 200 {
		t.Errorf("list snapshots after the load: %d %s", code, body)
	}
	var snaps []struct {
		SnapshotID string `json:"snapshotID"`
	}
	json.Unmarshal(body, &snaps)
	for _, sn := range snaps {
		s.rest("DELETE", "/templates/"+sn.SnapshotID, "")
	}
	if code, body = s.rest("GET", "/v2/sandboxes", ""); code != 200 || string(body) != "[]\n" {
		t.Fatalf("sandboxes left: %s", body)
	}
	// Nothing of the sandboxes is left: no record, and the runtime holds
	// only restore targets (sandboxes booted ahead, two per shape, that no
	// record names), each whole: directory, network, cgroups, mounts.
	if recs, _ := filepath.Glob(filepath.Join(s.data, "engine", "sandboxes", "*.json")); len(recs) != 0 {
		t.Fatalf("sandbox records left: %v", recs)
	}
	// Until it holds, for up to 30 s: the background work the load left
	// (restore targets being made, teardowns) is slow on a loaded host.
	for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(100 * time.Millisecond) {
		err := s.checkNoOrphans(t, nil)
		if err == nil {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal(err)
		}
	}
	// No sandbox process of this server's runtime is left but the
	// targets' (their command lines name their instance directories).
	out, err := exec.Command(testenvRunsc(t), "--root="+filepath.Join(s.data, "runtime", "root"), "list", "--format=json").Output()
	if err != nil {
		t.Fatal(err)
	}
	var targets []struct {
		ID string `json:"id"`
	}
	json.Unmarshal(out, &targets)
	procs, _ := os.ReadDir("/proc")
	for _, p := range procs {
		cmd, err := os.ReadFile(filepath.Join("/proc", p.Name(), "cmdline"))
		if err != nil || !strings.Contains(string(cmd), "--root="+filepath.Join(s.data, "runtime", "root")) || !strings.HasPrefix(string(cmd), "runsc-") {
			continue
		}
		target := false
		for _, in := range targets {
			target = target || strings.Contains(string(cmd), filepath.Join(s.data, "runtime", "inst", in.ID)+"/")
		}
		if !target {
			t.Fatalf("sandbox process left: %d %q", len(cmd), strings.ReplaceAll(string(cmd), "\x00", " ")[:80])
		}
	}
	// Mounts: under the data directory only runsc's pinned empty
	// namespace and the node's empty volume slot (the read-only tmpfs
	// behind its templates' unused volume slots).
	mi, _ := os.ReadFile("/proc/self/mountinfo")
	if n := strings.Count(string(mi), s.data) - strings.Count(string(mi), filepath.Join(s.data, "volumes", "empty")+" "); n > 1 {
		t.Fatalf("%d mounts under the data directory", n)
	}
	// The server is back to where it started, once the snapshots' uploads
	// it queued in the background (each a goroutine; uploadWorkers at a
	// time) are over: bounded work, not a leak. Each upload of a snapshot
	// deleted meanwhile ends at once.
	var after api.Stats
	waited := time.Now()
	for after = stats(); after.Uploads > 0 && time.Since(waited) < 3*time.Minute; after = stats() {
		time.Sleep(250 * time.Millisecond)
	}
	if after.Uploads > 0 {
		t.Errorf("%d background uploads still queued or running 3 minutes after the load", after.Uploads)
	}
	t.Logf("background uploads over %v after the load", time.Since(waited).Round(100*time.Millisecond))
	// What the load left winds down (connections closing, their
	// goroutines ending): waited for up to 30 s, as a loaded host is slow
	// to; a leak stays.
	for deadline := time.Now().Add(30 * time.Second); time.Now().Before(deadline); {
		time.Sleep(250 * time.Millisecond)
		if after = stats(); after.Goroutines <= before.Goroutines+5 && after.OpenFiles <= before.OpenFiles+5 {
			break
		}
	}
	t.Logf("server before: %+v, after: %+v", before, after)
	if after.Goroutines > before.Goroutines+5 {
		t.Errorf("goroutines %d -> %d", before.Goroutines, after.Goroutines)
		// Which: the server's goroutines grouped by stack.
		if code, b := s.rest("GET", "/debug/pprof/goroutine?debug=1", ""); code == 200 {
			t.Logf("the server's goroutines:\n%s", b)
		} else {
			t.Logf("goroutine profile: %d %s", code, b)
		}
	}
	if after.OpenFiles > before.OpenFiles+5 {
		t.Errorf("open files %d -> %d", before.OpenFiles, after.OpenFiles)
	}
	if after.HeapAlloc > 2*before.HeapAlloc+16<<20 {
		t.Errorf("heap %d -> %d", before.HeapAlloc, after.HeapAlloc)
	}
}

// Load thresholds: a server that refuses everything (documented 429s and
// 503s only) must fail TestLoad. The last measured run completed 80
// iterations, every answer 2xx (docs/reliability.md, "Load").
const (
	minCompleteIterations = 10  // whole iterations, every step 2xx
	min2xxShare           = 0.5 // of all answers
)

// judgeLoad summarizes the answers of a load run and says what is wrong
// with it: an undocumented status, too few complete iterations, too small
// a share of successes.
func judgeLoad(statuses map[string]int, complete int) (summary string, problems []string) {
	var keys []string
	for k := range statuses {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	var parts []string
	total, ok := 0, 0
	for _, k := range keys {
		n := statuses[k]
		parts = append(parts, fmt.Sprintf("%s=%d", k, n))
		code := k[strings.LastIndexByte(k, ' ')+1:]
		total += n
		switch code {
		case "200", "201", "204":
			ok += n
		case "409", "429", "503":
		default:
			problems = append(problems, fmt.Sprintf("undocumented answer under load: %s x%d", k, n))
		}
	}
	if complete < minCompleteIterations {
		problems = append(problems, fmt.Sprintf("%d complete iterations, want at least %d", complete, minCompleteIterations))
	}
	if total == 0 || float64(ok) < min2xxShare*float64(total) {
		problems = append(problems, fmt.Sprintf("%d of %d answers were 2xx, want at least %.0f%%", ok, total, 100*min2xxShare))
	}
	return strings.Join(parts, " "), problems
}

// TestLoad's judgement fails a server that refuses everything with
// documented statuses (here: 503 to every request), and passes one that
// serves: the check behind TestLoad is not vacuous. Needs no runtime.
func TestLoadJudgesRefusals(t *testing.T) {
	refusing := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusServiceUnavailable)
		fmt.Fprint(w, `{"code":503,"message":"busy"}`)
	}))
	defer refusing.Close()
	s := &server{t: t, addr: strings.TrimPrefix(refusing.URL, "http://")}
	statuses, complete := map[string]int{}, 0
	for c := range 50 {
		got, ok := s.loadIteration(c)
		for k, v := range got {
			statuses[k] += v
		}
		if ok {
			complete++
		}
	}
	summary, problems := judgeLoad(statuses, complete)
	if complete != 0 || len(problems) < 2 {
		t.Fatalf("a server answering 503 to everything: %d complete, %s, problems %v", complete, summary, problems)
	}
	t.Logf("refusing server: %s -> %v", summary, problems)
	served := map[string]int{"create 201": 20, "upload 200": 20, "snapshot 201": 19, "snapshot 503": 1, "kill 204": 20}
	if _, problems := judgeLoad(served, 19); len(problems) != 0 {
		t.Fatalf("a serving run was judged a failure: %v", problems)
	}
}

// loadIteration is one client's round: create, use, snapshot, fork, kill.
// It returns how many times each "operation status" came back, and
// whether every step of the round succeeded (complete).
func (s *server) loadIteration(c int) (got map[string]int, complete bool) {
	got = map[string]int{}
	complete = true
	note := func(op string, code int) {
		got[fmt.Sprintf("%s %d", op, code)]++
		if code < 200 || code > 299 {
			complete = false
		}
	}
	code, body := s.restQuiet("POST", "/v2/sandboxes", fmt.Sprintf(`{"templateID":"base","timeout":120,"metadata":{"client":"%d"}}`, c))
	note("create", code)
	if code != 201 {
		return got, false
	}
	var sb struct {
		SandboxID       string `json:"sandboxID"`
		EnvdAccessToken string `json:"envdAccessToken"`
	}
	json.Unmarshal(body, &sb)
	defer func() {
		code, _ := s.restQuiet("DELETE", "/sandboxes/"+sb.SandboxID, "")
		note("kill", code)
	}()
	// Use it through the proxy: a file written and read back.
	req, _ := http.NewRequest("POST", "http://"+s.addr+"/files?path=/home/user/f", strings.NewReader("load"))
	req.Header.Set("E2b-Sandbox-Id", sb.SandboxID)
	req.Header.Set("X-Access-Token", sb.EnvdAccessToken)
	req.Header.Set("Content-Type", "application/octet-stream")
	if resp, err := httpClient.Do(req); err == nil {
		note("upload", resp.StatusCode)
		resp.Body.Close()
	} else {
		note("upload", 0)
	}
	code, body = s.restQuiet("POST", "/sandboxes/"+sb.SandboxID+"/snapshots", `{}`)
	note("snapshot", code)
	if code == 201 {
		var sn struct {
			SnapshotID string `json:"snapshotID"`
		}
		json.Unmarshal(body, &sn)
		defer func() {
			code, _ := s.restQuiet("DELETE", "/templates/"+sn.SnapshotID, "")
			note("delete-snapshot", code)
		}()
	}
	code, body = s.restQuiet("POST", "/sandboxes/"+sb.SandboxID+"/fork", `{"count":1,"timeout":60}`)
	note("fork", code)
	if code == 201 {
		var kids []api.ForkChild
		json.Unmarshal(body, &kids)
		for _, k := range kids {
			if k.Sandbox != nil {
				code, _ := s.restQuiet("DELETE", "/sandboxes/"+k.Sandbox.SandboxID, "")
				note("kill-fork", code)
			} else if k.Error != nil {
				note("fork-child", k.Error.Code)
				complete = false
				if k.Error.Code >= 500 && k.Error.Code != 503 {
					s.t.Logf("fork child %d: %s", k.Error.Code, k.Error.Message)
				}
			}
		}
	}
	return got, complete
}

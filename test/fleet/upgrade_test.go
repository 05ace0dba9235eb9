package fleet

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/spore-run/spore/internal/fleet"
)

// upgradeVersion is what the second binary's `spore version` says.
const upgradeVersion = "upgrade-test-2"

// buildVersion builds spore from the same source with another version into
// a directory of its own, beside a copy of the fleet's spore-envd (a node
// installs the envd beside its executable): a real binary replacement.
func buildVersion(t *testing.T, bin, version string) string {
	t.Helper()
	dir := t.TempDir()
	exe := filepath.Join(dir, "spore")
	cmd := exec.Command("go", "build", "-ldflags", "-X main.version="+version, "-o", exe, "./cmd/spore")
	cmd.Dir = "../.."
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("build spore %s: %v: %s", version, err, out)
	}
	envd, err := os.ReadFile(filepath.Join(bin, "spore-envd"))
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "spore-envd"), envd, 0o755); err != nil {
		t.Fatal(err)
	}
	return exe
}

// loadResult is what upgrade_load.mjs prints.
type loadResult struct {
	Ops        []loadOp            `json:"ops"`
	Retries503 []loadEvent         `json:"retries503"`
	Refused    []loadEvent         `json:"refused"` // connections refused or closed unanswered, retried on the other replica
	Errors     []loadEvent         `json:"errors"`
	Cut        []loadEvent         `json:"cut"`       // commands whose stream was cut once started (not retried)
	Sandboxes  map[string][]string `json:"sandboxes"` // ID: the tags of its commands that succeeded
	Failed     map[string][]string `json:"failed"`    // ID: the tags of its commands that failed (their lines may be there)
	Killed     []string            `json:"killed"`
	Snapshots  []struct {
		SnapshotID string   `json:"snapshotId"`
		SandboxID  string   `json:"sandboxId"`
		Tags       []string `json:"tags"` // the sandbox's tags before the snapshot
	} `json:"snapshots"`
	Ms int64 `json:"ms"`
}

// loadOp is a call of the load that succeeded.
type loadOp struct {
	Op      string `json:"op"`
	URL     string `json:"url"`
	T       int64  `json:"t"`  // Unix ms: its (last) attempt began
	Ms      int64  `json:"ms"` // how long that attempt took
	Sandbox string `json:"sandbox"`
}

type loadEvent struct {
	Op    string `json:"op"`
	URL   string `json:"url"`
	Began int64  `json:"began"` // Unix ms: the attempt began
	T     int64  `json:"t"`     // Unix ms: it failed (and was classified)
	Msg   string `json:"msg"`
	// A command's: its sandbox and tag; for a cut one, how ("terminated"
	// after its answer began, "not running" before) and how often its
	// line is in the file afterwards (-1: the look failed).
	Sandbox string `json:"sandbox"`
	Tag     string `json:"tag"`
	How     string `json:"how"`
	Found   int    `json:"found"`
}

// logWriter sends a logger's lines to t.Log.
type logWriter struct{ t *testing.T }

func (w logWriter) Write(b []byte) (int, error) {
	w.t.Log(strings.TrimSpace(string(b)))
	return len(b), nil
}

// TestRollingUpgrade replaces every node agent and both API replicas of a
// fleet of 3 nodes, one at a time, with a second spore binary
// (fleet.RollingUpgrade: drain, stop, start on the new binary, ready,
// undrain; then each replica) while the stock E2B SDK keeps creating
// sandboxes, running commands in them, snapshotting and killing them
// through both replicas (upgrade_load.mjs). Afterwards: the load saw no
// error beyond 503s it retried and connections refused (or closed) by a
// replica while it was being replaced (retried on the other, as a load
// balancer would); no command's stream was cut (checkCuts: a drain waits
// for the requests in flight before it hibernates);
// every command that succeeded left its line in its sandbox, through
// hibernations and moves; every sandbox the load created and did not kill
// is listed and answers a command; every snapshot is listed, and sandboxes
// made from three of them hold what their source held; every node and
// replica runs the new binary; every node is ready and undrained.
func TestRollingUpgrade(t *testing.T) {
	h := upFleet(t, 3, "u", "--replicas=2")
	api1, api2 := h.st.APIURLs[0], h.st.APIURLs[1]
	oldExe := h.st.Executable
	v2 := buildVersion(t, h.bin, upgradeVersion)
	if out, err := exec.Command(v2, "version").Output(); err != nil || strings.TrimSpace(string(out)) != "spore "+upgradeVersion {
		t.Fatalf("%s version: %q %v", v2, out, err)
	}
	if out, _ := exec.Command(oldExe, "version").Output(); strings.Contains(string(out), upgradeVersion) {
		t.Fatalf("the fleet's binary already says %q", out)
	}
	if !waitFor(time.Minute, func() bool { return h.allReady(3) }) {
		t.Fatalf("nodes not ready: %v", h.nodes(api1))
	}

	// The load, until the stop file exists.
	b, _ := os.ReadFile("upgrade_load.mjs")
	os.WriteFile(filepath.Join(h.js, "upgrade_load.mjs"), b, 0o644)
	stop := filepath.Join(t.TempDir(), "stop")
	load := exec.Command("node", filepath.Join(h.js, "upgrade_load.mjs"))
	load.Env = append(os.Environ(), "LOAD_URLS="+api1+","+api2, "E2B_API_KEY="+h.key, "LOAD_STOP="+stop, "LOAD_WORKERS=2", "LOAD_LIVE=4")
	var loadOut bytes.Buffer
	load.Stdout, load.Stderr = &loadOut, &loadOut
	if err := load.Start(); err != nil {
		t.Fatal(err)
	}
	loadDone := make(chan error, 1)
	go func() { loadDone <- load.Wait() }()
	t.Cleanup(func() {
		if load.ProcessState == nil {
			load.Process.Kill()
			<-loadDone
		}
	})
	// Warm: the load keeps its sandboxes and has taken a snapshot.
	if !waitFor(3*time.Minute, func() bool {
		code, sb := h.rest(api1, "GET", "/v2/sandboxes?limit=100", "")
		var l []sandbox
		json.Unmarshal(sb, &l)
		code2, sn := h.rest(api1, "GET", "/snapshots?limit=100", "")
		var s []struct{}
		json.Unmarshal(sn, &s)
		return code == 200 && code2 == 200 && len(l) >= 4 && len(s) >= 1
	}) {
		t.Fatalf("the load did not warm up: %s", loadOut.String())
	}

	t0 := time.Now()
	log := slog.New(slog.NewTextHandler(logWriter{t}, &slog.HandlerOptions{Level: slog.LevelInfo}))
	steps, err := fleet.RollingUpgrade(context.Background(), h.dir, v2, h.key, log)
	upgradeTime := time.Since(t0)
	if err != nil {
		t.Fatalf("rolling upgrade after %v: %v (steps %+v)\nload so far:\n%s", upgradeTime, err, steps, loadOut.String())
	}
	// The load goes on a while over the upgraded fleet, then stops.
	time.Sleep(5 * time.Second)
	os.WriteFile(stop, nil, 0o644)
	select {
	case err := <-loadDone:
		if err != nil {
			t.Fatalf("load: %v\n%s", err, loadOut.String())
		}
	case <-time.After(3 * time.Minute):
		t.Fatalf("the load did not stop:\n%s", loadOut.String())
	}
	out := loadOut.String()
	i := strings.LastIndex(out, "RESULT:")
	if i < 0 {
		t.Fatalf("no result from the load:\n%s", out)
	}
	var res loadResult
	if err := json.Unmarshal([]byte(strings.TrimSpace(out[i+len("RESULT:"):])), &res); err != nil {
		t.Fatalf("load result: %v\n%s", err, out)
	}
	h.checkUpgradeLoad(res, steps, t0, upgradeTime)
	h.checkNothingLost(res)
	h.checkNewBinary(v2, steps)
}

// checkUpgradeLoad: no load error; no command stream cut (checkCuts);
// each connection refused or
// closed came from the replica being replaced then; the load ran through
// the upgrade and through each replica after its replacement; the drains
// hibernated some of its sandboxes. It logs the figures.
func (h *harness) checkUpgradeLoad(res loadResult, steps []fleet.UpgradeStep, t0 time.Time, took time.Duration) {
	t := h.t
	for _, e := range res.Errors {
		t.Errorf("load error at +%v (began +%v%s; %s via %s, sandbox %s): %s\nthe fleet's logs about the sandbox:\n%s", time.UnixMilli(e.T).Sub(t0).Round(time.Millisecond),
			time.UnixMilli(e.Began).Sub(t0).Round(time.Millisecond), upgradePhase(steps, e.Began), e.Op, e.URL, e.Sandbox, e.Msg, h.linesAbout(e.Sandbox))
	}
	cuts := checkCuts(t, res, steps, t0, h.linesAbout)
	replaced := map[string]fleet.UpgradeStep{} // replica URL: its step
	for _, s := range steps {
		if strings.HasPrefix(s.Name, "api-") {
			var i int
			fmt.Sscanf(s.Name, "api-%d", &i)
			replaced[h.st.APIURLs[i]] = s
		}
	}
	for _, r := range res.Refused {
		s, ok := replaced[r.URL]
		at := time.UnixMilli(r.T)
		if !ok || at.Before(s.Stopped.Add(-2*time.Second)) || at.After(s.Ready.Add(2*time.Second)) {
			t.Errorf("a connection to %s failed at +%v, outside that replica's replacement (%+v): %s", r.URL, at.Sub(t0), s, r.Msg)
		}
	}
	during, kinds, after := 0, map[string]int{}, map[string]int{}
	end := t0.Add(took)
	for _, op := range res.Ops {
		at := time.UnixMilli(op.T)
		kinds[op.Op]++
		if at.After(t0) && at.Before(end) {
			during++
		}
		if s, ok := replaced[op.URL]; ok && at.After(s.Ready) {
			after[op.URL]++
		}
	}
	if during < 10 || kinds["create"] < 4 || kinds["run"] < 10 || kinds["snapshot"] < 2 || kinds["kill"] < 1 {
		t.Errorf("too little load to prove anything: %d ops during the upgrade, %v", during, kinds)
	}
	for u := range replaced {
		if after[u] == 0 {
			t.Errorf("no load op through %s after its replacement", u)
		}
	}
	hibernated := 0
	var downs []string
	for _, s := range steps {
		hibernated += s.Hibernated
		drain := ""
		if s.NodeID != "" {
			drain = fmt.Sprintf("%d hibernated in %d drains (%d sandboxes listed there), drained at +%.1fs, ", s.Hibernated, s.Drains, len(s.Sandboxes), s.Drained.Sub(t0).Seconds())
		}
		downs = append(downs, fmt.Sprintf("%s from +%.1fs: %sstopped at +%.1fs, down %.1fs, step %.1fs", s.Name,
			s.Began.Sub(t0).Seconds(), drain, s.Stopped.Sub(t0).Seconds(), s.Ready.Sub(s.Stopped).Seconds(), s.Done.Sub(s.Began).Seconds()))
	}
	if hibernated == 0 {
		t.Error("the drains hibernated none of the load's sandboxes: the upgrade never moved one")
	}
	for _, r := range res.Retries503 {
		t.Logf("503 retried at +%v (%s via %s): %s", time.UnixMilli(r.T).Sub(t0).Round(time.Millisecond), r.Op, r.URL, r.Msg)
	}
	for _, r := range res.Refused {
		t.Logf("connection failed, retried on the other replica at +%v (%s via %s): %s", time.UnixMilli(r.T).Sub(t0).Round(time.Millisecond), r.Op, r.URL, r.Msg)
	}
	t.Logf("rolling upgrade in %v: %s", took.Round(100*time.Millisecond), strings.Join(downs, "; "))
	// The requests a replica held while the node's proxy said their
	// sandbox was in transition, and sent again once it had moved
	// (internal/proxy replay.go): no error reached the load for them.
	t.Logf("requests a replica sent again through a sandbox's hibernation and move: %d tries (%d gave up with the 503)",
		h.linesIn("api-", "proxy: sandbox was in transition on its node, sending the request again"),
		h.linesIn("api-", "proxy: sandbox still in transition on its node"))
	slow := slices.SortedFunc(slices.Values(res.Ops), func(a, b loadOp) int { return int(b.Ms - a.Ms) })
	for _, op := range slow[:min(3, len(slow))] {
		t.Logf("slowest: %s %s via %s from +%v took %v", op.Op, op.Sandbox, op.URL, time.UnixMilli(op.T).Sub(t0).Round(time.Millisecond), time.Duration(op.Ms)*time.Millisecond)
	}
	t.Logf("load: %d ops in %.1f s (%d during the upgrade: %v), %d retried 503s, %d connections refused or closed by a replica being replaced and retried on the other, %d command streams cut (of %d sandboxes the drains hibernated), %d errors; %d sandboxes created, %d killed, %d snapshots",
		len(res.Ops), float64(res.Ms)/1000, during, kinds, len(res.Retries503), len(res.Refused), cuts, hibernated, len(res.Errors), len(res.Sandboxes), len(res.Killed), len(res.Snapshots))
}

// upgradePhase says where the upgrade was at Unix ms at, for a message.
func upgradePhase(steps []fleet.UpgradeStep, at int64) string {
	b := time.UnixMilli(at)
	for _, s := range steps {
		if !b.Before(s.Began) && b.Before(s.Stopped) {
			return "; during " + s.Name + "'s drain"
		} else if !b.Before(s.Stopped) && b.Before(s.Ready) {
			return "; while " + s.Name + " was down"
		}
	}
	return ""
}

// checkCuts fails on every command stream cut (a command's call that
// failed as its stream ended: after its answer began, undici's
// "terminated"; or before, the proxy's 502 "went away before it
// answered", which the SDK raises as SandboxNotFoundError; the load did
// not retry it, as it may have run). A drain quiesces each running
// sandbox before it hibernates it: its node's proxy forwards it nothing
// new and the drain waits for the requests in flight, up to the replica's
// --drain-grace (10 s), longer than any of the load's commands. Before, a
// drain hibernated at once and cut 0-1 commands a run. Each cut is
// reported with where it fell (inside a drain of its sandbox's node or
// not) and whether its line is in the file afterwards (the load looked).
// It returns how many there were.
func checkCuts(t testing.TB, res loadResult, steps []fleet.UpgradeStep, t0 time.Time, about func(id string) string) int {
	for _, c := range res.Cut {
		began, ended := time.UnixMilli(c.Began), time.UnixMilli(c.T)
		drain := "outside a drain of its sandbox's node"
		for _, s := range steps {
			if s.NodeID != "" && slices.Contains(s.Sandboxes, c.Sandbox) && !began.After(s.Drained) && !ended.Before(s.Began) {
				drain = "during " + s.Name + "'s drain (which waits for requests in flight)"
			}
		}
		at := fmt.Sprintf("+%v-+%v", began.Sub(t0).Round(time.Millisecond), ended.Sub(t0).Round(time.Millisecond))
		t.Errorf("%s %s in %s (via %s, %s%s) cut (%s) %s; its line is in the file %d times afterwards: %s\nthe fleet's logs about it:\n%s",
			c.Op, c.Tag, c.Sandbox, c.URL, at, upgradePhase(steps, c.Began), c.How, drain, c.Found, c.Msg, about(c.Sandbox))
	}
	return len(res.Cut)
}

// checkNothingLost: every sandbox the load kept is listed and answers,
// with every line its commands wrote; every snapshot is listed, and three
// of them (first, middle, last) start sandboxes holding what the source
// held then.
func (h *harness) checkNothingLost(res loadResult) {
	t := h.t
	api := h.st.APIURLs
	killed := map[string]bool{}
	for _, id := range res.Killed {
		killed[id] = true
	}
	code, b := h.rest(api[0], "GET", "/v2/sandboxes?limit=100", "")
	var listed []sandbox
	json.Unmarshal(b, &listed)
	states := map[string]string{}
	for _, s := range listed {
		states[s.SandboxID] = s.SporeState
	}
	kept := 0
	for id, tags := range res.Sandboxes {
		if killed[id] {
			continue
		}
		kept++
		if st, ok := states[id]; !ok || st == "error" {
			t.Errorf("sandbox %s: listed %v in state %q (%d %d listed)", id, ok, st, code, len(listed))
			continue
		}
		got := strings.Fields(h.run(api[kept%2], id, "cat /home/user/ops 2>/dev/null; true"))
		if !opsHeld(got, tags, res.Failed[id]) {
			t.Errorf("sandbox %s: /home/user/ops holds %v, the load's commands wrote %v (and maybe %v)", id, got, tags, res.Failed[id])
		}
	}
	code, b = h.rest(api[1], "GET", "/snapshots?limit=1000", "")
	var sns []struct {
		SnapshotID string `json:"snapshotID"`
	}
	json.Unmarshal(b, &sns)
	have := map[string]bool{}
	for _, s := range sns {
		have[s.SnapshotID] = true
	}
	for _, s := range res.Snapshots {
		if !have[s.SnapshotID] {
			t.Errorf("snapshot %s (of %s) not listed (%d, %d listed)", s.SnapshotID, s.SandboxID, code, len(sns))
		}
	}
	if n := len(res.Snapshots); n > 0 {
		for k, i := range []int{0, n / 2, n - 1} {
			s := res.Snapshots[i]
			code, b := h.rest(api[k%2], "POST", "/sandboxes", fmt.Sprintf(`{"templateID":%q,"timeout":300}`, s.SnapshotID))
			var sb sandbox
			if json.Unmarshal(b, &sb); code != 201 {
				t.Errorf("create from snapshot %s: %d %s", s.SnapshotID, code, b)
				continue
			}
			got := strings.Fields(h.run(api[k%2], sb.SandboxID, "cat /home/user/ops 2>/dev/null; true"))
			if !opsHeld(got, s.Tags, res.Failed[s.SandboxID]) {
				t.Errorf("from snapshot %s of %s: /home/user/ops holds %v, the source held %v (and maybe %v)", s.SnapshotID, s.SandboxID, got, s.Tags, res.Failed[s.SandboxID])
			}
			h.rest(api[k%2], "DELETE", "/sandboxes/"+sb.SandboxID, "")
		}
	}
	t.Logf("%d sandboxes kept by the load listed and answering with every line; %d snapshots listed, 3 restored", kept, len(res.Snapshots))
}

// linesAbout gives the last 40 lines of the fleet processes' logs that
// name sandbox id, each prefixed with its log's name (log by log).
func (h *harness) linesAbout(id string) string {
	if id == "" {
		return ""
	}
	var out []string
	logs, _ := filepath.Glob(filepath.Join(h.dir, "logs", "*.log"))
	for _, l := range logs {
		b, _ := os.ReadFile(l)
		for _, line := range strings.Split(string(b), "\n") {
			if strings.Contains(line, id) {
				out = append(out, filepath.Base(l)+": "+line)
			}
		}
	}
	return strings.Join(out[max(0, len(out)-40):], "\n")
}

// linesIn counts the lines holding s in the logs of the fleet processes
// whose name begins with prefix.
func (h *harness) linesIn(prefix, s string) int {
	n := 0
	logs, _ := filepath.Glob(filepath.Join(h.dir, "logs", prefix+"*.log"))
	for _, l := range logs {
		b, _ := os.ReadFile(l)
		n += strings.Count(string(b), s)
	}
	return n
}

// opsHeld says whether a sandbox's ops file (lines got) holds every tag
// of ok in order, and nothing else but tags of maybe (commands that
// failed: they may have written their line before failing).
func opsHeld(got, ok, maybe []string) bool {
	i := 0
	for _, l := range got {
		switch {
		case i < len(ok) && l == ok[i]:
			i++
		case slices.Contains(maybe, l):
		default:
			return false
		}
	}
	return i == len(ok)
}

// checkNewBinary: every node agent and replica runs v2 (its
// /proc/PID/exe), as the state records; every node is ready and not
// draining.
func (h *harness) checkNewBinary(v2 string, steps []fleet.UpgradeStep) {
	t := h.t
	h.reload()
	n := 0
	for _, p := range h.st.Processes {
		if p.Role != "node" && p.Role != "api" {
			continue
		}
		n++
		exe, err := os.Readlink(fmt.Sprintf("/proc/%d/exe", p.PID))
		if err != nil || exe != v2 || p.Args[0] != v2 {
			t.Errorf("%s (pid %d) runs %q (%v), recorded %s; want %s", p.Name, p.PID, exe, err, p.Args[0], v2)
		}
	}
	if n != 5 || len(steps) != 5 || h.st.Executable != v2 {
		t.Errorf("%d spore processes, %d steps, state executable %s", n, len(steps), h.st.Executable)
	}
	code, b := h.rest(h.st.APIURLs[0], "GET", "/nodes", "")
	var ns []struct {
		NodeID   string `json:"nodeID"`
		State    string `json:"state"`
		Draining bool   `json:"draining"`
	}
	json.Unmarshal(b, &ns)
	for _, x := range ns {
		if x.State != "ready" || x.Draining {
			t.Errorf("after the upgrade node %s: %s draining %v", x.NodeID, x.State, x.Draining)
		}
	}
	if len(ns) != 3 {
		t.Errorf("GET /nodes: %d %s", code, b)
	}
	t.Logf("every node agent and replica runs %s (spore %s)", v2, upgradeVersion)
}

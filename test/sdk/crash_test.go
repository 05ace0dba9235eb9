package sdk

import (
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/spore-run/spore/internal/node"
	"github.com/spore-run/spore/internal/testenv"
)

// SIGKILL `spore up` at random moments while a client creates (half of
// them with an exclusive volume), snapshots, forks, rolls back, hibernates
// and kills; restart it and check after every round: every listed
// snapshot restores (with its volume's copy), every sandbox the store
// lists as running answers, nothing on the host is orphaned (runsc
// sandboxes, instance directories, network namespaces), and no volume
// copy or rollback image is left that nothing names.
func TestCrashRounds(t *testing.T) {
	s := newServer(t, "--pool", "0") // no background restores racing the checks
	rng := testenv.Rand(t)           // the kill delays; each round's client has its own source
	rounds := 20
	var lastSnaps []string
	restored := map[string]bool{}
	totalOps := 0
	for round := range rounds {
		// A client works until the server dies under it.
		stop := make(chan struct{})
		var wg sync.WaitGroup
		var mu sync.Mutex
		ops := 0
		work := rand.New(rand.NewPCG(rng.Uint64(), uint64(round)))
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				select {
				case <-stop:
					return
				default:
				}
				if s.workStep(round, work) {
					mu.Lock()
					ops++
					mu.Unlock()
				}
			}
		}()
		time.Sleep(time.Duration(200+rng.IntN(1300)) * time.Millisecond)
		s.kill9()
		close(stop)
		wg.Wait()
		totalOps += ops
		s.start()
		lastSnaps = s.checkConsistent(t, round, restored)
	}
	code, body := s.rest("GET", "/volumes?limit=100", "")
	var vols []json.RawMessage
	if json.Unmarshal(body, &vols); code != 200 || len(vols) == 0 {
		t.Fatalf("no volume was made in %d rounds (%d %s): the rounds did not exercise exclusive volumes", rounds, code, body)
	}
	imgs, _ := filepath.Glob(filepath.Join(s.data, "volumes", "pool", "c-*.img"))
	t.Logf("%d rounds, %d operations completed before the kills, %d snapshots at the end; %d volumes, %d volume copies at the end",
		rounds, totalOps, len(lastSnaps), len(vols), len(imgs))
}

// workStep does one random operation; it reports whether it succeeded.
func (s *server) workStep(round int, rng *rand.Rand) bool {
	code, body := s.restQuiet("GET", "/v2/sandboxes?state=running", "")
	if code != 200 {
		return false
	}
	var running []sandboxResp
	json.Unmarshal(body, &running)
	if len(running) < 2 {
		code, _ := s.restQuiet("POST", "/v2/sandboxes", fmt.Sprintf(`{"templateID":"base","timeout":600,"metadata":{"round":"%d"}%s}`, round, s.exclusiveMount(round, rng)))
		return code == 201
	}
	sb := running[rng.IntN(len(running))].SandboxID
	switch rng.IntN(6) {
	case 0:
		code, _ = s.restQuiet("POST", "/sandboxes/"+sb+"/snapshots", `{}`)
	case 1:
		code, _ = s.restQuiet("POST", "/sandboxes/"+sb+"/fork", `{"count":2}`)
	case 2:
		_, b := s.restQuiet("GET", "/snapshots", "")
		var snaps []struct {
			SnapshotID string `json:"snapshotID"`
		}
		json.Unmarshal(b, &snaps)
		if len(snaps) == 0 {
			return false
		}
		code, _ = s.restQuiet("POST", "/sandboxes/"+sb+"/rollback", `{"snapshotID":"`+snaps[rng.IntN(len(snaps))].SnapshotID+`"}`)
	case 3:
		code, _ = s.restQuiet("POST", "/sandboxes/"+sb+"/hibernate", "")
	case 4:
		code, _ = s.restQuiet("DELETE", "/sandboxes/"+sb, "")
	default:
		code, _ = s.restQuiet("POST", "/v2/sandboxes", `{"templateID":"base","timeout":600`+s.exclusiveMount(round, rng)+`}`)
	}
	return code < 300
}

// exclusiveMount is, for every other create, the volumeMounts field of a
// new exclusive volume (made now, written to below by nothing: what is
// captured with each snapshot, fork, rollback and hibernation is its
// image); "" otherwise, or when the volume could not be made.
func (s *server) exclusiveMount(round int, rng *rand.Rand) string {
	if rng.IntN(2) == 0 {
		return ""
	}
	name := fmt.Sprintf("crash-%d-%d", round, rng.Uint32())
	if code, _ := s.restQuiet("POST", "/volumes", `{"name":"`+name+`","mode":"exclusive","sizeMB":64}`); code != 201 {
		return ""
	}
	return `,"volumeMounts":[{"name":"` + name + `","path":"/work"}]`
}

// checkNoHalfCapturedVolumes: every copy of an exclusive volume in the
// node's pool is a committed snapshot's (its manifest names it), and
// every rollback image is a sandbox's or a pending cleanup's: a capture,
// fork or rollback the kill cut short leaves none visible.
func (s *server) checkNoHalfCapturedVolumes(round int) error {
	named := map[string]bool{}
	read := func(pattern string, note func(b []byte)) {
		files, _ := filepath.Glob(pattern)
		for _, f := range files {
			if b, err := os.ReadFile(f); err == nil {
				note(b)
			}
		}
	}
	var run struct {
		Run struct {
			Volumes []struct {
				Copy  string `json:"copy"`
				Image string `json:"image"`
			} `json:"volumes"`
		} `json:"run"`
		Images []struct {
			Image string `json:"image"`
		} `json:"images"`
	}
	note := func(b []byte) {
		run.Run.Volumes, run.Images = nil, nil
		if json.Unmarshal(b, &run) != nil {
			return
		}
		for _, v := range run.Run.Volumes {
			named[v.Copy], named[v.Image] = true, true
		}
		for _, a := range run.Images {
			named[a.Image] = true
		}
	}
	read(filepath.Join(s.data, "snapshots", "*", "manifest.json"), note)
	read(filepath.Join(s.data, "engine", "sandboxes", "*.json"), note)
	read(filepath.Join(s.data, "engine", "cleanup", "*.json"), note)
	imgs, _ := filepath.Glob(filepath.Join(s.data, "volumes", "pool", "*.img"))
	for _, img := range imgs {
		name := strings.TrimSuffix(filepath.Base(img), ".img")
		if !strings.HasPrefix(name, "c-") && !strings.HasPrefix(name, "r-") {
			continue
		}
		if !named[name] {
			return fmt.Errorf("round %d: volume image %s is left and nothing names it (a half-captured volume)", round, name)
		}
	}
	return nil
}

// restQuiet is rest without failing the test (the server may be dying).
func (s *server) restQuiet(method, path, body string) (int, []byte) {
	defer func() { recover() }()
	req, err := newRequest(method, "http://"+s.addr+path, body)
	if err != nil {
		return 0, nil
	}
	resp, err := httpClient.Do(req)
	if err != nil {
		return 0, nil
	}
	defer resp.Body.Close()
	b := make([]byte, 0, 4096)
	buf := make([]byte, 4096)
	for {
		n, err := resp.Body.Read(buf)
		b = append(b, buf[:n]...)
		if err != nil {
			break
		}
	}
	return resp.StatusCode, b
}

func (s *server) checkConsistent(t *testing.T, round int, restored map[string]bool) []string {
	t.Helper()
	// Every listed snapshot restores.
	code, body := s.rest("GET", "/snapshots", "")
	if code != 200 {
		t.Fatalf("round %d: list snapshots: %d %s", round, code, body)
	}
	var snaps []struct {
		SnapshotID string `json:"snapshotID"`
	}
	json.Unmarshal(body, &snaps)
	var ids []string
	for _, sn := range snaps {
		ids = append(ids, sn.SnapshotID)
	}
	// Every committed snapshot restores (each checked once, the round it
	// first appears), and the restored sandbox is killed again.
	for _, sn := range snaps {
		if restored[sn.SnapshotID] {
			continue
		}
		restored[sn.SnapshotID] = true
		code, body := s.rest("POST", "/v2/sandboxes", `{"templateID":"`+sn.SnapshotID+`","timeout":600}`)
		if code != 201 {
			t.Fatalf("round %d: snapshot %s does not restore: %d %s", round, sn.SnapshotID, code, body)
		}
		var r sandboxResp
		json.Unmarshal(body, &r)
		s.rest("DELETE", "/sandboxes/"+r.SandboxID, "")
	}
	// Every sandbox the store lists as running answers through the proxy.
	code, body = s.rest("GET", "/v2/sandboxes", "")
	if code != 200 {
		t.Fatalf("round %d: list: %d", round, code)
	}
	var all []sandboxResp
	json.Unmarshal(body, &all)
	running := map[string]bool{}
	for _, sb := range all {
		if sb.State == "running" {
			running[sb.SandboxID] = true
			req, _ := newRequest("GET", "http://"+s.addr+"/health", "")
			req.Header.Set("E2b-Sandbox-Id", sb.SandboxID)
			resp, err := httpClient.Do(req)
			if err != nil || resp.StatusCode != 204 {
				t.Fatalf("round %d: running sandbox %s does not answer: %v %v", round, sb.SandboxID, resp, err)
			}
			resp.Body.Close()
		}
	}
	// Nothing orphaned once the background work is done (the warm pool's
	// refills, restore targets being made): checked until it holds, for
	// at most 30 s (sandboxes boot slowly on a loaded host).
	for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(100 * time.Millisecond) {
		err := s.checkNoOrphans(t, all)
		if err == nil {
			err = s.checkNoHalfCapturedVolumes(round)
		}
		if err == nil {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("round %d: %v", round, err)
		}
	}
	return ids
}

// checkNoOrphans: runsc knows only instances of recorded sandboxes (or of
// the warm pool, or restore targets), each with its directory, network,
// cgroups and namespace mounts, and nothing else of them is left.
func (s *server) checkNoOrphans(t *testing.T, all []sandboxResp) error {
	out, err := exec.Command(testenvRunsc(t), "--root="+filepath.Join(s.data, "runtime", "root"), "list", "--format=json").Output()
	if err != nil {
		return fmt.Errorf("runsc list: %v", err)
	}
	var insts []struct {
		ID string `json:"id"`
	}
	json.Unmarshal(out, &insts)
	known := map[string]bool{}
	for _, sb := range all {
		known[sb.SandboxID] = true
	}
	// Which sandbox each instance is (the engine's records say; an
	// instance restored into a restore target is named by the target).
	owner := map[string]string{}
	recs, _ := filepath.Glob(filepath.Join(s.data, "engine", "sandboxes", "*.json"))
	for _, f := range recs {
		var rec struct{ ID, Instance string }
		if b, err := os.ReadFile(f); err == nil && json.Unmarshal(b, &rec) == nil && rec.Instance != "" {
			owner[rec.Instance] = rec.ID
		}
	}
	pooled, targets := 0, 0
	for _, in := range insts {
		switch sbID, ok := owner[in.ID]; {
		case !ok:
			targets++ // a restore target: booted ahead, no sandbox yet
		case !known[sbID]:
			pooled++ // the warm pool's sandboxes have no store record
		}
		if _, err := os.Stat(filepath.Join(s.data, "runtime", "inst", in.ID)); err != nil {
			return fmt.Errorf("instance %s has no directory", in.ID)
		}
		if _, err := os.Stat("/var/run/netns/spa-sb-" + in.ID); err != nil {
			return fmt.Errorf("instance %s has no network", in.ID)
		}
	}
	if pooled > 4 {
		return fmt.Errorf("%d unrecorded instances (pool is 2 per template)", pooled)
	}
	// The targets per shape restores asked for: the two templates' and the
	// snapshots' (the same as their template's), at most 4 shapes kept; a
	// shape that saw a burst of restores (the forks, creates that overlap)
	// keeps up to the burst's size.
	if targets > 4*node.DefaultRestoreTargetsBurst {
		return fmt.Errorf("%d instances no sandbox record names (restore targets: up to %d per shape after a burst, at most 4 shapes)", targets, node.DefaultRestoreTargetsBurst)
	}
	dirs, _ := os.ReadDir(filepath.Join(s.data, "runtime", "inst"))
	if len(dirs) != len(insts) {
		return fmt.Errorf("%d instance directories for %d instances", len(dirs), len(insts))
	}
	// Every sandbox namespace is an instance's, or a reserved network's: set
	// up ahead for restores, no instance in it, its state saying so.
	nets, _ := filepath.Glob("/var/run/netns/spa-sb-*")
	isInst := map[string]bool{}
	for _, in := range insts {
		isInst[in.ID] = true
	}
	reserved := 0
	for _, ns := range nets {
		id := strings.TrimPrefix(filepath.Base(ns), "spa-sb-")
		if isInst[id] {
			continue
		}
		var st struct{ Reserved bool }
		b, err := os.ReadFile(filepath.Join(s.data, "net", id+".json"))
		if err != nil || json.Unmarshal(b, &st) != nil || !st.Reserved {
			return fmt.Errorf("sandbox namespace %s has no instance and is no reserved network (%v)", ns, err)
		}
		reserved++
	}
	if reserved > node.DefaultReservedNetworks {
		return fmt.Errorf("%d reserved networks, more than the default %d", reserved, node.DefaultReservedNetworks)
	}
	// Cgroups: one per instance under the server's parent, in every
	// hierarchy that has it.
	for _, hier := range []string{"memory", "pids", "cpu"} {
		kids, _ := os.ReadDir(filepath.Join("/sys/fs/cgroup", hier, s.cgroup))
		n := 0
		for _, k := range kids {
			if k.IsDir() {
				n++
			}
		}
		if n != len(insts) {
			return fmt.Errorf("%d %s cgroups for %d instances", n, hier, len(insts))
		}
	}
	// Mounts: two namespace mounts per instance and reserved network
	// (sandbox and gateway), and under the data directory only runsc's
	// pinned empty namespace, the node's empty volume slot (the
	// read-only tmpfs behind its templates' unused volume slots) and its
	// volumes'.
	// Volumes: the pool's file system, and each volume image's mount (or
	// read-only view) while its image is there.
	mi, _ := os.ReadFile("/proc/self/mountinfo")
	nsMounts, dataMounts := 0, 0
	vols := filepath.Join(s.data, "volumes")
	for _, line := range strings.Split(string(mi), "\n") {
		f := strings.Fields(line)
		if len(f) < 5 {
			continue
		}
		if strings.HasPrefix(f[4], "/run/netns/spa-") {
			nsMounts++
		}
		switch mp := f[4]; {
		case !strings.HasPrefix(mp, s.data) || mp == filepath.Join(vols, "empty") || mp == filepath.Join(vols, "pool"):
		case filepath.Dir(mp) == filepath.Join(vols, "mounts"):
			img := strings.TrimSuffix(filepath.Base(mp), ".ro")
			if _, err := os.Stat(filepath.Join(vols, "pool", img+".img")); err != nil {
				return fmt.Errorf("volume mount %s has no image", mp)
			}
		default:
			dataMounts++
		}
	}
	if nsMounts != 2*(len(insts)+reserved) || dataMounts > 1 {
		return fmt.Errorf("%d namespace mounts for %d instances and %d reserved networks, %d mounts under the data dir", nsMounts, len(insts), reserved, dataMounts)
	}
	return nil
}

var httpClient = &http.Client{Timeout: 2 * time.Minute}

func newRequest(method, url, body string) (*http.Request, error) {
	req, err := http.NewRequest(method, url, strings.NewReader(body))
	if err != nil {
		return nil, err
	}
	req.Header.Set("X-API-KEY", apiKey)
	req.Header.Set("Content-Type", "application/json")
	return req, nil
}

func testenvRunsc(t *testing.T) string { return testenv.Runsc(t) }

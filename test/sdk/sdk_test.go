// Package sdk runs the stock E2B SDKs (from npm, unchanged) against a real
// `spore up` started by the test, and checks that restarting `spore up`,
// even after SIGKILL, loses nothing.
package sdk

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/spore-run/spore/internal/errdefs"
	"github.com/spore-run/spore/internal/ids"
	"github.com/spore-run/spore/internal/node"
	"github.com/spore-run/spore/internal/testenv"
)

const apiKey = "spore_test_key_for_sdk_acceptance"

// server is a `spore up` process.
type server struct {
	extra  []string // extra `spore up` flags
	t      testing.TB
	bin    string
	data   string
	cgroup string
	rootfs string // its own (testenv.PrivateRootFSDir): images it pulls go with it
	// addr is where it listens: a port of its own choosing at the first
	// start (read from its log: a port picked by the test and bound later
	// was once taken meanwhile), the same one at a restart.
	addr   string
	cmd    *exec.Cmd
	exited chan struct{} // closed when cmd has been waited for
}

func buildBinaries(t testing.TB) string {
	t.Helper()
	dir := t.TempDir()
	for _, b := range []struct{ out, pkg string }{{"spore", "./cmd/spore"}, {"spore-envd", "./cmd/spore-envd"}} {
		cmd := exec.Command("go", "build", "-o", filepath.Join(dir, b.out), b.pkg)
		cmd.Dir = "../.."
		cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
		if out, err := cmd.CombinedOutput(); err != nil {
			t.Fatalf("build %s: %v: %s", b.pkg, err, out)
		}
	}
	return dir
}

func newServer(t testing.TB, extra ...string) *server {
	testenv.RequireRoot(t)
	if _, err := os.Stat("node_modules/e2b/package.json"); err != nil {
		t.Fatal("test/sdk/node_modules missing: `make test` installs it (npm ci --prefix test/sdk)")
	}
	s := &server{t: t, bin: buildBinaries(t), data: t.TempDir(), cgroup: "/spore-test-" + ids.New('g'), extra: extra,
		rootfs: testenv.PrivateRootFSDir(t)}
	t.Cleanup(s.destroy)
	s.start()
	return s
}

func (s *server) start() {
	s.t.Helper()
	listen := s.addr
	if listen == "" {
		listen = "127.0.0.1:0"
	}
	args := append([]string{"up", "--data-dir", s.data, "--listen", listen, "--rootfs-dir", s.rootfs,
		"--runsc", testenv.Runsc(s.t), "--net-prefix", "spa", "--cgroup-parent", s.cgroup}, s.extra...)
	s.cmd = exec.Command(filepath.Join(s.bin, "spore"), args...)
	s.cmd.Env = append(os.Environ(), "SPORE_API_KEY="+apiKey)
	logf, _ := os.Create(filepath.Join(s.data, fmt.Sprintf("up-%d.log", time.Now().UnixNano())))
	s.cmd.Stdout, s.cmd.Stderr = logf, logf
	if err := s.cmd.Start(); err != nil {
		s.t.Fatal(err)
	}
	s.exited = make(chan struct{})
	go func(cmd *exec.Cmd, done chan struct{}) { cmd.Wait(); close(done) }(s.cmd, s.exited)
	deadline := time.Now().Add(3 * time.Minute)
	for time.Now().Before(deadline) {
		if s.addr == "" {
			b, _ := os.ReadFile(logf.Name())
			if _, rest, ok := strings.Cut(string(b), "Spore is up on http://"); ok {
				s.addr, _, _ = strings.Cut(rest, "\n")
			}
		}
		if s.addr != "" {
			if resp, err := http.Get("http://" + s.addr + "/health"); err == nil {
				resp.Body.Close()
				return
			}
		}
		select {
		case <-s.exited:
			b, _ := os.ReadFile(logf.Name())
			s.t.Fatalf("spore up exited: %s", b)
		case <-time.After(100 * time.Millisecond):
		}
	}
	b, _ := os.ReadFile(logf.Name())
	s.t.Fatalf("spore up did not come up: %s", b)
}

// kill9 kills the server the hard way.
func (s *server) kill9() {
	s.cmd.Process.Signal(syscall.SIGKILL)
	<-s.exited
}

func (s *server) stop() {
	if s.cmd == nil {
		return
	}
	select {
	case <-s.exited:
	default:
		s.cmd.Process.Signal(syscall.SIGTERM)
		<-s.exited
	}
}

// destroy stops the server and removes every sandbox, network and mount
// it made, using the node's own cleanup.
func (s *server) destroy() {
	s.stop()
	if s.t.Failed() {
		logs, _ := filepath.Glob(filepath.Join(s.data, "up-*.log"))
		for _, l := range logs {
			b, _ := os.ReadFile(l)
			// Errors and warnings first, wherever they are: the tail of a
			// busy log may not reach back to the one that matters.
			var bad []string
			for _, line := range strings.Split(string(b), "\n") {
				if strings.Contains(line, "level=ERROR") || strings.Contains(line, "level=WARN") {
					bad = append(bad, line)
				}
			}
			if len(bad) > 0 {
				s.t.Logf("server log %s (errors and warnings):\n%s", filepath.Base(l), strings.Join(bad, "\n"))
			}
			if len(b) > 8000 {
				b = b[len(b)-8000:]
			}
			s.t.Logf("server log %s (tail):\n%s", filepath.Base(l), b)
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	n, err := node.Open(ctx, node.Config{DataDir: s.data, RootFSDir: s.rootfs, Runsc: testenv.Runsc(s.t),
		EnvdBinary: filepath.Join(s.bin, "spore-envd"), NetPrefix: "spa", CgroupParent: s.cgroup})
	if err != nil {
		s.t.Errorf("cleanup: open node: %v", err)
		return
	}
	for _, sb := range n.Engine.List(ctx) {
		if err := n.Engine.Kill(ctx, sb.ID); err != nil && !errdefs.IsNotFound(err) {
			s.t.Errorf("cleanup: kill %s: %v", sb.ID, err)
		}
	}
	n.Close()
	if err := n.Runtime.Purge(ctx); err != nil {
		s.t.Errorf("cleanup: purge: %v", err)
	}
	n.Net.Sweep(ctx, nil)
	n.Net.RemoveHostRules()
}

func (s *server) rest(method, path string, body string) (int, []byte) {
	s.t.Helper()
	req, _ := http.NewRequest(method, "http://"+s.addr+path, strings.NewReader(body))
	req.Header.Set("X-API-KEY", apiKey)
	req.Header.Set("Content-Type", "application/json")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		s.t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, b
}

func (s *server) node(script string, env ...string) string {
	s.t.Helper()
	cmd := exec.Command("node", script)
	cmd.Env = append(os.Environ(), "E2B_API_URL=http://"+s.addr, "E2B_SANDBOX_URL=http://"+s.addr, "E2B_API_KEY="+apiKey)
	cmd.Env = append(cmd.Env, env...)
	out, err := cmd.CombinedOutput()
	if err != nil {
		s.t.Fatalf("node %s %v: %v\n%s", script, env, err, out)
	}
	return string(out)
}

// The acceptance flow with both generations of the SDK (2.51: /v2 create
// and connect; 2.50: the older paths) and the code interpreter SDK.
func TestStockSDKs(t *testing.T) {
	s := newServer(t)
	for _, pkg := range []string{"e2b", "e2b-2.50"} {
		out := s.node("acceptance.mjs", "SDK_PACKAGE="+pkg)
		sc := bufio.NewScanner(strings.NewReader(out))
		for sc.Scan() {
			t.Log(sc.Text())
		}
		if !strings.Contains(out, "13 passed, 0 failed") {
			t.Fatalf("%s: acceptance did not pass", pkg)
		}
	}
	// Nothing is left running.
	if code, body := s.rest("GET", "/v2/sandboxes", ""); code != 200 || string(body) != "[]\n" {
		t.Fatalf("sandboxes left: %d %s", code, body)
	}
}

type sandboxResp struct {
	SandboxID       string `json:"sandboxID"`
	EnvdAccessToken string `json:"envdAccessToken"`
	State           string `json:"state"`
	SporeState      string `json:"sporeState"`
}

// Restarting spore up after SIGKILL loses nothing: running sandboxes
// answer, paused and hibernated ones resume, snapshots still restore.
func TestRestartAfterSIGKILL(t *testing.T) {
	s := newServer(t)
	create := func(template string) sandboxResp {
		code, body := s.rest("POST", "/v2/sandboxes", `{"templateID":"`+template+`","timeout":600}`)
		if code != 201 {
			t.Fatalf("create: %d %s", code, body)
		}
		var r sandboxResp
		json.Unmarshal(body, &r)
		return r
	}
	run := create("base")
	paused := create("code-interpreter-v1")
	hib := create("base")
	snapCode, snapBody := s.rest("POST", "/sandboxes/"+run.SandboxID+"/snapshots", `{"name":"restart-test"}`)
	if snapCode != 201 {
		t.Fatalf("snapshot: %d %s", snapCode, snapBody)
	}
	if code, body := s.rest("POST", "/sandboxes/"+paused.SandboxID+"/pause", ""); code != 204 {
		t.Fatalf("pause: %d %s", code, body)
	}
	if code, body := s.rest("POST", "/sandboxes/"+hib.SandboxID+"/hibernate", ""); code != 204 {
		t.Fatalf("hibernate: %d %s", code, body)
	}
	s.kill9()
	s.start()
	for id, want := range map[string]string{run.SandboxID: "running", paused.SandboxID: "paused", hib.SandboxID: "hibernated"} {
		code, body := s.rest("GET", "/sandboxes/"+id, "")
		var r sandboxResp
		json.Unmarshal(body, &r)
		if code != 200 || r.SporeState != want {
			t.Fatalf("after restart %s: %d %s, want %s", id, code, body, want)
		}
	}
	// The running sandbox answers through the proxy with its token.
	req, _ := http.NewRequest("GET", "http://"+s.addr+"/health", nil)
	req.Header.Set("E2b-Sandbox-Id", run.SandboxID)
	resp, err := http.DefaultClient.Do(req)
	if err != nil || resp.StatusCode != 204 {
		t.Fatalf("proxy to the running sandbox after restart: %v %v", resp, err)
	}
	resp.Body.Close()
	for _, id := range []string{paused.SandboxID, hib.SandboxID} {
		if code, body := s.rest("POST", "/v2/sandboxes/"+id+"/connect", `{"timeout":60}`); code != 201 {
			t.Fatalf("connect %s after restart: %d %s", id, code, body)
		}
	}
	if code, body := s.rest("GET", "/snapshots?name=restart-test", ""); code != 200 || !strings.Contains(string(body), "restart-test") {
		t.Fatalf("snapshot after restart: %d %s", code, body)
	}
	from := create("restart-test")
	if code, body := s.rest("GET", "/sandboxes/"+from.SandboxID, ""); code != 200 {
		t.Fatalf("create from the snapshot after restart: %d %s", code, body)
	}
}

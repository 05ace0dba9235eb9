package node_test

import (
	"bufio"
	"bytes"
	"context"
	"encoding/base64"
	"encoding/json"
	"io"
	"log/slog"
	"net/http"
	"os"
	"path/filepath"
	"testing"
	"time"

	"connectrpc.com/connect"

	"github.com/spore-run/spore/internal/engine"
	"github.com/spore-run/spore/internal/envd"
	"github.com/spore-run/spore/internal/envd/interp"
	"github.com/spore-run/spore/internal/envdclient"
	"github.com/spore-run/spore/internal/errdefs"
	"github.com/spore-run/spore/internal/ids"
	"github.com/spore-run/spore/internal/node"
	"github.com/spore-run/spore/internal/testenv"
	processpb "github.com/spore-run/spore/proto/gen/process"
	"github.com/spore-run/spore/proto/gen/process/processpbconnect"
)

type env struct {
	t      testing.TB
	dir    string
	cgroup string
	n      *node.Node
	tune   func(*node.Config) // changes the node's configuration
	prefix string             // of the node's network namespaces
	rootfs string             // its own root filesystem directory (testenv.PrivateRootFSDir)
}

func newEnv(t testing.TB) *env { return newEnvTuned(t, nil) }

func newEnvTuned(t testing.TB, tune func(*node.Config)) *env {
	t.Helper()
	testenv.RequireRoot(t)
	e := &env{t: t, dir: t.TempDir(), cgroup: "/spore-test-" + ids.New('g'), tune: tune, rootfs: testenv.PrivateRootFSDir(t)}
	e.open()
	t.Cleanup(e.destroy)
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	if err := e.n.EnsureTemplates(ctx); err != nil {
		t.Fatal(err)
	}
	return e
}

func (e *env) open() {
	e.t.Helper()
	cfg := node.Config{
		DataDir: e.dir, RootFSDir: e.rootfs, Runsc: testenv.Runsc(e.t), EnvdBinary: testenv.EnvdBinary(e.t),
		NetPrefix: "spn", CgroupParent: e.cgroup,
		Logger: slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn})),
	}
	if e.tune != nil {
		e.tune(&cfg)
	}
	e.prefix = cfg.NetPrefix
	n, err := node.Open(context.Background(), cfg)
	if err != nil {
		e.t.Fatal(err)
	}
	e.n = n
}

func (e *env) destroy() {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	for _, sb := range e.n.Engine.List(ctx) {
		if err := e.n.Engine.Kill(ctx, sb.ID); err != nil && !errdefs.IsNotFound(err) {
			e.t.Errorf("cleanup: kill %s: %v", sb.ID, err)
		}
	}
	e.n.Close()
	if err := e.n.Runtime.Purge(ctx); err != nil {
		e.t.Errorf("cleanup: purge: %v", err)
	}
	if err := e.n.Net.Sweep(ctx, nil); err != nil {
		e.t.Errorf("cleanup: networks: %v", err)
	}
	e.n.Net.RemoveHostRules()
	if ents, _ := filepath.Glob("/var/run/netns/" + e.prefix + "-*"); len(ents) > 0 {
		e.t.Errorf("cleanup: namespaces left: %v", ents)
	}
}

func ctxFor(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	t.Cleanup(cancel)
	return ctx
}

func (e *env) create(ctx context.Context, opts engine.CreateOptions) engine.Sandbox {
	e.t.Helper()
	sb, err := e.n.Engine.Create(ctx, opts)
	if err != nil {
		e.t.Fatalf("create: %v", err)
	}
	if !sb.Addr.IsValid() || sb.Run.AccessToken == "" {
		e.t.Fatalf("created sandbox without address or token: %+v", sb)
	}
	return sb
}

// client is an envd client for one sandbox, as an SDK would hold it.
type client struct {
	t     testing.TB
	sb    engine.Sandbox
	token string
	user  string
	hc    *http.Client
	proc  processpbconnect.ProcessClient
}

func (e *env) client(sb engine.Sandbox, opts ...connect.ClientOption) *client {
	c := &client{t: e.t, sb: sb, token: sb.Run.AccessToken}
	opts = append(opts, connect.WithInterceptors(c))
	c.hc = &http.Client{Transport: &http.Transport{ReadBufferSize: 1 << 20, WriteBufferSize: 1 << 20, DisableCompression: true}}
	e.t.Cleanup(c.hc.CloseIdleConnections)
	c.proc = processpbconnect.NewProcessClient(c.hc, envdclient.URL(sb.Addr, envd.Port), opts...)
	return c
}

func (c *client) url(port int) string { return envdclient.URL(c.sb.Addr, port) }

func (c *client) header(h http.Header) {
	if c.token != "" {
		h.Set("X-Access-Token", c.token)
	}
	if c.user != "" {
		h.Set("Authorization", "Basic "+base64.StdEncoding.EncodeToString([]byte(c.user+":")))
	}
}

func (c *client) WrapUnary(next connect.UnaryFunc) connect.UnaryFunc {
	return func(ctx context.Context, req connect.AnyRequest) (connect.AnyResponse, error) {
		c.header(req.Header())
		return next(ctx, req)
	}
}

func (c *client) WrapStreamingClient(next connect.StreamingClientFunc) connect.StreamingClientFunc {
	return func(ctx context.Context, spec connect.Spec) connect.StreamingClientConn {
		conn := next(ctx, spec)
		c.header(conn.RequestHeader())
		return conn
	}
}

func (c *client) WrapStreamingHandler(next connect.StreamingHandlerFunc) connect.StreamingHandlerFunc {
	return next
}

type result struct {
	pid            uint32
	stdout, stderr string
	exit           int32
	status         string
}

// run runs a shell command through envd, as commands.run does.
func (c *client) run(ctx context.Context, script string) (result, error) {
	st, err := c.proc.Start(ctx, connect.NewRequest(&processpb.StartRequest{Process: &processpb.ProcessConfig{Cmd: "/bin/bash", Args: []string{"-l", "-c", script}}}))
	if err != nil {
		return result{}, err
	}
	var r result
	for st.Receive() {
		ev := st.Msg().GetEvent()
		switch {
		case ev.GetStart() != nil:
			r.pid = ev.GetStart().GetPid()
		case ev.GetData() != nil:
			r.stdout += string(ev.GetData().GetStdout())
			r.stderr += string(ev.GetData().GetStderr())
		case ev.GetEnd() != nil:
			r.exit, r.status = ev.GetEnd().GetExitCode(), ev.GetEnd().GetStatus()
		}
	}
	return r, st.Err()
}

func (c *client) sh(ctx context.Context, script string) string {
	c.t.Helper()
	r, err := c.run(ctx, script)
	if err != nil {
		c.t.Fatalf("run %q in %s: %v", script, c.sb.ID, err)
	}
	if r.exit != 0 {
		c.t.Fatalf("run %q in %s: exit %d: %s%s", script, c.sb.ID, r.exit, r.stdout, r.stderr)
	}
	return r.stdout
}

// http does a request to a port of the sandbox with its token.
func (c *client) http(ctx context.Context, method string, port int, path string, body io.Reader, hdr map[string]string) (int, []byte) {
	c.t.Helper()
	req, _ := http.NewRequestWithContext(ctx, method, envdclient.URL(c.sb.Addr, port)+path, body)
	c.header(req.Header)
	for k, v := range hdr {
		req.Header.Set(k, v)
	}
	resp, err := c.hc.Do(req)
	if err != nil {
		c.t.Fatalf("%s %s: %v", method, path, err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, b
}

// runCode runs code in the sandbox's default interpreter context and
// returns the main result's text (or the error name).
func (c *client) runCode(ctx context.Context, code string) string {
	c.t.Helper()
	b, _ := json.Marshal(map[string]string{"code": code})
	status, body := c.http(ctx, "POST", interp.Port, "/execute", bytes.NewReader(b), map[string]string{"Content-Type": "application/json"})
	if status != 200 {
		c.t.Fatalf("execute in %s: %d %s", c.sb.ID, status, body)
	}
	sc := bufio.NewScanner(bytes.NewReader(body))
	for sc.Scan() {
		var ev map[string]any
		json.Unmarshal(sc.Bytes(), &ev)
		switch ev["type"] {
		case "result":
			return ev["text"].(string)
		case "error":
			return "error: " + ev["name"].(string) + ": " + ev["value"].(string)
		}
	}
	return ""
}

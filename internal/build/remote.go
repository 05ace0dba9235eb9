package build

import (
	"bytes"
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strconv"

	"connectrpc.com/connect"

	"github.com/spore-run/spore/internal/errdefs"
	filesystempb "github.com/spore-run/spore/proto/gen/filesystem"
	"github.com/spore-run/spore/proto/gen/filesystem/filesystempbconnect"
	processpb "github.com/spore-run/spore/proto/gen/process"
	"github.com/spore-run/spore/proto/gen/process/processpbconnect"
)

// envdPort is the daemon's port, as the proxy routes it.
const envdPort = 49983

// Remote is a build sandbox reached through Spore's sandbox proxy at Base
// (an API server's address), as an SDK reaches it: the E2b-Sandbox-Id
// header names the sandbox, its access token authorizes.
type Remote struct {
	HTTP  *http.Client
	Base  string // http://host:port
	SID   string
	Token string
}

func (r *Remote) ID() string { return r.SID }

func (r *Remote) header(h http.Header, user string) {
	h.Set("E2b-Sandbox-Id", r.SID)
	h.Set("E2b-Sandbox-Port", strconv.Itoa(envdPort))
	if r.Token != "" {
		h.Set("X-Access-Token", r.Token)
	}
	if user != "" {
		h.Set("Authorization", "Basic "+base64.StdEncoding.EncodeToString([]byte(user+":")))
	}
}

func (r *Remote) proc() processpbconnect.ProcessClient {
	return processpbconnect.NewProcessClient(r.HTTP, r.Base)
}

// Run runs argv and sends its output, line by line, to out.
func (r *Remote) Run(ctx context.Context, argv []string, user string, out func(string)) (int, error) {
	req := connect.NewRequest(&processpb.StartRequest{Process: &processpb.ProcessConfig{Cmd: argv[0], Args: argv[1:]}})
	r.header(req.Header(), user)
	st, err := r.proc().Start(ctx, req)
	if err != nil {
		return -1, fmt.Errorf("%w: %v", errdefs.ErrUnavailable, err)
	}
	defer st.Close()
	lw := &lineWriter{out: out}
	code := -1
	for st.Receive() {
		ev := st.Msg().GetEvent()
		if d := ev.GetData(); d != nil {
			lw.Write(d.GetStdout())
			lw.Write(d.GetStderr())
		}
		if e := ev.GetEnd(); e != nil {
			code = int(e.GetExitCode())
			if !e.GetExited() && e.GetError() != "" {
				lw.flush()
				return code, errdefs.Invalidf("%s", e.GetError())
			}
		}
	}
	lw.flush()
	if err := st.Err(); err != nil {
		if ctx.Err() != nil {
			return code, ctx.Err()
		}
		if ce := new(connect.Error); errors.As(err, &ce) && ce.Code() == connect.CodeInvalidArgument {
			return code, errdefs.Invalidf("%s", ce.Message())
		}
		return code, fmt.Errorf("%w: %v", errdefs.ErrUnavailable, err)
	}
	return code, nil
}

// Background starts argv and leaves it to the daemon once it started. The
// start stream stays open while ctx lasts, so the process's end (its exit
// code and last lines) is seen: a start command the image cannot run ends
// at once with 127.
func (r *Remote) Background(ctx context.Context, argv []string, user string) (<-chan Exit, error) {
	sctx, cancel := context.WithCancel(ctx)
	req := connect.NewRequest(&processpb.StartRequest{Process: &processpb.ProcessConfig{Cmd: argv[0], Args: argv[1:]}})
	r.header(req.Header(), user)
	st, err := r.proc().Start(sctx, req)
	if err != nil {
		cancel()
		return nil, fmt.Errorf("%w: %v", errdefs.ErrUnavailable, err)
	}
	closeStream := func() {
		cancel() // first: Close drains what is left of a live stream
		st.Close()
	}
	if !st.Receive() {
		err := st.Err()
		closeStream()
		if err != nil {
			return nil, errdefs.Invalidf("%v", err)
		}
		return nil, errdefs.Invalidf("the process did not start")
	}
	if st.Msg().GetEvent().GetStart() == nil {
		closeStream()
		return nil, errdefs.Invalidf("the process did not start")
	}
	exited := make(chan Exit, 1)
	go func() {
		defer closeStream()
		tail := &tailLines{max: maxTailLines}
		lw := &lineWriter{out: tail.add}
		for st.Receive() {
			ev := st.Msg().GetEvent()
			if d := ev.GetData(); d != nil {
				lw.Write(d.GetStdout())
				lw.Write(d.GetStderr())
			}
			if e := ev.GetEnd(); e != nil {
				lw.flush()
				code := int(e.GetExitCode())
				if !e.GetExited() {
					code = -1
				}
				exited <- Exit{Code: code, Tail: tail.lines}
				return
			}
		}
	}()
	return exited, nil
}

// maxTailLines is how many last lines of a background process's output
// its Exit keeps.
const maxTailLines = 20

// tailLines keeps the last max lines.
type tailLines struct {
	max   int
	lines []string
}

func (t *tailLines) add(l string) {
	if len(t.lines) == t.max {
		t.lines = t.lines[1:]
	}
	t.lines = append(t.lines, l)
}

// WriteFile uploads body to path as root (envd's POST /files).
func (r *Remote) WriteFile(ctx context.Context, path string, body io.Reader) error {
	q := url.Values{"path": {path}, "username": {"root"}}
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, r.Base+"/files?"+q.Encode(), body)
	if err != nil {
		return err
	}
	req.Header.Set("Content-Type", "application/octet-stream")
	r.header(req.Header, "")
	return r.do(req)
}

// Remove removes path (envd's filesystem Remove).
func (r *Remote) Remove(ctx context.Context, path string) error {
	req := connect.NewRequest(&filesystempb.RemoveRequest{Path: path})
	r.header(req.Header(), "root")
	_, err := filesystempbconnect.NewFilesystemClient(r.HTTP, r.Base).Remove(ctx, req)
	return err
}

// Env reads the daemon's default environment (envd's GET /envs).
func (r *Remote) Env(ctx context.Context) (map[string]string, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, r.Base+"/envs", nil)
	if err != nil {
		return nil, err
	}
	r.header(req.Header, "")
	resp, err := r.HTTP.Do(req)
	if err != nil {
		return nil, fmt.Errorf("%w: %v", errdefs.ErrUnavailable, err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		msg, _ := io.ReadAll(io.LimitReader(resp.Body, 4096))
		return nil, fmt.Errorf("%w: GET /envs: HTTP %d: %s", errdefs.ErrUnavailable, resp.StatusCode, bytes.TrimSpace(msg))
	}
	env := map[string]string{}
	if err := json.NewDecoder(io.LimitReader(resp.Body, 1<<20)).Decode(&env); err != nil {
		return nil, fmt.Errorf("%w: GET /envs: %v", errdefs.ErrUnavailable, err)
	}
	return env, nil
}

// MakeDir creates path and its parents as root (envd's MakeDir); one
// that exists is fine.
func (r *Remote) MakeDir(ctx context.Context, path string) error {
	req := connect.NewRequest(&filesystempb.MakeDirRequest{Path: path})
	r.header(req.Header(), "root")
	_, err := filesystempbconnect.NewFilesystemClient(r.HTTP, r.Base).MakeDir(ctx, req)
	if ce := new(connect.Error); errors.As(err, &ce) && ce.Code() == connect.CodeAlreadyExists {
		return nil
	}
	return err
}

// Init sets the daemon's defaults (envd's POST /init).
func (r *Remote) Init(ctx context.Context, env map[string]string, user, workdir string) error {
	b, err := json.Marshal(map[string]any{"envVars": env, "defaultUser": user, "defaultWorkdir": workdir})
	if err != nil {
		return err
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, r.Base+"/init", bytes.NewReader(b))
	if err != nil {
		return err
	}
	req.Header.Set("Content-Type", "application/json")
	r.header(req.Header, "")
	return r.do(req)
}

func (r *Remote) do(req *http.Request) error {
	resp, err := r.HTTP.Do(req)
	if err != nil {
		return fmt.Errorf("%w: %v", errdefs.ErrUnavailable, err)
	}
	defer resp.Body.Close()
	msg, _ := io.ReadAll(io.LimitReader(resp.Body, 4096))
	switch {
	case resp.StatusCode < 300:
		return nil
	case resp.StatusCode == http.StatusBadRequest || resp.StatusCode == http.StatusNotFound:
		return errdefs.Invalidf("%s %s: %s", req.Method, req.URL.Path, bytes.TrimSpace(msg))
	default:
		return fmt.Errorf("%w: %s %s: HTTP %d: %s", errdefs.ErrUnavailable, req.Method, req.URL.Path, resp.StatusCode, bytes.TrimSpace(msg))
	}
}

// lineWriter splits output into lines (a long line is cut at 4 KiB).
type lineWriter struct {
	out func(string)
	buf []byte
}

func (l *lineWriter) Write(p []byte) {
	l.buf = append(l.buf, p...)
	for {
		i := bytes.IndexByte(l.buf, '\n')
		if i < 0 {
			if len(l.buf) > 4096 {
				l.out(string(l.buf[:4096]))
				l.buf = l.buf[4096:]
				continue
			}
			return
		}
		l.out(string(l.buf[:i]))
		l.buf = l.buf[i+1:]
	}
}

func (l *lineWriter) flush() {
	if len(l.buf) > 0 {
		l.out(string(l.buf))
		l.buf = nil
	}
}

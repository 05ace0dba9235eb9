package envd_test

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"io"
	"mime/multipart"
	"net/http"
	"net/http/httptest"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"connectrpc.com/connect"

	"github.com/spore-run/spore/internal/envd"
	"github.com/spore-run/spore/internal/envd/identity"
	fspb "github.com/spore-run/spore/proto/gen/filesystem"
	"github.com/spore-run/spore/proto/gen/filesystem/filesystempbconnect"
	processpb "github.com/spore-run/spore/proto/gen/process"
	"github.com/spore-run/spore/proto/gen/process/processpbconnect"
)

// daemon is an envd served in-process over HTTP/1.1, as the host reaches
// it, with clients in one codec.
type daemon struct {
	t    *testing.T
	envd *envd.Server
	srv  *httptest.Server
	proc processpbconnect.ProcessClient
	fs   filesystempbconnect.FilesystemClient
	// header is added to every request (auth, user).
	header http.Header
}

// testHomes holds the homes the tests' accounts are given (hostAccounts).
var testHomes string

func TestMain(m *testing.M) {
	dir, err := os.MkdirTemp("", "spore-envd-homes-")
	if err == nil {
		err = os.Chmod(dir, 0o755) // every account reaches its home
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "envd tests: homes:", err)
		os.Exit(1)
	}
	testHomes = dir
	code := m.Run()
	os.RemoveAll(dir)
	os.Exit(code)
}

// hostAccounts resolves users as envd does on its own, but with a home of
// their own under testHomes (the same for every daemon of the run): the
// tests' login shells (`bash -l`, as the SDKs send) run none of the host
// user's dotfiles. On a host whose root .bashrc runs `pyenv rehash`, a
// shell killed at a test's end mid-rehash left pyenv's lock behind, and
// every later login shell on the host waited on it: TestPTY,
// TestFilesInitAuth and TestWarmShellSameAsAFreshShell then timed out.
func hostAccounts(name string) (identity.User, error) {
	u, err := identity.Lookup(name)
	if err != nil {
		return u, err
	}
	u.Home = filepath.Join(testHomes, u.Name)
	if err := os.MkdirAll(u.Home, 0o755); err != nil {
		return identity.User{}, err
	}
	if err := os.Chown(u.Home, int(u.UID), int(u.GID)); err != nil {
		return identity.User{}, err
	}
	return u, nil
}

func newDaemon(t *testing.T, opts ...connect.ClientOption) *daemon {
	t.Helper()
	return newDaemonConfig(t, envd.Config{DefaultUser: "root", Keepalive: 200 * time.Millisecond}, opts...)
}

func newDaemonConfig(t *testing.T, cfg envd.Config, opts ...connect.ClientOption) *daemon {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Fatal("envd tests run as root (envd switches users)")
	}
	if cfg.LookupUser == nil {
		cfg.LookupUser = hostAccounts
	}
	s := envd.New(cfg)
	t.Cleanup(s.Processes().Close) // its warm shell
	srv := httptest.NewServer(s)
	t.Cleanup(srv.Close)
	d := &daemon{t: t, envd: s, srv: srv, header: http.Header{}}
	opts = append(opts, connect.WithInterceptors(headerInterceptor{d}))
	d.proc = processpbconnect.NewProcessClient(srv.Client(), srv.URL, opts...)
	d.fs = filesystempbconnect.NewFilesystemClient(srv.Client(), srv.URL, opts...)
	return d
}

type headerInterceptor struct{ d *daemon }

func (h headerInterceptor) WrapUnary(next connect.UnaryFunc) connect.UnaryFunc {
	return func(ctx context.Context, req connect.AnyRequest) (connect.AnyResponse, error) {
		for k, v := range h.d.header {
			req.Header()[k] = v
		}
		return next(ctx, req)
	}
}

func (h headerInterceptor) WrapStreamingClient(next connect.StreamingClientFunc) connect.StreamingClientFunc {
	return func(ctx context.Context, spec connect.Spec) connect.StreamingClientConn {
		conn := next(ctx, spec)
		for k, v := range h.d.header {
			conn.RequestHeader()[k] = v
		}
		return conn
	}
}

func (h headerInterceptor) WrapStreamingHandler(next connect.StreamingHandlerFunc) connect.StreamingHandlerFunc {
	return next
}

func ctxFor(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	t.Cleanup(cancel)
	return ctx
}

// result is what a finished process produced.
type result struct {
	pid            uint32
	stdout, stderr string
	pty            string
	end            *processpb.ProcessEvent_EndEvent
	keepalives     int
}

func collect(t *testing.T, next func() bool, ev func() *processpb.ProcessEvent, errf func() error) result {
	t.Helper()
	var r result
	for next() {
		switch e := ev().GetEvent().(type) {
		case *processpb.ProcessEvent_Start:
			r.pid = e.Start.GetPid()
		case *processpb.ProcessEvent_Data:
			r.stdout += string(e.Data.GetStdout())
			r.stderr += string(e.Data.GetStderr())
			r.pty += string(e.Data.GetPty())
		case *processpb.ProcessEvent_End:
			r.end = e.End
		case *processpb.ProcessEvent_Keepalive:
			r.keepalives++
		}
	}
	if err := errf(); err != nil {
		t.Fatalf("stream: %v", err)
	}
	return r
}

func (d *daemon) run(ctx context.Context, req *processpb.StartRequest) result {
	d.t.Helper()
	st, err := d.proc.Start(ctx, connect.NewRequest(req))
	if err != nil {
		d.t.Fatal(err)
	}
	return collect(d.t, st.Receive, func() *processpb.ProcessEvent { return st.Msg().GetEvent() }, st.Err)
}

func sh(script string) *processpb.StartRequest {
	return &processpb.StartRequest{Process: &processpb.ProcessConfig{Cmd: "/bin/bash", Args: []string{"-l", "-c", script}}}
}

func codecs() map[string][]connect.ClientOption {
	return map[string][]connect.ClientOption{
		"json":   {connect.WithProtoJSON()},
		"binary": nil,
	}
}

func TestProcess(t *testing.T) {
	for name, opts := range codecs() {
		t.Run(name, func(t *testing.T) {
			d := newDaemon(t, opts...)
			ctx := ctxFor(t)

			r := d.run(ctx, sh("echo out; echo err >&2; exit 3"))
			if r.pid == 0 || r.stdout != "out\n" || r.stderr != "err\n" || r.end.GetExitCode() != 3 || !r.end.GetExited() || r.end.GetStatus() != "exit status 3" {
				t.Fatalf("run = %+v", r)
			}

			// env and cwd
			req := sh(`echo "$GREETING $PWD"`)
			req.Process.Envs = map[string]string{"GREETING": "hello"}
			cwd := "/tmp"
			req.Process.Cwd = &cwd
			if r := d.run(ctx, req); r.stdout != "hello /tmp\n" {
				t.Fatalf("env/cwd = %q", r.stdout)
			}

			// a missing cwd or command is refused clearly
			bad := "/no/such/dir"
			req = sh("true")
			req.Process.Cwd = &bad
			if _, err := startErr(ctx, d, req); connect.CodeOf(err) != connect.CodeInvalidArgument {
				t.Fatalf("missing cwd = %v", err)
			}
			if _, err := startErr(ctx, d, &processpb.StartRequest{Process: &processpb.ProcessConfig{Cmd: "no-such-command-xyz"}}); connect.CodeOf(err) != connect.CodeInvalidArgument {
				t.Fatalf("missing command = %v", err)
			}

			// user switching with Authorization: Basic
			d.header.Set("Authorization", "Basic "+base64.StdEncoding.EncodeToString([]byte("nobody:")))
			if r := d.run(ctx, sh("id -un")); r.stdout != "nobody\n" {
				t.Fatalf("as nobody: %q %q", r.stdout, r.stderr)
			}
			d.header.Set("Authorization", "Basic "+base64.StdEncoding.EncodeToString([]byte("no-such-user:")))
			if _, err := startErr(ctx, d, sh("true")); connect.CodeOf(err) != connect.CodeInvalidArgument {
				t.Fatalf("unknown user = %v", err)
			}
			d.header.Del("Authorization")

			// a signal ends the process group
			r = d.run(ctx, sh("kill -TERM $$; sleep 5"))
			if r.end.GetExited() || r.end.GetStatus() != "signal: terminated" {
				t.Fatalf("killed = %+v", r.end)
			}
		})
	}
}

func startErr(ctx context.Context, d *daemon, req *processpb.StartRequest) (result, error) {
	st, err := d.proc.Start(ctx, connect.NewRequest(req))
	if err != nil {
		return result{}, err
	}
	for st.Receive() {
	}
	return result{}, st.Err()
}

// A background process with stdin: input, connect from a second client,
// list, close stdin, signal.
func TestBackgroundStdinConnectSignal(t *testing.T) {
	for name, opts := range codecs() {
		t.Run(name, func(t *testing.T) {
			d := newDaemon(t, opts...)
			ctx := ctxFor(t)
			yes := true
			tag := "reader"
			st, err := d.proc.Start(ctx, connect.NewRequest(&processpb.StartRequest{
				Process: &processpb.ProcessConfig{Cmd: "/bin/cat"}, Stdin: &yes, Tag: &tag,
			}))
			if err != nil {
				t.Fatal(err)
			}
			if !st.Receive() {
				t.Fatal(st.Err())
			}
			pid := st.Msg().GetEvent().GetEvent().(*processpb.ProcessEvent_Start).Start.GetPid()

			list, err := d.proc.List(ctx, connect.NewRequest(&processpb.ListRequest{}))
			if err != nil || len(list.Msg.GetProcesses()) != 1 || list.Msg.GetProcesses()[0].GetTag() != "reader" || list.Msg.GetProcesses()[0].GetPid() != pid {
				t.Fatalf("List = %v, %v", list, err)
			}
			// A second client re-attaches by tag.
			cctx, ccancel := context.WithCancel(ctx)
			conn, err := d.proc.Connect(cctx, connect.NewRequest(&processpb.ConnectRequest{Process: &processpb.ProcessSelector{Selector: &processpb.ProcessSelector_Tag{Tag: "reader"}}}))
			if err != nil {
				t.Fatal(err)
			}
			if !conn.Receive() || conn.Msg().GetEvent().GetStart().GetPid() != pid {
				t.Fatalf("connect start: %v", conn.Err())
			}
			sel := &processpb.ProcessSelector{Selector: &processpb.ProcessSelector_Pid{Pid: pid}}
			if _, err := d.proc.SendInput(ctx, connect.NewRequest(&processpb.SendInputRequest{Process: sel, Input: &processpb.ProcessInput{Input: &processpb.ProcessInput_Stdin{Stdin: []byte("ping\n")}}})); err != nil {
				t.Fatal(err)
			}
			// Both the starter and the re-attached client see the echo.
			for _, s := range []interface {
				Receive() bool
				Err() error
			}{st, conn} {
				got := ""
				for got != "ping\n" && s.Receive() {
					var ev *processpb.ProcessEvent
					switch m := any(s).(type) {
					case *connect.ServerStreamForClient[processpb.StartResponse]:
						ev = m.Msg().GetEvent()
					case *connect.ServerStreamForClient[processpb.ConnectResponse]:
						ev = m.Msg().GetEvent()
					}
					got += string(ev.GetData().GetStdout())
				}
				if got != "ping\n" {
					t.Fatalf("echo = %q (%v)", got, s.Err())
				}
			}
			ccancel()
			// Closing stdin ends cat normally.
			if _, err := d.proc.CloseStdin(ctx, connect.NewRequest(&processpb.CloseStdinRequest{Process: sel})); err != nil {
				t.Fatal(err)
			}
			r := collect(t, st.Receive, func() *processpb.ProcessEvent { return st.Msg().GetEvent() }, st.Err)
			if r.end.GetExitCode() != 0 || !r.end.GetExited() {
				t.Fatalf("after close stdin: %+v", r.end)
			}
			// Gone now.
			if _, err := d.proc.SendInput(ctx, connect.NewRequest(&processpb.SendInputRequest{Process: sel, Input: &processpb.ProcessInput{Input: &processpb.ProcessInput_Stdin{Stdin: []byte("x")}}})); connect.CodeOf(err) != connect.CodeNotFound {
				t.Fatalf("input to an ended process = %v", err)
			}

			// SIGKILL through SendSignal; a keepalive arrives on a quiet stream.
			st2, err := d.proc.Start(ctx, connect.NewRequest(sh("sleep 30")))
			if err != nil {
				t.Fatal(err)
			}
			st2.Receive()
			pid2 := st2.Msg().GetEvent().GetStart().GetPid()
			// The kill comes once a keepalive did (read for, not a fixed
			// 500 ms, in which a loaded host may send none; the sleep's
			// end ends the stream if none ever comes).
			keepalives := 0
			for keepalives == 0 && st2.Receive() {
				if st2.Msg().GetEvent().GetKeepalive() != nil {
					keepalives++
				}
			}
			if keepalives == 0 {
				t.Fatalf("no keepalive on a quiet stream: %v", st2.Err())
			}
			if _, err := d.proc.SendSignal(ctx, connect.NewRequest(&processpb.SendSignalRequest{
				Process: &processpb.ProcessSelector{Selector: &processpb.ProcessSelector_Pid{Pid: pid2}}, Signal: processpb.Signal_SIGNAL_SIGKILL,
			})); err != nil {
				t.Fatal(err)
			}
			r = collect(t, st2.Receive, func() *processpb.ProcessEvent { return st2.Msg().GetEvent() }, st2.Err)
			if r.end.GetStatus() != "signal: killed" || keepalives+r.keepalives == 0 {
				t.Fatalf("after SIGKILL: %+v, %d keepalives", r.end, keepalives+r.keepalives)
			}
			if _, err := d.proc.SendSignal(ctx, connect.NewRequest(&processpb.SendSignalRequest{Process: &processpb.ProcessSelector{Selector: &processpb.ProcessSelector_Pid{Pid: 999999}}, Signal: processpb.Signal_SIGNAL_SIGKILL})); connect.CodeOf(err) != connect.CodeNotFound {
				t.Fatalf("signal to unknown pid = %v", err)
			}
		})
	}
}

func TestPTY(t *testing.T) {
	d := newDaemon(t)
	ctx := ctxFor(t)
	req := &processpb.StartRequest{
		Process: &processpb.ProcessConfig{Cmd: "/bin/bash", Args: []string{"-i"}},
		Pty:     &processpb.PTY{Size: &processpb.PTY_Size{Cols: 80, Rows: 24}},
	}
	st, err := d.proc.Start(ctx, connect.NewRequest(req))
	if err != nil {
		t.Fatal(err)
	}
	st.Receive()
	pid := st.Msg().GetEvent().GetStart().GetPid()
	sel := &processpb.ProcessSelector{Selector: &processpb.ProcessSelector_Pid{Pid: pid}}
	if _, err := d.proc.Update(ctx, connect.NewRequest(&processpb.UpdateRequest{Process: sel, Pty: &processpb.PTY{Size: &processpb.PTY_Size{Cols: 132, Rows: 43}}})); err != nil {
		t.Fatal(err)
	}
	in := func(s string) {
		if _, err := d.proc.SendInput(ctx, connect.NewRequest(&processpb.SendInputRequest{Process: sel, Input: &processpb.ProcessInput{Input: &processpb.ProcessInput_Pty{Pty: []byte(s)}}})); err != nil {
			t.Fatal(err)
		}
	}
	in("stty size; tty; exit 5\n")
	r := collect(t, st.Receive, func() *processpb.ProcessEvent { return st.Msg().GetEvent() }, st.Err)
	if !strings.Contains(r.pty, "43 132") || !strings.Contains(r.pty, "/dev/pts/") || r.end.GetExitCode() != 5 {
		t.Fatalf("pty output %q, end %+v", r.pty, r.end)
	}
}

func TestFilesystem(t *testing.T) {
	for name, opts := range codecs() {
		t.Run(name, func(t *testing.T) {
			d := newDaemon(t, opts...)
			ctx := ctxFor(t)
			dir := t.TempDir()
			mk := func(p string) (*fspb.EntryInfo, error) {
				r, err := d.fs.MakeDir(ctx, connect.NewRequest(&fspb.MakeDirRequest{Path: p}))
				if err != nil {
					return nil, err
				}
				return r.Msg.GetEntry(), nil
			}
			e, err := mk(dir + "/a/b/c")
			if err != nil || e.GetType() != fspb.FileType_FILE_TYPE_DIRECTORY || e.GetName() != "c" {
				t.Fatalf("MakeDir = %v, %v", e, err)
			}
			if _, err := mk(dir + "/a/b/c"); connect.CodeOf(err) != connect.CodeAlreadyExists {
				t.Fatalf("MakeDir again = %v", err)
			}
			os.WriteFile(dir+"/a/f.txt", []byte("12345"), 0o644)
			os.Symlink("f.txt", dir+"/a/link")
			st, err := d.fs.Stat(ctx, connect.NewRequest(&fspb.StatRequest{Path: dir + "/a/f.txt"}))
			if err != nil || st.Msg.GetEntry().GetSize() != 5 || st.Msg.GetEntry().GetType() != fspb.FileType_FILE_TYPE_FILE || st.Msg.GetEntry().GetOwner() != "root" {
				t.Fatalf("Stat = %v, %v", st, err)
			}
			st, _ = d.fs.Stat(ctx, connect.NewRequest(&fspb.StatRequest{Path: dir + "/a/link"}))
			if st.Msg.GetEntry().GetType() != fspb.FileType_FILE_TYPE_SYMLINK || st.Msg.GetEntry().GetSymlinkTarget() != "f.txt" {
				t.Fatalf("Stat(link) = %v", st.Msg.GetEntry())
			}
			if _, err := d.fs.Stat(ctx, connect.NewRequest(&fspb.StatRequest{Path: dir + "/nope"})); connect.CodeOf(err) != connect.CodeNotFound {
				t.Fatalf("Stat(missing) = %v", err)
			}
			names := func(depth uint32) []string {
				r, err := d.fs.ListDir(ctx, connect.NewRequest(&fspb.ListDirRequest{Path: dir + "/a", Depth: depth}))
				if err != nil {
					t.Fatal(err)
				}
				var out []string
				for _, e := range r.Msg.GetEntries() {
					out = append(out, strings.TrimPrefix(e.GetPath(), dir+"/a/"))
				}
				return out
			}
			if got := fmt.Sprint(names(1)); got != "[b f.txt link]" {
				t.Fatalf("ListDir depth 1 = %s", got)
			}
			if got := fmt.Sprint(names(3)); got != "[b b/c f.txt link]" {
				t.Fatalf("ListDir depth 3 = %s", got)
			}
			if _, err := d.fs.ListDir(ctx, connect.NewRequest(&fspb.ListDirRequest{Path: dir + "/a/f.txt"})); connect.CodeOf(err) != connect.CodeInvalidArgument {
				t.Fatalf("ListDir(file) = %v", err)
			}
			mv, err := d.fs.Move(ctx, connect.NewRequest(&fspb.MoveRequest{Source: dir + "/a/f.txt", Destination: dir + "/x/y/g.txt"}))
			if err != nil || mv.Msg.GetEntry().GetPath() != dir+"/x/y/g.txt" {
				t.Fatalf("Move = %v, %v", mv, err)
			}
			if _, err := d.fs.Move(ctx, connect.NewRequest(&fspb.MoveRequest{Source: dir + "/a/f.txt", Destination: dir + "/z"})); connect.CodeOf(err) != connect.CodeNotFound {
				t.Fatalf("Move(missing) = %v", err)
			}
			if _, err := d.fs.Remove(ctx, connect.NewRequest(&fspb.RemoveRequest{Path: dir + "/a"})); err != nil {
				t.Fatal(err)
			}
			if _, err := os.Stat(dir + "/a"); !os.IsNotExist(err) {
				t.Fatal("Remove left the directory")
			}
			if _, err := d.fs.Remove(ctx, connect.NewRequest(&fspb.RemoveRequest{Path: dir + "/a"})); connect.CodeOf(err) != connect.CodeNotFound {
				t.Fatalf("Remove(missing) = %v", err)
			}
			// Relative paths are relative to the user's home.
			if _, err := d.fs.Stat(ctx, connect.NewRequest(&fspb.StatRequest{Path: "."})); err != nil {
				t.Fatalf("Stat(.) = %v", err)
			}
		})
	}
}

func TestWatchDir(t *testing.T) {
	d := newDaemon(t)
	ctx := ctxFor(t)
	dir := t.TempDir()
	wctx, cancel := context.WithCancel(ctx)
	defer cancel()
	st, err := d.fs.WatchDir(wctx, connect.NewRequest(&fspb.WatchDirRequest{Path: dir, Recursive: true}))
	if err != nil {
		t.Fatal(err)
	}
	if !st.Receive() || st.Msg().GetStart() == nil {
		t.Fatalf("first event not start: %v %v", st.Msg(), st.Err())
	}
	want := map[string]bool{"CREATE sub": false, "CREATE sub/new.txt": false, "WRITE sub/new.txt": false, "REMOVE sub/new.txt": false}
	deadline := time.After(30 * time.Second)
	missing := func() int {
		n := 0
		for _, ok := range want {
			if !ok {
				n++
			}
		}
		return n
	}
	events := make(chan *fspb.WatchDirResponse)
	go func() {
		for st.Receive() {
			events <- st.Msg()
		}
		close(events)
	}()
	until := func(done func() bool) {
		t.Helper()
		for !done() {
			select {
			case m, ok := <-events:
				if !ok {
					t.Fatalf("stream ended: %v", st.Err())
				}
				if fe := m.GetFilesystem(); fe != nil {
					want[strings.TrimPrefix(fe.GetType().String(), "EVENT_TYPE_")+" "+fe.GetName()] = true
				}
			case <-deadline:
				t.Fatalf("events seen: %v", want)
			}
		}
	}
	os.Mkdir(dir+"/sub", 0o755)
	// The watcher adds sub before it sends sub's create: once that came,
	// sub is watched (a fixed 100 ms could pass first on a loaded host).
	until(func() bool { return want["CREATE sub"] })
	os.WriteFile(dir+"/sub/new.txt", []byte("x"), 0o644)
	os.Remove(dir + "/sub/new.txt")
	until(func() bool { return missing() == 0 })
	// Polling watchers.
	w, err := d.fs.CreateWatcher(ctx, connect.NewRequest(&fspb.CreateWatcherRequest{Path: dir}))
	if err != nil {
		t.Fatal(err)
	}
	os.WriteFile(dir+"/polled", []byte("x"), 0o644)
	var got []string
	for deadline := time.Now().Add(30 * time.Second); len(got) == 0 && time.Now().Before(deadline); { // a loaded host can be slow
		time.Sleep(50 * time.Millisecond)
		r, err := d.fs.GetWatcherEvents(ctx, connect.NewRequest(&fspb.GetWatcherEventsRequest{WatcherId: w.Msg.GetWatcherId()}))
		if err != nil {
			t.Fatal(err)
		}
		for _, e := range r.Msg.GetEvents() {
			got = append(got, e.GetName())
		}
	}
	if len(got) == 0 || got[0] != "polled" {
		t.Fatalf("polled events %v", got)
	}
	if _, err := d.fs.RemoveWatcher(ctx, connect.NewRequest(&fspb.RemoveWatcherRequest{WatcherId: w.Msg.GetWatcherId()})); err != nil {
		t.Fatal(err)
	}
	if _, err := d.fs.GetWatcherEvents(ctx, connect.NewRequest(&fspb.GetWatcherEventsRequest{WatcherId: w.Msg.GetWatcherId()})); connect.CodeOf(err) != connect.CodeNotFound {
		t.Fatalf("removed watcher = %v", err)
	}
	bad, err := d.fs.WatchDir(ctx, connect.NewRequest(&fspb.WatchDirRequest{Path: dir + "/nope"}))
	if err == nil {
		for bad.Receive() {
		}
		err = bad.Err()
	}
	if connect.CodeOf(err) != connect.CodeNotFound {
		t.Fatalf("WatchDir(missing) = %v", err)
	}
}

// /files, /init, tokens and presigned URLs.
func TestFilesInitAuth(t *testing.T) {
	d := newDaemon(t)
	ctx := ctxFor(t)
	dir := t.TempDir()
	base := d.srv.URL

	do := func(method, url string, body io.Reader, hdr map[string]string) (*http.Response, []byte) {
		t.Helper()
		req, _ := http.NewRequestWithContext(ctx, method, url, body)
		for k, v := range hdr {
			req.Header.Set(k, v)
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp, b
	}
	// 10 MB of binary through octet-stream, read back identical.
	blob := make([]byte, 10<<20)
	for i := range blob {
		blob[i] = byte(i*7 + i>>9)
	}
	resp, body := do("POST", base+"/files?path="+dir+"/deep/er/blob.bin", bytes.NewReader(blob), map[string]string{"Content-Type": "application/octet-stream"})
	if resp.StatusCode != 200 || !strings.Contains(string(body), `"name":"blob.bin"`) {
		t.Fatalf("upload = %d %s", resp.StatusCode, body)
	}
	resp, body = do("GET", base+"/files?path="+dir+"/deep/er/blob.bin", nil, nil)
	if resp.StatusCode != 200 || !bytes.Equal(body, blob) {
		t.Fatalf("download = %d, %d bytes, equal %v", resp.StatusCode, len(body), bytes.Equal(body, blob))
	}
	// Multipart with two files, named by their parts; owned by the user.
	var mp bytes.Buffer
	mw := multipart.NewWriter(&mp)
	for _, f := range []string{dir + "/m/one.txt", dir + "/m/two.txt"} {
		w, _ := mw.CreateFormFile("file", f)
		w.Write([]byte("content of " + filepath.Base(f)))
	}
	mw.Close()
	resp, body = do("POST", base+"/files?username=nobody", &mp, map[string]string{"Content-Type": mw.FormDataContentType()})
	var written []map[string]string
	json.Unmarshal(body, &written)
	if resp.StatusCode != 200 || len(written) != 2 || written[1]["path"] != dir+"/m/two.txt" {
		t.Fatalf("multipart = %d %s", resp.StatusCode, body)
	}
	if b, _ := os.ReadFile(dir + "/m/two.txt"); string(b) != "content of two.txt" {
		t.Fatalf("two.txt = %q", b)
	}
	if owner := ownerOf(dir + "/m/one.txt"); owner != 65534 {
		t.Fatalf("owner uid %d, want nobody (65534)", owner)
	}
	// Errors: missing file 404, directory 400, no path 400, all JSON.
	for _, c := range []struct {
		method, url string
		want        int
	}{
		{"GET", "/files?path=" + dir + "/missing", 404},
		{"GET", "/files?path=" + dir, 400},
		{"GET", "/files", 400},
		{"POST", "/files", 400},
		{"GET", "/files?path=/etc/hostname&username=no-such-user", 400},
	} {
		resp, body := do(c.method, base+c.url, nil, map[string]string{"Content-Type": "application/octet-stream"})
		var e struct {
			Code    int    `json:"code"`
			Message string `json:"message"`
		}
		if resp.StatusCode != c.want || json.Unmarshal(body, &e) != nil || e.Code != c.want || e.Message == "" {
			t.Errorf("%s %s = %d %s, want %d with a JSON error", c.method, c.url, resp.StatusCode, body, c.want)
		}
	}

	// /init sets the token: everything but /health then needs it.
	resp, _ = do("POST", base+"/init", strings.NewReader(`{"accessToken":"s3cret","envVars":{"FROM_INIT":"yes"},"sandboxID":"isb1"}`), nil)
	if resp.StatusCode != 204 {
		t.Fatalf("init = %d", resp.StatusCode)
	}
	if resp, _ := do("GET", base+"/health", nil, nil); resp.StatusCode != 204 {
		t.Fatalf("health needs no token: %d", resp.StatusCode)
	}
	if resp, _ := do("GET", base+"/files?path=/etc/hostname", nil, nil); resp.StatusCode != 401 {
		t.Fatalf("files without token = %d", resp.StatusCode)
	}
	if resp, _ := do("GET", base+"/files?path=/etc/hostname", nil, map[string]string{"X-Access-Token": "wrong"}); resp.StatusCode != 401 {
		t.Fatalf("files with a wrong token = %d", resp.StatusCode)
	}
	if resp, _ := do("POST", base+"/init", strings.NewReader(`{}`), nil); resp.StatusCode != 401 {
		t.Fatalf("init without token = %d", resp.StatusCode)
	}
	if _, err := d.proc.List(ctx, connect.NewRequest(&processpb.ListRequest{})); connect.CodeOf(err) != connect.CodeUnauthenticated {
		t.Fatalf("RPC without token = %v", err)
	}
	if _, err := startErr(ctx, d, sh("true")); connect.CodeOf(err) != connect.CodeUnauthenticated {
		t.Fatalf("stream RPC without token = %v", err)
	}
	d.header.Set("X-Access-Token", "s3cret")
	if r := d.run(ctx, sh("echo $FROM_INIT $E2B_SANDBOX_ID")); r.stdout != "yes isb1\n" {
		t.Fatalf("init env = %q", r.stdout)
	}
	// Presigned URLs: a valid signature works without the token; a wrong,
	// expired or other-operation signature does not.
	sign := func(path, op, user string, exp int64) string {
		raw := path + ":" + op + ":" + user + ":s3cret"
		if exp != 0 {
			raw += fmt.Sprintf(":%d", exp)
		}
		sum := sha256.Sum256([]byte(raw))
		return url.QueryEscape("v1_" + strings.TrimRight(base64.StdEncoding.EncodeToString(sum[:]), "="))
	}
	p := dir + "/deep/er/blob.bin"
	if resp, body := do("GET", base+"/files?path="+p+"&signature="+sign(p, "read", "", 0), nil, nil); resp.StatusCode != 200 || len(body) != len(blob) {
		t.Fatalf("signed read = %d", resp.StatusCode)
	}
	exp := time.Now().Add(time.Minute).Unix()
	if resp, _ := do("GET", fmt.Sprintf("%s/files?path=%s&signature=%s&signature_expiration=%d", base, p, sign(p, "read", "", exp), exp), nil, nil); resp.StatusCode != 200 {
		t.Fatalf("signed read with expiry = %d", resp.StatusCode)
	}
	old := time.Now().Add(-time.Minute).Unix()
	for _, bad := range []string{
		base + "/files?path=" + p + "&signature=" + sign(p, "write", "", 0),
		base + "/files?path=" + p + "&signature=v1_bogus",
		fmt.Sprintf("%s/files?path=%s&signature=%s&signature_expiration=%d", base, p, sign(p, "read", "", old), old),
	} {
		if resp, _ := do("GET", bad, nil, nil); resp.StatusCode != 401 {
			t.Errorf("bad signature %s = %d", bad, resp.StatusCode)
		}
	}
	up := dir + "/signed-upload.txt"
	if resp, body := do("POST", base+"/files?path="+up+"&signature="+sign(up, "write", "", 0), strings.NewReader("signed"), map[string]string{"Content-Type": "application/octet-stream"}); resp.StatusCode != 200 {
		t.Fatalf("signed write = %d %s", resp.StatusCode, body)
	}
}

func ownerOf(p string) uint32 {
	st, err := os.Stat(p)
	if err != nil {
		return 1 << 31
	}
	return st.Sys().(*syscall.Stat_t).Uid
}

// Config.LookupUser is how the daemon resolves its users: a command runs
// with the home it gives (HOME, and the working directory by default),
// and /init refuses a default user it does not know.
func TestLookupUserResolvesTheAccounts(t *testing.T) {
	home := t.TempDir()
	lookup := func(name string) (identity.User, error) {
		if name != "root" {
			return identity.User{}, fmt.Errorf("unknown user %q", name)
		}
		u, err := identity.Lookup(name)
		u.Home = home
		return u, err
	}
	d := newDaemonConfig(t, envd.Config{DefaultUser: "root", Keepalive: 200 * time.Millisecond, LookupUser: lookup})
	r := d.run(ctxFor(t), sh(`echo "$HOME"; pwd`))
	if want := home + "\n" + home + "\n"; r.stdout != want || r.end.GetExitCode() != 0 {
		t.Fatalf("a command's HOME and directory: %q (exit %d), want %q", r.stdout, r.end.GetExitCode(), want)
	}
	// "nobody" is in the host's /etc/passwd, but not in this lookup.
	resp, err := http.Post(d.srv.URL+"/init", "application/json", strings.NewReader(`{"defaultUser":"nobody"}`))
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusBadRequest {
		t.Fatalf("/init with a user the lookup does not know: %d, want 400", resp.StatusCode)
	}
	if got := d.envd.Defaults().User(); got != "root" {
		t.Fatalf("the default user after a refused /init: %q", got)
	}
}

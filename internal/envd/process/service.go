package process

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"sync"
	"syscall"
	"time"

	"connectrpc.com/connect"
	"github.com/creack/pty"
	"golang.org/x/sys/unix"

	"github.com/spore-run/spore/internal/envd/identity"
	"github.com/spore-run/spore/internal/envd/reaper"
	processpb "github.com/spore-run/spore/proto/gen/process"
	"github.com/spore-run/spore/proto/gen/process/processpbconnect"
)

// Service implements process.Process.
type Service struct {
	reaper    *reaper.Reaper
	defaults  *identity.Defaults
	keepalive time.Duration
	slow      time.Duration // see Config.SlowSubscriber
	// drain is how long output is still collected after the process
	// exited, for background children that keep its pipes open.
	drain time.Duration
	// drainMax bounds how long output still flowing after the process
	// exited is waited for (a background child may write for ever).
	drainMax time.Duration
	// after is time.After; tests replace it to drive the drain's clock.
	after func(time.Duration) <-chan time.Time
	log   *slog.Logger

	mu    sync.Mutex
	procs map[int]*proc

	warm   warmPool // see warm.go
	noWarm bool
}

var _ processpbconnect.ProcessHandler = (*Service)(nil)

// Config configures the service.
type Config struct {
	Keepalive time.Duration // sent on quiet output streams
	// SlowSubscriber is how long a process's output waits for a stream
	// whose buffer is full before that stream is ended with
	// resource_exhausted (default 10s). Meanwhile the process is slowed
	// down, not its output dropped.
	SlowSubscriber time.Duration
	// NoWarmShell starts every command as a new process (see warm.go).
	NoWarmShell bool
	Logger      *slog.Logger
}

// New returns the service.
func New(r *reaper.Reaper, d *identity.Defaults, cfg Config) *Service {
	if cfg.SlowSubscriber == 0 {
		cfg.SlowSubscriber = 10 * time.Second
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	return &Service{reaper: r, defaults: d, keepalive: cfg.Keepalive, slow: cfg.SlowSubscriber, drain: 200 * time.Millisecond, drainMax: 5 * time.Second, log: cfg.Logger, procs: map[int]*proc{}, noWarm: cfg.NoWarmShell}
}

// Close stops the warm shell (processes started for requests keep
// running).
func (s *Service) Close() { s.warm.close(5 * time.Second) }

const defaultPath = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"

func userOf(ctx context.Context) (identity.User, error) {
	u, ok := identity.FromContext(ctx)
	if !ok {
		return identity.User{}, connect.NewError(connect.CodeUnauthenticated, errors.New("no user resolved for the request"))
	}
	return u, nil
}

// Start implements the Start RPC.
func (s *Service) Start(ctx context.Context, req *connect.Request[processpb.StartRequest], stream *connect.ServerStream[processpb.StartResponse]) error {
	u, err := userOf(ctx)
	if err != nil {
		return err
	}
	p, sub, unsub, err := s.start(u, req.Msg)
	if err != nil {
		return err
	}
	defer unsub()
	start := &processpb.ProcessEvent{Event: &processpb.ProcessEvent_Start{Start: &processpb.ProcessEvent_StartEvent{Pid: uint32(p.pid)}}}
	if err := stream.Send(&processpb.StartResponse{Event: start}); err != nil {
		return err
	}
	return s.forward(ctx, p, sub, func(ev *processpb.ProcessEvent) error {
		return stream.Send(&processpb.StartResponse{Event: ev})
	})
}

// forward streams events until the end event (or the client leaves; the
// process keeps running), with keepalives on quiet streams. A stream that
// was cut off for being too slow ends with resource_exhausted, never with a
// clean end: the client must not mistake dropped output for complete output.
func (s *Service) forward(ctx context.Context, p *proc, sub *subscriber, send func(*processpb.ProcessEvent) error) error {
	tick := time.NewTicker(s.keepalive)
	defer tick.Stop()
	keep := &processpb.ProcessEvent{Event: &processpb.ProcessEvent_Keepalive{Keepalive: &processpb.ProcessEvent_KeepAlive{}}}
	tooSlow := func() error {
		s.log.Warn("output stream cut: subscriber too slow", "pid", p.pid, "waited", s.slow)
		return connect.NewError(connect.CodeResourceExhausted, errTooSlow)
	}
	for {
		select {
		case <-sub.cut:
			return tooSlow()
		default:
		}
		select {
		case ev := <-sub.ch:
			if err := send(ev); err != nil {
				return err
			}
		case <-sub.cut:
			return tooSlow()
		case <-p.done:
			// The pumps were done (or given up on) before the end was set,
			// so everything published for this stream is queued: send it,
			// then the end.
			for drained := false; !drained; {
				select {
				case ev := <-sub.ch:
					if err := send(ev); err != nil {
						return err
					}
				default:
					drained = true
				}
			}
			select {
			case <-sub.cut:
				return tooSlow()
			default:
			}
			return send(endEvent(p.end))
		case <-tick.C:
			if err := send(keep); err != nil {
				return err
			}
		case <-ctx.Done():
			return nil
		}
	}
}

func (s *Service) start(u identity.User, req *processpb.StartRequest) (*proc, *subscriber, func(), error) {
	cfg := req.GetProcess()
	if cfg == nil || cfg.GetCmd() == "" {
		return nil, nil, nil, connect.NewError(connect.CodeInvalidArgument, errors.New("process.cmd is required"))
	}
	if req.Tag != nil {
		if _, err := s.find(&processpb.ProcessSelector{Selector: &processpb.ProcessSelector_Tag{Tag: req.GetTag()}}); err == nil {
			return nil, nil, nil, connect.NewError(connect.CodeAlreadyExists, fmt.Errorf("a process with tag %q is running", req.GetTag()))
		}
	}
	env := s.environ(u, cfg, req.Pty != nil)
	cwd := s.defaults.Workdir()
	if cwd == "" {
		cwd = u.Home
	}
	if st, err := os.Stat(cwd); err != nil || !st.IsDir() {
		cwd = "/" // a user without a home (nobody) starts in /
	}
	if cfg.Cwd != nil && cfg.GetCwd() != "" {
		cwd = identity.Resolve(u, cfg.GetCwd())
	}
	if st, err := os.Stat(cwd); err != nil || !st.IsDir() {
		return nil, nil, nil, connect.NewError(connect.CodeInvalidArgument, fmt.Errorf("working directory %q does not exist", cwd))
	}
	path, err := lookPath(cfg.GetCmd(), envValue(env, "PATH"))
	if err != nil {
		return nil, nil, nil, connect.NewError(connect.CodeInvalidArgument, err)
	}
	attr := &os.ProcAttr{Dir: cwd, Env: env, Sys: &syscall.SysProcAttr{}}
	if u.UID != uint32(os.Getuid()) || u.GID != uint32(os.Getgid()) {
		attr.Sys.Credential = &syscall.Credential{Uid: u.UID, Gid: u.GID, Groups: u.Groups}
	}
	p := &proc{tag: req.GetTag(), config: cfg, slow: s.slow, subs: map[*subscriber]struct{}{}, done: make(chan struct{})}
	sub, unsub := p.subscribe()
	command, warm := "", !s.noWarm
	if warm {
		command, warm = warmCommand(req, path)
	}
	if warm {
		key := keyOf(path, cwd, env, attr.Sys.Credential)
		sh := s.warm.take(key)
		wa, sys := *attr, *attr.Sys // the warm shell's own copy
		wa.Sys = &sys
		// The next one is started once this command has ended: started
		// now it would take CPU from this command and the next request.
		p.refill = func() { s.warm.refill(s.reaper, key, wa) }
		if sh != nil {
			if err := sh.run(command); err == nil {
				p.pid = sh.pid
				s.mu.Lock()
				s.procs[p.pid] = p
				s.mu.Unlock()
				p.outputs.Add(2)
				go p.pump(sh.stdout, 1)
				go p.pump(sh.stderr, 2)
				go s.await(p, sh.exited)
				s.log.Debug("process started in a warm shell", "pid", p.pid, "user", u.Name, "tag", p.tag)
				return p, sub, unsub, nil
			}
			sh.stop() // it died: start the command as usual
		}
	}
	var parentEnds []*os.File // our ends, read by pumps
	var childEnds []*os.File  // closed once the child has them
	closeAll := func() {
		for _, f := range append(parentEnds, childEnds...) {
			f.Close()
		}
	}
	if req.Pty != nil {
		master, slave, err := pty.Open()
		if err != nil {
			unsub()
			return nil, nil, nil, connect.NewError(connect.CodeInternal, fmt.Errorf("open pty: %w", err))
		}
		master, err = nonBlocking(master)
		if err != nil {
			slave.Close()
			unsub()
			return nil, nil, nil, connect.NewError(connect.CodeInternal, fmt.Errorf("pty master: %w", err))
		}
		if sz := req.GetPty().GetSize(); sz != nil {
			setSize(master, sz.GetCols(), sz.GetRows())
		}
		attr.Files = []*os.File{slave, slave, slave}
		attr.Sys.Setsid, attr.Sys.Setctty, attr.Sys.Ctty = true, true, 0
		p.pty = master
		parentEnds = []*os.File{master}
		childEnds = []*os.File{slave}
	} else {
		var stdin *os.File
		if req.GetStdin() {
			r, w, err := os.Pipe()
			if err != nil {
				unsub()
				return nil, nil, nil, connect.NewError(connect.CodeInternal, err)
			}
			stdin, p.stdin = r, w
		} else {
			stdin, err = os.Open(os.DevNull)
			if err != nil {
				unsub()
				return nil, nil, nil, connect.NewError(connect.CodeInternal, err)
			}
		}
		or, ow, err := os.Pipe()
		if err != nil {
			unsub()
			return nil, nil, nil, connect.NewError(connect.CodeInternal, err)
		}
		er, ew, err := os.Pipe()
		if err != nil {
			unsub()
			return nil, nil, nil, connect.NewError(connect.CodeInternal, err)
		}
		attr.Files = []*os.File{stdin, ow, ew}
		attr.Sys.Setpgid = true
		parentEnds = []*os.File{or, er}
		childEnds = []*os.File{stdin, ow, ew}
	}
	argv := append([]string{cfg.GetCmd()}, cfg.GetArgs()...)
	pid, exited, err := s.reaper.Start(path, argv, attr)
	for _, f := range childEnds {
		f.Close()
	}
	if err != nil {
		closeAll()
		if p.stdin != nil {
			p.stdin.Close()
		}
		unsub()
		return nil, nil, nil, connect.NewError(connect.CodeInvalidArgument, fmt.Errorf("start %s: %w", cfg.GetCmd(), err))
	}
	p.pid = pid
	s.mu.Lock()
	s.procs[pid] = p
	s.mu.Unlock()
	if p.pty != nil {
		reader, err := dup(p.pty)
		if err != nil {
			s.log.Warn("pty: reading the master itself (no duplicate)", "err", err)
			reader = p.pty
		}
		p.outputs.Add(1)
		go p.pump(reader, 3)
	} else {
		p.outputs.Add(2)
		go p.pump(parentEnds[0], 1)
		go p.pump(parentEnds[1], 2)
	}
	go s.await(p, exited)
	s.log.Debug("process started", "pid", pid, "cmd", cfg.GetCmd(), "user", u.Name, "tag", p.tag)
	return p, sub, unsub, nil
}

// nonBlocking replaces a PTY master that pty.Open left in blocking mode
// (it calls File.Fd) with a non-blocking one served by Go's poller, so that
// closing it wakes a write blocked on a terminal nobody reads.
func nonBlocking(f *os.File) (*os.File, error) {
	defer f.Close()
	fd, err := syscall.Dup(int(f.Fd()))
	if err != nil {
		return nil, err
	}
	if err := syscall.SetNonblock(fd, true); err != nil {
		syscall.Close(fd)
		return nil, err
	}
	syscall.CloseOnExec(fd)
	return os.NewFile(uintptr(fd), f.Name()), nil
}

// dup gives the pump its own descriptor of the PTY master, so closing the
// master (on exit) and reading from it do not race. It goes through
// SyscallConn because File.Fd would make the shared file description
// blocking again.
func dup(f *os.File) (*os.File, error) {
	rc, err := f.SyscallConn()
	if err != nil {
		return nil, err
	}
	nfd := -1
	var dupErr error
	if err := rc.Control(func(fd uintptr) { nfd, dupErr = unix.FcntlInt(fd, unix.F_DUPFD_CLOEXEC, 0) }); err != nil {
		return nil, err
	}
	if dupErr != nil {
		return nil, dupErr
	}
	return os.NewFile(uintptr(nfd), f.Name()), nil
}

func (s *Service) await(p *proc, exited <-chan reaper.Exit) {
	e := <-exited
	if p.refill != nil {
		p.refill()
	}
	drained := make(chan struct{})
	go func() { p.outputs.Wait(); close(drained) }()
	// Output is waited for while it still flows: what the process wrote
	// before it exited is in its pipes, and a loaded host (or a slow
	// subscriber the pump waits for) may take longer than one drain
	// interval to pass it on. Only output that stops flowing for a whole
	// interval is given up on: background children hold the pipes open,
	// and the process has ended. (With one fixed interval the end was sent
	// before the last 64 KiB under load: a clean end over truncated
	// output.)
	// A background child that keeps writing would keep it flowing for
	// ever: drainMax bounds the wait.
	after := s.after
	if after == nil {
		after = time.After
	}
	limit := after(s.drainMax)
	for last := p.progress.Load(); ; {
		select {
		case <-drained:
		case <-limit:
		case <-after(s.drain):
			if now := p.progress.Load(); now != last || p.publishing.Load() > 0 {
				last = now
				continue
			}
		}
		break
	}
	end := &processpb.ProcessEvent_EndEvent{}
	if e.Err != nil {
		msg := e.Err.Error()
		end.ExitCode, end.Status, end.Error = -1, "unknown", &msg
	} else {
		end.ExitCode, end.Exited, end.Status = status(e.Status)
	}
	s.mu.Lock()
	delete(s.procs, p.pid)
	s.mu.Unlock()
	p.finish(end)
}

func (s *Service) environ(u identity.User, cfg *processpb.ProcessConfig, tty bool) []string {
	env := map[string]string{
		"PATH": defaultPath, "HOME": u.Home, "USER": u.Name, "LOGNAME": u.Name, "SHELL": "/bin/bash",
	}
	if tty {
		env["TERM"] = "xterm-256color"
	}
	if id := s.defaults.SandboxID(); id != "" {
		env["E2B_SANDBOX"] = "true"
		env["E2B_SANDBOX_ID"] = id
	}
	for k, v := range s.defaults.Env() {
		env[k] = v
	}
	for k, v := range cfg.GetEnvs() {
		env[k] = v
	}
	out := make([]string, 0, len(env))
	for k, v := range env {
		out = append(out, k+"="+v)
	}
	sort.Strings(out)
	return out
}

func envValue(env []string, key string) string {
	for _, e := range env {
		if v, ok := strings.CutPrefix(e, key+"="); ok {
			return v
		}
	}
	return ""
}

func lookPath(cmd, path string) (string, error) {
	if strings.Contains(cmd, "/") {
		if st, err := os.Stat(cmd); err != nil || st.IsDir() || st.Mode()&0o111 == 0 {
			return "", fmt.Errorf("%s: not an executable file", cmd)
		}
		return cmd, nil
	}
	for _, dir := range filepath.SplitList(path) {
		p := filepath.Join(dir, cmd)
		if st, err := os.Stat(p); err == nil && !st.IsDir() && st.Mode()&0o111 != 0 {
			return p, nil
		}
	}
	return "", fmt.Errorf("%s: command not found in PATH", cmd)
}

func (s *Service) find(sel *processpb.ProcessSelector) (*proc, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	switch v := sel.GetSelector().(type) {
	case *processpb.ProcessSelector_Pid:
		if p, ok := s.procs[int(v.Pid)]; ok {
			return p, nil
		}
		return nil, connect.NewError(connect.CodeNotFound, fmt.Errorf("process with pid %d not found", v.Pid))
	case *processpb.ProcessSelector_Tag:
		for _, p := range s.procs {
			if p.tag == v.Tag {
				return p, nil
			}
		}
		return nil, connect.NewError(connect.CodeNotFound, fmt.Errorf("process with tag %q not found", v.Tag))
	default:
		return nil, connect.NewError(connect.CodeInvalidArgument, errors.New("process selector needs a pid or a tag"))
	}
}

// Connect implements the Connect RPC: re-attach to a running process's
// output.
func (s *Service) Connect(ctx context.Context, req *connect.Request[processpb.ConnectRequest], stream *connect.ServerStream[processpb.ConnectResponse]) error {
	p, err := s.find(req.Msg.GetProcess())
	if err != nil {
		return err
	}
	sub, unsub := p.subscribe()
	defer unsub()
	start := &processpb.ProcessEvent{Event: &processpb.ProcessEvent_Start{Start: &processpb.ProcessEvent_StartEvent{Pid: uint32(p.pid)}}}
	if err := stream.Send(&processpb.ConnectResponse{Event: start}); err != nil {
		return err
	}
	return s.forward(ctx, p, sub, func(ev *processpb.ProcessEvent) error {
		return stream.Send(&processpb.ConnectResponse{Event: ev})
	})
}

// List implements the List RPC.
func (s *Service) List(ctx context.Context, _ *connect.Request[processpb.ListRequest]) (*connect.Response[processpb.ListResponse], error) {
	s.mu.Lock()
	out := &processpb.ListResponse{}
	for _, p := range s.procs {
		info := &processpb.ProcessInfo{Config: p.config, Pid: uint32(p.pid)}
		if p.tag != "" {
			t := p.tag
			info.Tag = &t
		}
		out.Processes = append(out.Processes, info)
	}
	s.mu.Unlock()
	sort.Slice(out.Processes, func(i, j int) bool { return out.Processes[i].Pid < out.Processes[j].Pid })
	return connect.NewResponse(out), nil
}

// SendInput implements the SendInput RPC.
func (s *Service) SendInput(ctx context.Context, req *connect.Request[processpb.SendInputRequest]) (*connect.Response[processpb.SendInputResponse], error) {
	p, err := s.find(req.Msg.GetProcess())
	if err != nil {
		return nil, err
	}
	if err := s.input(p, req.Msg.GetInput()); err != nil {
		return nil, err
	}
	return connect.NewResponse(&processpb.SendInputResponse{}), nil
}

func (s *Service) input(p *proc, in *processpb.ProcessInput) error {
	var err error
	switch v := in.GetInput().(type) {
	case *processpb.ProcessInput_Stdin:
		err = p.writeInput(v.Stdin, false)
	case *processpb.ProcessInput_Pty:
		err = p.writeInput(v.Pty, true)
	default:
		return connect.NewError(connect.CodeInvalidArgument, errors.New("input needs stdin or pty bytes"))
	}
	return inputErr(err)
}

func inputErr(err error) error {
	switch {
	case err == nil:
		return nil
	case errors.Is(err, errEnded):
		return connect.NewError(connect.CodeNotFound, err)
	case errors.Is(err, errNoStdin), errors.Is(err, errNoPTY), errors.Is(err, errStdinGone):
		return connect.NewError(connect.CodeFailedPrecondition, err)
	default:
		return connect.NewError(connect.CodeInternal, err)
	}
}

// StreamInput implements the StreamInput RPC (client stream).
func (s *Service) StreamInput(ctx context.Context, stream *connect.ClientStream[processpb.StreamInputRequest]) (*connect.Response[processpb.StreamInputResponse], error) {
	var p *proc
	for stream.Receive() {
		switch v := stream.Msg().GetEvent().(type) {
		case *processpb.StreamInputRequest_Start:
			found, err := s.find(v.Start.GetProcess())
			if err != nil {
				return nil, err
			}
			p = found
		case *processpb.StreamInputRequest_Data:
			if p == nil {
				return nil, connect.NewError(connect.CodeFailedPrecondition, errors.New("send a start event naming the process first"))
			}
			if err := s.input(p, v.Data.GetInput()); err != nil {
				return nil, err
			}
		}
	}
	if err := stream.Err(); err != nil {
		return nil, err
	}
	return connect.NewResponse(&processpb.StreamInputResponse{}), nil
}

// SendSignal implements the SendSignal RPC.
func (s *Service) SendSignal(ctx context.Context, req *connect.Request[processpb.SendSignalRequest]) (*connect.Response[processpb.SendSignalResponse], error) {
	p, err := s.find(req.Msg.GetProcess())
	if err != nil {
		return nil, err
	}
	var sig syscall.Signal
	switch req.Msg.GetSignal() {
	case processpb.Signal_SIGNAL_SIGKILL:
		sig = syscall.SIGKILL
	case processpb.Signal_SIGNAL_SIGTERM:
		sig = syscall.SIGTERM
	default:
		return nil, connect.NewError(connect.CodeInvalidArgument, fmt.Errorf("unsupported signal %v", req.Msg.GetSignal()))
	}
	if err := p.signal(sig); err != nil {
		return nil, inputErr(err)
	}
	return connect.NewResponse(&processpb.SendSignalResponse{}), nil
}

// CloseStdin implements the CloseStdin RPC.
func (s *Service) CloseStdin(ctx context.Context, req *connect.Request[processpb.CloseStdinRequest]) (*connect.Response[processpb.CloseStdinResponse], error) {
	p, err := s.find(req.Msg.GetProcess())
	if err != nil {
		return nil, err
	}
	if err := p.closeStdin(); err != nil {
		return nil, inputErr(err)
	}
	return connect.NewResponse(&processpb.CloseStdinResponse{}), nil
}

// Update implements the Update RPC (PTY resize).
func (s *Service) Update(ctx context.Context, req *connect.Request[processpb.UpdateRequest]) (*connect.Response[processpb.UpdateResponse], error) {
	p, err := s.find(req.Msg.GetProcess())
	if err != nil {
		return nil, err
	}
	if sz := req.Msg.GetPty().GetSize(); sz != nil {
		if err := p.resize(sz.GetCols(), sz.GetRows()); err != nil {
			return nil, inputErr(err)
		}
	}
	return connect.NewResponse(&processpb.UpdateResponse{}), nil
}

// SignalAll sends sig to every running process group (envd forwards the
// signals it receives as init).
func (s *Service) SignalAll(sig syscall.Signal) {
	s.mu.Lock()
	defer s.mu.Unlock()
	for pid := range s.procs {
		syscall.Kill(-pid, sig)
	}
}

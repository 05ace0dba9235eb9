package process

import (
	"io"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/spore-run/spore/internal/envd/reaper"
	processpb "github.com/spore-run/spore/proto/gen/process"
)

// Warm shells. The stock SDKs run every command as `/bin/bash -l -c CMD`:
// inside gVisor, starting that process (fork, exec, the dynamic linker,
// the login profile) is most of a short command's time. The service keeps
// one such login shell started ahead, with the environment, user and
// working directory the last command like it had; it has read its profile
// and waits for its command on descriptor 3 (warmScript). A command of the
// same shape is handed to it instead of starting a new process, and the
// next warm shell is started in the background.
//
// What differs from a fresh `bash -l -c CMD`: the shell ran its profile
// before the command arrived (so a profile edited in between applies from
// the next command on), a syntax error is reported by `eval` rather than
// `-c`, $REPLY holds the command when it starts, and `ps` shows the
// waiting script as the shell's arguments (the process list of the API
// shows the command as asked). The PID, process group, environment,
// working directory, user, exit status, output and signals are those of a
// fresh shell.

// warmScript is the warm shell's -c script: read the command's length in
// bytes, then the command, from descriptor 3, close it, run the command in
// this shell. `read -N` reads a pipe in chunks, where `read -d` with an
// empty delimiter would make a read call per byte (a 100 KB command:
// 100,000 calls, each a trip through the sandbox's kernel). It stops at N characters or at the end of
// the pipe, which comes right after the command: a multi-byte character
// counts once, and the whole command is read either way.
const warmScript = `read -r <&3; read -r -N "$REPLY" <&3; exec 3<&-; eval "$REPLY"`

// warmKey is the shape of the commands a warm shell can run.
type warmKey struct {
	path     string // the shell's binary
	uid, gid uint32
	groups   string
	cwd      string
	env      string // NUL-joined, sorted
}

// warmShell is a started login shell waiting for its command.
type warmShell struct {
	key            warmKey
	pid            int
	exited         <-chan reaper.Exit
	cmd            *os.File // write end of the shell's descriptor 3
	stdout, stderr *os.File // read ends of its output
}

// warmPool holds at most one warm shell.
type warmPool struct {
	mu       sync.Mutex
	shell    *warmShell
	starting *warmStart // the shell being started, if one is
	closed   bool
	wg       sync.WaitGroup
}

// warmStart is a warm shell being started.
type warmStart struct {
	key  warmKey
	done chan struct{}
}

// warmCommand returns the command of a request a warm shell can serve
// (`bash -l -c CMD`, no terminal, no stdin kept open) and whether it can.
func warmCommand(req *processpb.StartRequest, path string) (string, bool) {
	cfg := req.GetProcess()
	args := cfg.GetArgs()
	if req.Pty != nil || req.GetStdin() || len(args) != 3 || args[0] != "-l" || args[1] != "-c" {
		return "", false
	}
	if !isBash(path) {
		return "", false
	}
	if strings.ContainsRune(args[2], 0) {
		return "", false
	}
	return args[2], true
}

// isBash says whether path is bash itself: an executable (ELF) file named
// bash, also once symbolic links are followed. In an image where bash is
// busybox's (a link to busybox) or a wrapper script (`exec /bin/sh "$@"`,
// a common shim in minimal images), the warm script's `read -N` may not
// exist, so commands start as usual there. Only the file's first four
// bytes are read: a whole copy of bash in the daemon's memory would land
// in every snapshot. The answer is kept per path for the file it named
// then (device, inode, size, change time), so a command's start costs one
// stat, and a file replaced since is looked at again.
func isBash(path string) bool {
	if filepath.Base(path) != "bash" {
		return false
	}
	fi, err := os.Stat(path)
	if err != nil {
		return false
	}
	st, ok := fi.Sys().(*syscall.Stat_t)
	if !ok {
		return lookIsBash(path)
	}
	id := fileID{st.Dev, st.Ino, st.Size, st.Ctim}
	if seen, ok := bashSeen.Load(path); ok && seen.(bashAnswer).id == id {
		return seen.(bashAnswer).bash
	}
	b := lookIsBash(path)
	bashSeen.Store(path, bashAnswer{id, b})
	return b
}

type fileID struct {
	dev, ino uint64
	size     int64
	ctime    syscall.Timespec
}

type bashAnswer struct {
	id   fileID
	bash bool
}

// bashSeen holds isBash's answers: path → bashAnswer.
var bashSeen sync.Map

// lookIsBash is isBash without the memory.
func lookIsBash(path string) bool {
	real, err := filepath.EvalSymlinks(path)
	if err != nil || filepath.Base(real) != "bash" {
		return false
	}
	f, err := os.Open(real)
	if err != nil {
		return false
	}
	defer f.Close()
	var magic [4]byte
	_, err = io.ReadFull(f, magic[:])
	return err == nil && string(magic[:]) == "\x7fELF"
}

func keyOf(path, cwd string, env []string, cred *syscall.Credential) warmKey {
	k := warmKey{path: path, cwd: cwd, env: strings.Join(env, "\x00")}
	if cred != nil {
		k.uid, k.gid = cred.Uid, cred.Gid
		for _, g := range cred.Groups {
			k.groups += strconv.FormatUint(uint64(g), 10) + ","
		}
	} else {
		k.uid, k.gid = uint32(os.Getuid()), uint32(os.Getgid())
	}
	return k
}

// take returns the warm shell for key, if there is one still alive
// (waiting for one being started: its exec is a few ms from done, a new
// process would be further). A shell of another shape is stopped.
func (w *warmPool) take(key warmKey) *warmShell {
	w.mu.Lock()
	if st := w.starting; st != nil && st.key == key {
		w.mu.Unlock()
		<-st.done
		w.mu.Lock()
	}
	sh := w.shell
	w.shell = nil
	w.mu.Unlock()
	if sh == nil {
		return nil
	}
	if sh.key != key {
		sh.stop()
		return nil
	}
	select {
	case <-sh.exited: // it died waiting (killed from inside, say)
		sh.close()
		return nil
	default:
	}
	return sh
}

// refill starts a warm shell for key in the background, unless one is
// there or being started.
func (w *warmPool) refill(r *reaper.Reaper, key warmKey, attr os.ProcAttr) {
	w.mu.Lock()
	if w.closed || w.starting != nil || (w.shell != nil && w.shell.key == key) {
		w.mu.Unlock()
		return
	}
	st := &warmStart{key: key, done: make(chan struct{})}
	w.starting = st
	w.wg.Add(1)
	w.mu.Unlock()
	go func() {
		defer w.wg.Done()
		sh, err := startWarm(r, key, attr)
		w.mu.Lock()
		w.starting = nil
		old := w.shell
		if err == nil {
			w.shell = sh
		}
		w.mu.Unlock()
		close(st.done)
		if old != nil && err == nil {
			old.stop()
		}
	}()
}

// close stops the warm shell, waiting for one being started and, up to
// wait, for its exit; then it is killed.
func (w *warmPool) close(wait time.Duration) {
	w.mu.Lock()
	w.closed = true
	w.mu.Unlock()
	w.wg.Wait()
	w.mu.Lock()
	sh := w.shell
	w.shell = nil
	w.mu.Unlock()
	if sh == nil {
		return
	}
	select {
	case <-sh.stop():
	case <-time.After(wait):
		syscall.Kill(-sh.pid, syscall.SIGKILL)
	}
}

func startWarm(r *reaper.Reaper, key warmKey, attr os.ProcAttr) (*warmShell, error) {
	stdin, err := os.Open(os.DevNull)
	if err != nil {
		return nil, err
	}
	var files []*os.File // ours, closed on failure
	var theirs = []*os.File{stdin}
	fail := func(err error) (*warmShell, error) {
		for _, f := range append(files, theirs...) {
			f.Close()
		}
		return nil, err
	}
	cr, cw, err := os.Pipe()
	if err != nil {
		return fail(err)
	}
	files, theirs = append(files, cw), append(theirs, cr)
	or, ow, err := os.Pipe()
	if err != nil {
		return fail(err)
	}
	files, theirs = append(files, or), append(theirs, ow)
	er, ew, err := os.Pipe()
	if err != nil {
		return fail(err)
	}
	files, theirs = append(files, er), append(theirs, ew)
	attr.Files = []*os.File{stdin, ow, ew, cr}
	attr.Sys.Setpgid = true
	pid, exited, err := r.Start(key.path, []string{key.path, "-l", "-c", warmScript}, &attr)
	if err != nil {
		return fail(err)
	}
	for _, f := range theirs {
		f.Close()
	}
	return &warmShell{key: key, pid: pid, exited: exited, cmd: cw, stdout: or, stderr: er}, nil
}

// run hands the shell its command.
func (sh *warmShell) run(command string) error {
	_, err := sh.cmd.Write([]byte(strconv.Itoa(len(command)) + "\n" + command))
	if cerr := sh.cmd.Close(); err == nil {
		err = cerr
	}
	return err
}

// stop ends an unused warm shell gently: it reads end-of-file instead of
// a command and exits once its profile is done (killing it mid-profile
// could leave what the profile does half done, a lock file say). Its
// output is read and dropped meanwhile; done is closed once it exited.
func (sh *warmShell) stop() (done <-chan struct{}) {
	sh.cmd.Close()
	d := make(chan struct{})
	var wg sync.WaitGroup
	for _, f := range []*os.File{sh.stdout, sh.stderr} {
		wg.Add(1)
		go func() { defer wg.Done(); io.Copy(io.Discard, f) }()
	}
	go func() {
		<-sh.exited
		drained := make(chan struct{})
		go func() { wg.Wait(); close(drained) }()
		select {
		case <-drained:
		case <-time.After(time.Second): // its background children hold the output
		}
		sh.stdout.Close()
		sh.stderr.Close()
		close(d)
	}()
	return d
}

func (sh *warmShell) close() {
	for _, f := range []*os.File{sh.cmd, sh.stdout, sh.stderr} {
		f.Close()
	}
}

// WarmShell returns the PID of the login shell waiting for the next
// command, if one is.
func (s *Service) WarmShell() (int, bool) {
	s.warm.mu.Lock()
	defer s.warm.mu.Unlock()
	if s.warm.shell == nil {
		return 0, false
	}
	return s.warm.shell.pid, true
}

package testenv

import (
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"sort"
	"strconv"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"
)

// PostgreSQL for tests: one throwaway cluster per test binary, a fresh
// database per Postgres call.
//
// Usage: the package's TestMain hands over to Main, which stops the cluster
// (by the PID it started) and removes its files after the tests:
//
//	func TestMain(m *testing.M) { testenv.Main(m) }
//
//	dsn := testenv.Postgres(t) // postgres://postgres@127.0.0.1:PORT/t_N
//
// Postgres refuses to run without Main, so no cluster outlives its test
// binary in a normal run; if the binary is killed instead, the server gets
// SIGKILL too (parent-death signal) and only its temp directory is left.
// The cluster is Debian's PostgreSQL (`make setup` installs it): initdb with
// trust auth and no fsync, the server on a free loopback port and a socket
// in its own directory, so it never touches a system cluster. It runs in
// the fast tier too: it is a real dependency but starts in ~2.5 s. A
// missing PostgreSQL fails the test, it never skips.

// PGBinEnv overrides where the PostgreSQL programs are (initdb, postgres,
// createdb); by default the newest /usr/lib/postgresql/*/bin.
const PGBinEnv = "SPORE_PG_BIN"

var pg struct {
	mainRan atomic.Bool
	once    sync.Once
	err     error
	dir     string
	port    int
	bin     string
	cmd     *exec.Cmd
	exited  chan struct{}
	n       atomic.Int64
}

// Main runs the package's tests, then stops the PostgreSQL cluster the
// tests started (if any) and exits with the tests' status.
func Main(m *testing.M) {
	pg.mainRan.Store(true)
	code := m.Run()
	if err := stopPostgres(); err != nil {
		fmt.Fprintf(os.Stderr, "testenv: stopping PostgreSQL: %v\n", err)
		if code == 0 {
			code = 1
		}
	}
	os.Exit(code)
}

// Postgres returns the DSN of a new, empty database on the test binary's
// cluster, starting the cluster on first use.
func Postgres(t testing.TB) string {
	t.Helper()
	if !pg.mainRan.Load() {
		t.Fatal("testenv.Postgres needs the package's TestMain to call testenv.Main(m) (it stops the cluster)")
	}
	pg.once.Do(func() { pg.err = startPostgres() })
	if pg.err != nil {
		t.Fatalf("PostgreSQL for tests: %v", pg.err)
	}
	name := fmt.Sprintf("t_%d", pg.n.Add(1))
	out, err := pgCommand(filepath.Join(pg.bin, "createdb"), "-h", pg.dir, "-p", strconv.Itoa(pg.port), "-U", "postgres", name).CombinedOutput()
	if err != nil {
		t.Fatalf("createdb %s: %v: %s", name, err, out)
	}
	return fmt.Sprintf("postgres://postgres@127.0.0.1:%d/%s?sslmode=disable", pg.port, name)
}

func pgBin() (string, error) {
	if d := os.Getenv(PGBinEnv); d != "" {
		return d, nil
	}
	dirs, _ := filepath.Glob("/usr/lib/postgresql/*/bin")
	sort.Slice(dirs, func(i, j int) bool { return pgMajor(dirs[i]) < pgMajor(dirs[j]) })
	for i := len(dirs) - 1; i >= 0; i-- {
		if _, err := os.Stat(filepath.Join(dirs[i], "postgres")); err == nil {
			return dirs[i], nil
		}
	}
	return "", errors.New("no PostgreSQL server in /usr/lib/postgresql/*/bin: install the Debian package postgresql (`make setup` does), or set " + PGBinEnv)
}

func pgMajor(binDir string) int {
	n, _ := strconv.Atoi(filepath.Base(filepath.Dir(binDir)))
	return n
}

// pgCredential is who runs the server: PostgreSQL refuses root, so as
// root it is the postgres user the Debian package creates.
func pgCredential() (*syscall.Credential, error) {
	if os.Geteuid() != 0 {
		return nil, nil
	}
	u, err := user.Lookup("postgres")
	if err != nil {
		return nil, fmt.Errorf("running as root needs the postgres user (from the Debian package postgresql): %w", err)
	}
	uid, _ := strconv.Atoi(u.Uid)
	gid, _ := strconv.Atoi(u.Gid)
	return &syscall.Credential{Uid: uint32(uid), Gid: uint32(gid)}, nil
}

func pgCommand(name string, args ...string) *exec.Cmd {
	cmd := exec.Command(name, args...)
	if cred, _ := pgCredential(); cred != nil {
		cmd.SysProcAttr = &syscall.SysProcAttr{Credential: cred}
	}
	cmd.Env = append(os.Environ(), "LC_ALL=C")
	return cmd
}

func freePort() (int, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, err
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port, nil
}

func startPostgres() (err error) {
	if pg.bin, err = pgBin(); err != nil {
		return err
	}
	cred, err := pgCredential()
	if err != nil {
		return err
	}
	if pg.dir, err = os.MkdirTemp("", "spore-pg-"); err != nil {
		return err
	}
	defer func() {
		if err != nil {
			os.RemoveAll(pg.dir)
		}
	}()
	if cred != nil {
		if err := os.Chown(pg.dir, int(cred.Uid), int(cred.Gid)); err != nil {
			return err
		}
	}
	data := filepath.Join(pg.dir, "data")
	if out, err := pgCommand(filepath.Join(pg.bin, "initdb"), "-D", data, "-U", "postgres", "--auth=trust",
		"-E", "UTF8", "--locale=C", "--no-sync").CombinedOutput(); err != nil {
		return fmt.Errorf("initdb: %v: %s", err, out)
	}
	if pg.port, err = freePort(); err != nil {
		return err
	}
	logPath := filepath.Join(pg.dir, "log")
	logf, err := os.Create(logPath)
	if err != nil {
		return err
	}
	defer logf.Close()
	// The server is our child (not daemonized by pg_ctl): we hold its PID,
	// and the parent-death signal takes it down with a killed test binary.
	cmd := pgCommand(filepath.Join(pg.bin, "postgres"), "-D", data, "-p", strconv.Itoa(pg.port), "-k", pg.dir,
		"-c", "listen_addresses=127.0.0.1", "-c", "fsync=off", "-c", "synchronous_commit=off",
		"-c", "full_page_writes=off", "-c", "max_connections=200")
	if cmd.SysProcAttr == nil {
		cmd.SysProcAttr = &syscall.SysProcAttr{}
	}
	cmd.SysProcAttr.Pdeathsig = syscall.SIGKILL
	cmd.Stdout, cmd.Stderr = logf, logf
	if err := cmd.Start(); err != nil {
		return fmt.Errorf("start postgres: %w", err)
	}
	pg.cmd, pg.exited = cmd, make(chan struct{})
	go func() { cmd.Wait(); close(pg.exited) }()
	deadline := time.Now().Add(60 * time.Second)
	for {
		out, err := pgCommand(filepath.Join(pg.bin, "pg_isready"), "-q", "-h", "127.0.0.1", "-p", strconv.Itoa(pg.port), "-U", "postgres").CombinedOutput()
		if err == nil {
			return nil
		}
		select {
		case <-pg.exited:
			log, _ := os.ReadFile(logPath)
			return fmt.Errorf("postgres exited at start: %s", log)
		default:
		}
		if time.Now().After(deadline) {
			stopPostgres()
			return fmt.Errorf("postgres not ready after 60 s: %v %s", err, out)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// stopPostgres stops the server it started (fast shutdown, then SIGKILL)
// and removes the cluster's files.
func stopPostgres() error {
	if pg.cmd == nil {
		return nil
	}
	cmd := pg.cmd
	pg.cmd = nil
	cmd.Process.Signal(syscall.SIGINT) // fast shutdown: disconnects clients
	var err error
	select {
	case <-pg.exited:
	case <-time.After(30 * time.Second):
		cmd.Process.Kill()
		<-pg.exited
		err = errors.New("postgres did not stop within 30 s of SIGINT; killed")
	}
	if rmErr := os.RemoveAll(pg.dir); rmErr != nil && err == nil {
		err = rmErr
	}
	return err
}

package testenv

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/spore-run/spore/internal/pgcluster"
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
// The cluster is Debian's PostgreSQL (`make setup` installs it), made by
// internal/pgcluster: initdb with trust auth and no fsync, the server on a
// free loopback port and a socket in its own directory, so it never touches
// a system cluster. It runs in the fast tier too: it is a real dependency
// but starts in ~2.5 s. A missing PostgreSQL fails the test, it never skips.

// PGBinEnv overrides where the PostgreSQL programs are (initdb, postgres,
// createdb); by default the newest /usr/lib/postgresql/*/bin.
const PGBinEnv = pgcluster.BinEnv

var pg struct {
	mainRan atomic.Bool
	once    sync.Once
	err     error
	c       pgcluster.Cluster
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
	if err := pg.c.CreateDB(context.Background(), name); err != nil {
		t.Fatal(err)
	}
	return pg.c.DSN(name)
}

func startPostgres() (err error) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	if pg.c.Bin, err = pgcluster.Bin(); err != nil {
		return err
	}
	if pg.c.Dir, err = os.MkdirTemp("", "spore-pg-"); err != nil {
		return err
	}
	defer func() {
		if err != nil {
			os.RemoveAll(pg.c.Dir)
		}
	}()
	if err := pg.c.Init(ctx); err != nil {
		return err
	}
	if pg.c.Port, err = pgcluster.FreePort(); err != nil {
		return err
	}
	logf, err := os.Create(pg.c.LogPath())
	if err != nil {
		return err
	}
	defer logf.Close()
	// The server is our child (not daemonized by pg_ctl): we hold its PID,
	// and the parent-death signal takes it down with a killed test binary.
	cmd := pg.c.ServerCmd()
	cmd.SysProcAttr.Pdeathsig = syscall.SIGKILL
	cmd.Stdout, cmd.Stderr = logf, logf
	if err := cmd.Start(); err != nil {
		return fmt.Errorf("start postgres: %w", err)
	}
	pg.cmd, pg.exited = cmd, make(chan struct{})
	go func() { cmd.Wait(); close(pg.exited) }()
	if err := pg.c.WaitReady(ctx, pg.exited); err != nil {
		stopPostgres()
		return err
	}
	return nil
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
	if rmErr := os.RemoveAll(pg.c.Dir); rmErr != nil && err == nil {
		err = rmErr
	}
	return err
}

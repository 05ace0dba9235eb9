// Package pgcluster makes throwaway PostgreSQL clusters from Debian's
// binaries: initdb into a directory of its own, the server on a loopback
// port with its socket in that directory, so a cluster never touches a
// system one (/etc/postgresql, port 5432). The test harness
// (internal/testenv) and the one-machine fleet (internal/fleet) both use
// it; each supervises the server process its own way (a test binary's
// child that dies with it; a detached daemon recorded by PID).
package pgcluster

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"net"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"sort"
	"strconv"
	"syscall"
	"time"
)

// BinEnv overrides where the PostgreSQL programs are (initdb, postgres,
// createdb, pg_isready); by default the newest /usr/lib/postgresql/*/bin.
const BinEnv = "SPORE_PG_BIN"

// Cluster is one cluster: its files under Dir (data/, the socket, log),
// its server on 127.0.0.1:Port.
type Cluster struct {
	Bin  string // directory of the PostgreSQL programs
	Dir  string
	Port int
}

// Bin finds the PostgreSQL programs: $SPORE_PG_BIN, else the newest
// /usr/lib/postgresql/*/bin holding a server.
func Bin() (string, error) {
	if d := os.Getenv(BinEnv); d != "" {
		return d, nil
	}
	dirs, _ := filepath.Glob("/usr/lib/postgresql/*/bin")
	sort.Slice(dirs, func(i, j int) bool { return major(dirs[i]) < major(dirs[j]) })
	for i := len(dirs) - 1; i >= 0; i-- {
		if _, err := os.Stat(filepath.Join(dirs[i], "postgres")); err == nil {
			return dirs[i], nil
		}
	}
	return "", errors.New("no PostgreSQL server in /usr/lib/postgresql/*/bin: install the Debian package postgresql (`make setup` does), or set " + BinEnv)
}

func major(binDir string) int {
	n, _ := strconv.Atoi(filepath.Base(filepath.Dir(binDir)))
	return n
}

// Credential is who runs the programs: PostgreSQL refuses root, so as
// root it is the postgres user the Debian package creates (nil: ourselves).
func Credential() (*syscall.Credential, error) {
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

// Command is a PostgreSQL program run as Credential, in the C locale.
func Command(ctx context.Context, path string, args ...string) *exec.Cmd {
	cmd := exec.CommandContext(ctx, path, args...)
	if cred, _ := Credential(); cred != nil {
		cmd.SysProcAttr = &syscall.SysProcAttr{Credential: cred}
	}
	cmd.Env = append(os.Environ(), "LC_ALL=C")
	return cmd
}

// FreePort is a loopback TCP port nobody listens on now, for a server
// started next. It is picked below the kernel's ephemeral range (32768
// and up), so no outgoing connection takes it before the server binds it.
func FreePort() (int, error) {
	for range 200 {
		p := 20000 + rand.IntN(12000)
		l, err := net.Listen("tcp", "127.0.0.1:"+strconv.Itoa(p))
		if err == nil {
			l.Close()
			return p, nil
		}
	}
	return 0, errors.New("no free port in 20000-32000")
}

// Init creates c.Dir (owned by the user the server runs as) and an empty
// cluster in c.Dir/data: trust authentication (the server listens on
// loopback and a socket in c.Dir only), UTF8, the C locale, no fsync.
// The directories above c.Dir must let that user through.
func (c Cluster) Init(ctx context.Context) error {
	cred, err := Credential()
	if err != nil {
		return err
	}
	if err := os.MkdirAll(c.Dir, 0o700); err != nil {
		return err
	}
	if cred != nil {
		if err := os.Chown(c.Dir, int(cred.Uid), int(cred.Gid)); err != nil {
			return err
		}
	}
	out, err := Command(ctx, filepath.Join(c.Bin, "initdb"), "-D", c.DataDir(), "-U", "postgres", "--auth=trust",
		"-E", "UTF8", "--locale=C", "--no-sync").CombinedOutput()
	if err != nil {
		return fmt.Errorf("initdb in %s: %v: %s (the postgres user must be able to reach the directory)", c.DataDir(), err, out)
	}
	return nil
}

// DataDir is the cluster's data directory.
func (c Cluster) DataDir() string { return filepath.Join(c.Dir, "data") }

// LogPath is where callers send the server's output.
func (c Cluster) LogPath() string { return filepath.Join(c.Dir, "log") }

// ServerCmd is the server process, not started: the caller sets how it is
// supervised (its output, a parent-death signal, a session of its own).
// Durability is off (a throwaway cluster): fsync, synchronous commit and
// full-page writes; only 127.0.0.1 and the socket in c.Dir are served.
func (c Cluster) ServerCmd() *exec.Cmd {
	cmd := Command(context.Background(), filepath.Join(c.Bin, "postgres"), "-D", c.DataDir(), "-p", strconv.Itoa(c.Port), "-k", c.Dir,
		"-c", "listen_addresses=127.0.0.1", "-c", "fsync=off", "-c", "synchronous_commit=off",
		"-c", "full_page_writes=off", "-c", "max_connections=200")
	if cmd.SysProcAttr == nil {
		cmd.SysProcAttr = &syscall.SysProcAttr{}
	}
	return cmd
}

// WaitReady waits until the server accepts connections, fails when exited
// closes first (the server died: its log says why) or ctx ends.
func (c Cluster) WaitReady(ctx context.Context, exited <-chan struct{}) error {
	for {
		out, err := Command(ctx, filepath.Join(c.Bin, "pg_isready"), "-q", "-h", "127.0.0.1", "-p", strconv.Itoa(c.Port), "-U", "postgres").CombinedOutput()
		if err == nil {
			return nil
		}
		select {
		case <-exited:
			log, _ := os.ReadFile(c.LogPath())
			return fmt.Errorf("postgres exited at start: %s", log)
		case <-ctx.Done():
			return fmt.Errorf("postgres not ready: %w (last: %v %s)", ctx.Err(), err, out)
		case <-time.After(20 * time.Millisecond):
		}
	}
}

// CreateDB creates an empty database.
func (c Cluster) CreateDB(ctx context.Context, name string) error {
	out, err := Command(ctx, filepath.Join(c.Bin, "createdb"), "-h", c.Dir, "-p", strconv.Itoa(c.Port), "-U", "postgres", name).CombinedOutput()
	if err != nil {
		return fmt.Errorf("createdb %s: %v: %s", name, err, out)
	}
	return nil
}

// DSN is the URL of database db on the cluster.
func (c Cluster) DSN(db string) string {
	return fmt.Sprintf("postgres://postgres@127.0.0.1:%d/%s?sslmode=disable", c.Port, db)
}

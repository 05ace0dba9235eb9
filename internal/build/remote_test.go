package build

import (
	"context"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/spore-run/spore/internal/envd"
	"github.com/spore-run/spore/internal/envd/identity"
)

// remoteOnEnvd is a Remote on a real daemon served in process (as root,
// like envd's own tests; the proxy's sandbox headers are ignored there).
func remoteOnEnvd(t *testing.T) *Remote {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Fatal("this test runs a real envd, which runs as root")
	}
	home := t.TempDir() // no login shell here, but no host dotfiles either
	s := envd.New(envd.Config{DefaultUser: "root", NoWarmShell: true, LookupUser: func(name string) (identity.User, error) {
		u, err := identity.Lookup(name)
		u.Home = home
		return u, err
	}})
	t.Cleanup(s.Processes().Close)
	srv := httptest.NewServer(s)
	t.Cleanup(srv.Close)
	return &Remote{HTTP: srv.Client(), Base: srv.URL, SID: "sb-test"}
}

// Background reports how a start command ended while it is watched: a
// program the image lacks is exit 127 with the shell's line, which
// finalize turns into a failed build. Ending the watch leaves the process
// running.
func TestRemoteBackgroundReportsTheExit(t *testing.T) {
	r := remoteOnEnvd(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()

	exited, err := r.Background(ctx, shell("spore-no-such-program -m http.server 8000"), "")
	if err != nil {
		t.Fatal(err)
	}
	select {
	case ex := <-exited:
		var out output
		for _, l := range ex.Tail {
			out.add(l)
		}
		if why := cannotRun(ex.Code, out); ex.Code != 127 || !strings.Contains(why, "spore-no-such-program: command not found") {
			t.Fatalf("exit %+v: cannot run %q", ex, why)
		}
	case <-ctx.Done():
		t.Fatal("no exit reported for a start command that cannot run")
	}

	pidFile := filepath.Join(t.TempDir(), "pid")
	wctx, stop := context.WithCancel(ctx)
	exited, err = r.Background(wctx, shell("echo $$ > "+pidFile+"; exec sleep 60"), "")
	if err != nil {
		t.Fatal(err)
	}
	alive := func() int {
		code, err := r.Run(ctx, shell(`kill -0 "$(cat `+pidFile+`)"`), "", func(string) {})
		if err != nil {
			t.Fatal(err)
		}
		return code
	}
	for alive() != 0 { // until it wrote its PID
		time.Sleep(20 * time.Millisecond)
	}
	stop()
	select {
	case ex := <-exited:
		t.Fatalf("a running process reported an exit: %+v", ex)
	case <-time.After(300 * time.Millisecond):
	}
	if alive() != 0 {
		t.Fatal("ending the watch ended the process")
	}
	if code, err := r.Run(ctx, shell(`kill "$(cat `+pidFile+`)"`), "", func(string) {}); err != nil || code != 0 {
		t.Fatalf("kill the sleep: exit %d, %v", code, err)
	}
}

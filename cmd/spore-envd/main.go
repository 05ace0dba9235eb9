// Command spore-envd is the daemon inside every Spore sandbox, started as
// the sandbox's init. It serves the E2B envd protocol on port 49983 and the
// code interpreter on port 49999, reaps zombies and forwards signals.
// Built static (CGO_ENABLED=0); imports nothing host-side.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"os"
	"os/signal"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/spore-run/spore/internal/envd"
	"github.com/spore-run/spore/internal/envd/interp"
	"github.com/spore-run/spore/internal/envd/oomwatch"
	"github.com/spore-run/spore/internal/envd/reaper"
)

func main() {
	var (
		addr     = flag.String("addr", fmt.Sprintf(":%d", envd.Port), "envd listen address")
		codeAddr = flag.String("code-addr", fmt.Sprintf(":%d", interp.Port), "code interpreter listen address (empty: off)")
		user     = flag.String("user", "user", "default user")
		python   = flag.String("python", "/usr/bin/python3", "python for the code interpreter")
		health   = flag.Bool("health", false, "check a running envd's health and exit 0 if it answers")
		oomWatch = flag.Bool("oom-watch", true, "as the sandbox's init, kill the largest process when memory nears the sandbox's limit")
		copyMode = flag.Bool("copy", false, "unpack a template build's COPY archive (-archive, -src, -dest, -user, -mode, -workdir) and exit: 0 done, 2 invalid, 1 other failure")
		manifest = flag.Bool("manifest", false, "print the root filesystem's entries, one a line, and exit (export)")
		tarMode  = flag.Bool("tar", false, "write a tar of the paths read from stdin (one quoted path a line) to stdout and exit (export)")
		defaults = flag.Bool("defaults", false, "print this command's user, working directory and environment as JSON and exit (started without options: the daemon's defaults)")
		oomIdle  = flag.Duration("oom-watch-idle", 0, "poll interval of the OOM watchdog while memory is low, when the host sends SIGUSR2 as memory rises (0: poll by the headroom, at most 1 s)")
	)
	copyFlags := registerCopyFlags()
	flag.Parse()
	if *health {
		os.Exit(checkHealth(*addr))
	}
	switch {
	case *manifest:
		os.Exit(runManifest())
	case *tarMode:
		os.Exit(runTar())
	case *defaults:
		os.Exit(runDefaults())
	}
	if *copyMode {
		os.Exit(runCopy(copyFlags, *user))
	}
	log := slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelInfo}))
	if *oomWatch && os.Getpid() == 1 {
		// gVisor has no OOM killer of its own (see package oomwatch).
		if w := oomwatch.New(oomwatch.Config{Logger: log, IdleInterval: *oomIdle}); w != nil {
			// The node's runtime sends SIGUSR2 when the sandbox's memory
			// crosses a share of its limit (see runtime/gvisor/memalert.go).
			alerts := make(chan os.Signal, 1)
			signal.Notify(alerts, syscall.SIGUSR2)
			go func() {
				for range alerts {
					w.Alert()
				}
			}()
			go w.Run(context.Background())
		}
	}
	if err := run(*addr, *codeAddr, *user, *python, log); err != nil {
		log.Error("envd", "err", err)
		os.Exit(1)
	}
}

func run(addr, codeAddr, user, python string, log *slog.Logger) error {
	if os.Getpid() != 1 {
		// Outside a sandbox: adopt orphans of our own children, as init would.
		if err := unix.Prctl(unix.PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0); err != nil {
			return fmt.Errorf("become subreaper: %w", err)
		}
	}
	r := reaper.New(true)
	srv := envd.New(envd.Config{DefaultUser: user, Reaper: r, Logger: log})
	var servers []*http.Server
	serve := func(a string, h http.Handler) error {
		ln, err := net.Listen("tcp", a)
		if err != nil {
			return err
		}
		ln = bufferedListener{ln}
		hs := &http.Server{Handler: h, ReadHeaderTimeout: 30 * time.Second}
		servers = append(servers, hs)
		go func() {
			if err := hs.Serve(ln); err != nil && !errors.Is(err, http.ErrServerClosed) {
				log.Error("serve", "addr", a, "err", err)
			}
		}()
		return nil
	}
	if err := serve(addr, srv); err != nil {
		return err
	}
	if codeAddr != "" {
		ci := interp.New(interp.Config{Python: python, Reaper: r, Defaults: srv.Defaults(), Logger: log})
		if err := serve(codeAddr, ci); err != nil {
			return err
		}
	}
	log.Info("envd ready", "addr", addr, "code_addr", codeAddr, "version", envd.Version, "pid", os.Getpid())
	sigs := make(chan os.Signal, 4)
	signal.Notify(sigs, syscall.SIGTERM, syscall.SIGINT, syscall.SIGHUP)
	sig := <-sigs
	log.Info("forwarding signal and stopping", "signal", sig)
	srv.Processes().SignalAll(sig.(syscall.Signal))
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	for _, hs := range servers {
		hs.Shutdown(ctx)
	}
	return nil
}

// bufferedListener raises each connection's socket buffers: the sandbox's
// network stack then moves a large file in far fewer round trips.
type bufferedListener struct{ net.Listener }

func (l bufferedListener) Accept() (net.Conn, error) {
	c, err := l.Listener.Accept()
	if tc, ok := c.(*net.TCPConn); ok {
		tc.SetWriteBuffer(4 << 20)
		tc.SetReadBuffer(4 << 20)
	}
	return c, err
}

func checkHealth(addr string) int {
	host, port, err := net.SplitHostPort(addr)
	if err != nil {
		return 2
	}
	if host == "" {
		host = "127.0.0.1"
	}
	c := http.Client{Timeout: 2 * time.Second}
	resp, err := c.Get("http://" + net.JoinHostPort(host, port) + "/health")
	if err != nil {
		return 1
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusNoContent {
		return 1
	}
	return 0
}

package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"syscall"

	"github.com/spore-run/spore/internal/envd/copyin"
	"github.com/spore-run/spore/internal/errdefs"
)

type copyFlags struct {
	archive, src, dest, mode, workdir *string
}

func registerCopyFlags() copyFlags {
	return copyFlags{
		archive: flag.String("archive", "", "-copy: the tar (gzip detected) of build-context paths"),
		src:     flag.String("src", "", "-copy: the path or glob in the archive to copy"),
		dest:    flag.String("dest", "", "-copy: where to (Docker COPY semantics)"),
		mode:    flag.String("mode", "", "-copy: octal mode of every file written (default: as archived)"),
		workdir: flag.String("workdir", "", "-copy: what a relative -dest is relative to (default: the working directory, which the daemon starts commands in: its default one)"),
	}
}

// runCopy is "spore-envd -copy": a template build's COPY step, done by
// the daemon's binary because the image may have no tar. -user is the
// daemon's flag (its default is the sandbox's default user); here it
// means --chown, root unless given.
func runCopy(f copyFlags, user string) int {
	owner := ""
	flag.Visit(func(fl *flag.Flag) {
		if fl.Name == "user" {
			owner = user
		}
	})
	if *f.workdir == "" {
		wd, err := os.Getwd()
		if err != nil {
			wd = "/"
		}
		*f.workdir = wd
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
	defer stop()
	err := copyin.Copy(ctx, copyin.Options{
		Root: "/", Archive: *f.archive, Src: *f.src, Dest: *f.dest,
		Workdir: *f.workdir, User: owner, Mode: *f.mode,
	})
	if err == nil {
		return 0
	}
	fmt.Fprintf(os.Stderr, "spore-envd -copy: %v\n", err)
	if errdefs.IsInvalidArgument(err) {
		return 2
	}
	return 1
}

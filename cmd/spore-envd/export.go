package main

import (
	"archive/tar"
	"bufio"
	"encoding/json"
	"fmt"
	"os"
	"os/user"
	"strconv"

	"github.com/spore-run/spore/internal/envd/export"
)

// The modes the node runs through the daemon to export a sandbox's
// filesystem as an OCI image (see internal/node/export.go): the sandbox's
// writes are in gVisor's in-memory overlay layer, visible only from
// inside. They write to stdout, which the node reads from the process
// stream, and exit 0, or 1 with the reason on stderr.

// runManifest is "spore-envd -manifest": one line per entry of the root
// filesystem (export.Entry.AppendLine), mount points marked and not
// entered.
func runManifest() int {
	w := bufio.NewWriterSize(os.Stdout, 256<<10)
	var line []byte
	err := export.Walk("/", true, func(e export.Entry) error {
		line = e.AppendLine(line[:0])
		_, err := w.Write(line)
		return err
	})
	if err == nil {
		err = w.Flush()
	}
	if err != nil {
		return fail("-manifest", err)
	}
	return 0
}

// runTar is "spore-envd -tar": a tar of the paths read from stdin (one
// quoted path a line, parents before children) as they are now; paths
// gone meanwhile are left out.
func runTar() int {
	root, err := os.OpenRoot("/")
	if err != nil {
		return fail("-tar", err)
	}
	defer root.Close()
	out := bufio.NewWriterSize(os.Stdout, 256<<10)
	tw := &export.TarWriter{Root: root, TW: tar.NewWriter(out)}
	sc := bufio.NewScanner(os.Stdin)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for sc.Scan() {
		p, err := strconv.Unquote(sc.Text())
		if err != nil {
			return fail("-tar", fmt.Errorf("path line %.80q not quoted", sc.Text()))
		}
		if _, err := tw.Write(p); err != nil {
			return fail("-tar", err)
		}
	}
	if err := sc.Err(); err != nil {
		return fail("-tar", err)
	}
	if err := tw.TW.Close(); err != nil {
		return fail("-tar", err)
	}
	if err := out.Flush(); err != nil {
		return fail("-tar", err)
	}
	return 0
}

// Defaults is what "spore-envd -defaults" prints: the identity, working
// directory and environment a command started without options gets (run
// it so: then they are the daemon's defaults).
type Defaults struct {
	User string   `json:"user"`
	UID  int      `json:"uid"`
	Cwd  string   `json:"cwd"`
	Env  []string `json:"env"`
}

func runDefaults() int {
	d := Defaults{UID: os.Getuid(), Env: os.Environ()}
	if u, err := user.LookupId(strconv.Itoa(d.UID)); err == nil {
		d.User = u.Username
	}
	cwd, err := os.Getwd()
	if err != nil {
		return fail("-defaults", err)
	}
	d.Cwd = cwd
	if err := json.NewEncoder(os.Stdout).Encode(d); err != nil {
		return fail("-defaults", err)
	}
	return 0
}

func fail(mode string, err error) int {
	fmt.Fprintf(os.Stderr, "spore-envd %s: %v\n", mode, err)
	return 1
}

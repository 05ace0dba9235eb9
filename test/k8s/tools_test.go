package k8s

import (
	"bufio"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"sync"
	"testing"

	"github.com/spore-run/spore/internal/testenv"
)

// tools are the binaries and files scripts/k8s-tools.sh builds, by the keys of its tools.env.
type tools map[string]string

var (
	toolsOnce sync.Once
	toolsVal  tools
	toolsErr  string
)

// needTools returns the cached Kubernetes tools, failing t loudly when they are missing (they are
// part of the real tier: `make test` builds them first). The fast tier skips.
func needTools(t testing.TB, keys ...string) tools {
	t.Helper()
	testenv.RealTier(t)
	toolsOnce.Do(func() { toolsVal, toolsErr = loadTools() })
	if toolsErr != "" {
		t.Fatalf("Kubernetes test tools missing: %s (build them with `make k8s-tools`)", toolsErr)
	}
	for _, k := range keys {
		p, ok := toolsVal[k]
		if !ok {
			t.Fatalf("Kubernetes test tools: %s not in tools.env (rebuild with `make k8s-tools`)", k)
		}
		if _, err := os.Stat(p); err != nil {
			t.Fatalf("Kubernetes test tools: %s: %v (rebuild with `make k8s-tools`)", k, err)
		}
	}
	return toolsVal
}

func cacheDir() string {
	if d := os.Getenv("SPORE_CACHE_DIR"); d != "" {
		return d
	}
	return "/var/cache/spore"
}

func loadTools() (tools, string) {
	path := filepath.Join(cacheDir(), "k8s", "tools.env")
	f, err := os.Open(path)
	if err != nil {
		return nil, err.Error()
	}
	defer f.Close()
	out := tools{}
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		k, v, ok := strings.Cut(strings.TrimSpace(sc.Text()), "=")
		if ok && !strings.HasPrefix(k, "#") {
			out[k] = v
		}
	}
	if err := sc.Err(); err != nil {
		return nil, err.Error()
	}
	return out, ""
}

// chartDir is deploy/helm/spore in this checkout.
func chartDir(t testing.TB) string {
	t.Helper()
	_, file, _, _ := runtime.Caller(0)
	dir := filepath.Join(filepath.Dir(file), "..", "..", "deploy", "helm", "spore")
	if _, err := os.Stat(filepath.Join(dir, "Chart.yaml")); err != nil {
		t.Fatalf("chart not found: %v", err)
	}
	return dir
}

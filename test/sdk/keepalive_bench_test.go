package sdk

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/spore-run/spore/internal/ids"
	"github.com/spore-run/spore/internal/node"
	"github.com/spore-run/spore/internal/testenv"
)

// BenchmarkKeepAliveSaving measures what keep-alive through the proxy
// saves: the stock SDK's commands.run('true'), 4 KiB files.write and
// files.read and a 1 MiB files.write, p50/p90 over KA_CALLS (200) calls
// each, against two servers running at once, interleaved call by call
// (keepalive_bench.mjs): one built from this tree, one from the binaries
// in KEEPALIVE_BASELINE_BIN (spore and spore-envd built with the proxy's
// old "Connection: close" line). The numbers are logged, not asserted:
//
//	KEEPALIVE_BASELINE_BIN=/tmp/bin-close go test -run '^$' -bench KeepAliveSaving -benchtime 1x ./test/sdk/
func BenchmarkKeepAliveSaving(b *testing.B) {
	baseline := os.Getenv("KEEPALIVE_BASELINE_BIN")
	if baseline == "" {
		b.Fatal("KEEPALIVE_BASELINE_BIN: a directory with spore and spore-envd built with the proxy's Connection: close")
	}
	cur := benchServer(b, buildBinaries(b), "kbk")
	old := benchServer(b, baseline, "kbc")
	for range b.N {
		cmd := exec.Command("node", "keepalive_bench.mjs")
		cmd.Env = append(os.Environ(), "E2B_API_KEY="+apiKey,
			"KA_A_URL=http://"+old.addr, "KA_A_NAME=connection-close", "KA_B_URL=http://"+cur.addr, "KA_B_NAME=keep-alive")
		out, err := cmd.CombinedOutput()
		for _, l := range strings.Split(strings.TrimSpace(string(out)), "\n") {
			b.Log(l)
		}
		if err != nil {
			b.Fatalf("keepalive_bench.mjs: %v", err)
		}
	}
}

// benchServer starts `spore up` from bin with its own network prefix and
// cleans up after it under that prefix (sdk_test.go's server sweeps "spa").
func benchServer(b *testing.B, bin, prefix string) *server {
	s := &server{t: b, bin: bin, data: b.TempDir(), cgroup: "/spore-test-" + ids.New('g'),
		rootfs: testenv.PrivateRootFSDir(b), extra: []string{"--net-prefix", prefix}}
	b.Cleanup(func() {
		s.stop()
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
		defer cancel()
		n, err := node.Open(ctx, node.Config{DataDir: s.data, RootFSDir: s.rootfs, Runsc: testenv.Runsc(b),
			EnvdBinary: filepath.Join(s.bin, "spore-envd"), NetPrefix: prefix, CgroupParent: s.cgroup})
		if err != nil {
			b.Errorf("cleanup: open node: %v", err)
			return
		}
		for _, sb := range n.Engine.List(ctx) {
			if err := n.Engine.Kill(ctx, sb.ID); err != nil {
				b.Errorf("cleanup: kill %s: %v", sb.ID, err)
			}
		}
		n.Close()
		if err := n.Runtime.Purge(ctx); err != nil {
			b.Errorf("cleanup: purge: %v", err)
		}
		n.Net.Sweep(ctx, nil)
		n.Net.RemoveHostRules()
	})
	s.start()
	return s
}

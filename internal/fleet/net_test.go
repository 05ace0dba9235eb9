package fleet

import (
	"bytes"
	"context"
	"fmt"
	"log/slog"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/vishvananda/netlink"

	"github.com/spore-run/spore/internal/testenv"
)

// The fleet's host side for real, without node agents: PostgreSQL, the
// firewall table, two node namespaces with their links; a process started
// in a node's namespace sees only its link and reaches the host end; down
// removes every piece and the directory.
func TestNetworkAndPostgresUpDown(t *testing.T) {
	testenv.RequireRoot(t)
	ctx := context.Background()
	const prefix = "t"
	ns := []string{netnsName(prefix, 1), netnsName(prefix, 2)}
	veths := []string{vethName(prefix, 1), vethName(prefix, 2)}
	if err := checkNetFree(ns, veths); err != nil {
		t.Fatalf("the host is not free for this test: %v", err)
	}
	tmp := t.TempDir()
	// The postgres user must reach its cluster under the fleet directory.
	os.Chmod(tmp, 0o711)
	os.Chmod(filepath.Dir(tmp), 0o711)
	dir := filepath.Join(tmp, "fleet")
	os.MkdirAll(dir, 0o711)
	cfg := Config{Dir: dir, Nodes: 2, Replicas: 1, Prefix: prefix}
	if err := cfg.validate(); err != nil {
		t.Fatal(err)
	}
	st := &State{Version: stateVersion, Dir: dir, Prefix: prefix, Executable: "/nonexistent", Dirs: []string{dir}}
	downDone := false
	t.Cleanup(func() {
		if !downDone {
			down(ctx, st, slog.Default())
		}
	})
	if err := startPostgres(ctx, cfg, st); err != nil {
		t.Fatal(err)
	}
	st.NftTables = append(st.NftTables, NftName{"inet", tableName(prefix)})
	if err := hostTable(tableName(prefix), veths, []uint16{uint16(cfg.BasePort)}); err != nil {
		t.Fatal(err)
	}
	for k := 1; k <= 2; k++ {
		if err := makeNodeNet(cfg, st, k); err != nil {
			t.Fatal(err)
		}
	}
	// A listener on the root end of node 1's link.
	ln, err := net.Listen("tcp", "10.201.1.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			c.Write([]byte("hello from the host\n"))
			c.Close()
		}
	}()
	port := ln.Addr().(*net.TCPAddr).Port
	cmd := exec.Command("bash", "-c", fmt.Sprintf("ip -4 -o addr show; ip route; exec 3<>/dev/tcp/10.201.1.1/%d && cat <&3", port))
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	if err := startInNetns(cmd, ns[0]); err != nil {
		t.Fatal(err)
	}
	if err := cmd.Wait(); err != nil {
		t.Fatalf("in %s: %v\n%s", ns[0], err, out.String())
	}
	got := out.String()
	t.Logf("inside %s:\n%s", ns[0], got)
	for _, want := range []string{"eth0    inet 10.201.1.2/30", "default via 10.201.1.1 dev eth0", "hello from the host"} {
		if !strings.Contains(got, want) {
			t.Errorf("inside %s: missing %q", ns[0], want)
		}
	}
	if strings.Contains(got, "10.201.2.") {
		t.Errorf("node 1's namespace sees node 2's link")
	}
	pg := st.Processes[0]
	if !pg.alive() {
		t.Fatal("postgres is not running")
	}

	t0 := time.Now()
	if err := down(ctx, st, slog.Default()); err != nil {
		t.Fatal(err)
	}
	downDone = true
	t.Logf("down in %v", time.Since(t0))
	if pg.alive() {
		t.Error("postgres still runs after down")
	}
	for _, n := range ns {
		if _, err := os.Stat(filepath.Join(netnsRunDir, n)); err == nil {
			t.Errorf("namespace %s left", n)
		}
	}
	for _, v := range veths {
		if _, err := netlink.LinkByName(v); err == nil {
			t.Errorf("link %s left", v)
		}
	}
	if ok, err := tableExists(tableName(prefix)); err != nil || ok {
		t.Errorf("table %s left (%v)", tableName(prefix), err)
	}
	if _, err := os.Stat(dir); !os.IsNotExist(err) {
		t.Errorf("directory %s left: %v", dir, err)
	}
	if p := procsMentioning(dir); len(p) > 0 {
		t.Errorf("processes left: %+v", p)
	}
}

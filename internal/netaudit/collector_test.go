package netaudit

import (
	"fmt"
	"log/slog"
	"net/netip"
	"os"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/vishvananda/netns"

	"github.com/spore-run/spore/internal/testenv"
)

// The collector against the kernel, without a sandbox: three namespaces
// (a "sandbox" at 10.99.7.2, its gateway, a "server" at 10.99.8.2 serving
// HTTP on 8080), the gateway's forward chain logging and dropping new
// connections to 10.99.8.3 as Spore's egress rules do. An allowed request
// is journaled when it ends, with its bytes both ways; a dropped attempt
// with its rule; a connection still open is listed as open, then written
// with its bytes when the collector stops for good.
func TestCollectorAgainstTheKernel(t *testing.T) {
	testenv.RequireRoot(t)
	tag := fmt.Sprintf("%d%d", os.Getpid()%1000, time.Now().UnixNano()%100)
	sb, gw, srv := "nausb"+tag, "naugw"+tag, "nausv"+tag
	sh := func(script string) {
		t.Helper()
		if out, err := exec.Command("sh", "-ec", script).CombinedOutput(); err != nil {
			t.Fatalf("%s: %v\n%s", script, err, out)
		}
	}
	// (The processes the test starts in them are killed by their own
	// cleanups, which run first.)
	t.Cleanup(func() {
		for _, ns := range []string{sb, gw, srv} {
			exec.Command("ip", "netns", "del", ns).Run()
		}
	})
	sh(fmt.Sprintf(`
ip netns add %[1]s; ip netns add %[2]s; ip netns add %[3]s
ip link add na%[4]sa netns %[1]s type veth peer name na%[4]sb netns %[2]s
ip link add na%[4]sc netns %[2]s type veth peer name na%[4]sd netns %[3]s
ip -n %[1]s addr add 10.99.7.2/24 dev na%[4]sa; ip -n %[1]s link set na%[4]sa up; ip -n %[1]s link set lo up
ip -n %[2]s addr add 10.99.7.1/24 dev na%[4]sb; ip -n %[2]s link set na%[4]sb up
ip -n %[2]s addr add 10.99.8.1/24 dev na%[4]sc; ip -n %[2]s link set na%[4]sc up; ip -n %[2]s link set lo up
ip -n %[3]s addr add 10.99.8.2/24 dev na%[4]sd; ip -n %[3]s addr add 10.99.8.3/24 dev na%[4]sd; ip -n %[3]s link set na%[4]sd up; ip -n %[3]s link set lo up
ip -n %[1]s route add default via 10.99.7.1
ip -n %[3]s route add default via 10.99.8.1
ip netns exec %[2]s sysctl -qw net.ipv4.ip_forward=1
ip netns exec %[2]s nft -f - <<'NFT'
table inet t {
  chain forward_audit {
    type filter hook forward priority 0; policy accept;
    ip daddr 10.99.8.3 ct state new limit rate 100/second burst 200 packets log group %[5]d prefix "spore:deny" snaplen %[6]d
    ip daddr 10.99.8.3 drop
  }
}
NFT
`, sb, gw, srv, tag, Group, SnapLen))
	server := exec.Command("ip", "netns", "exec", srv, "python3", "-c", `import http.server, socketserver
class H(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        body = b"x" * 100000
        self.send_response(200); self.send_header("Content-Length", str(len(body))); self.end_headers(); self.wfile.write(body)
    def log_message(self, *a): pass
socketserver.TCPServer.allow_reuse_address = True
import threading, socket, time
def hold():
    l = socket.socket(); l.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1); l.bind(("0.0.0.0", 8081)); l.listen(8)
    while True:
        c, _ = l.accept(); c.recv(100); c.sendall(b"held" * 100); threading.Thread(target=lambda c=c: time.sleep(600), daemon=True).start()
threading.Thread(target=hold, daemon=True).start()
http.server.ThreadingHTTPServer(("0.0.0.0", 8080), H).serve_forever()`)
	if err := server.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { server.Process.Kill(); server.Wait() })
	inSB := func(args ...string) ([]byte, error) {
		return exec.Command("ip", append([]string{"netns", "exec", sb}, args...)...).CombinedOutput()
	}
	for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(50 * time.Millisecond) { // python3 starts slowly on a loaded host
		if _, err := inSB("curl", "-sf", "-o", "/dev/null", "http://10.99.8.2:8080/"); err == nil {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the server does not answer within 30 s")
		}
	}

	j, err := OpenJournal(t.TempDir(), time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	h, err := netns.GetFromName(gw)
	if err != nil {
		t.Fatal(err)
	}
	defer h.Close()
	if err := testenv.InNetNS(h, PrepareNamespace); err != nil {
		t.Fatal(err)
	}
	const id = "iaudittest000000001"
	c, err := Start(j, id, int(h), []netip.Addr{netip.MustParseAddr("10.99.7.2")}, []netip.Addr{netip.MustParseAddr("10.99.7.1")}, slog.Default())
	if err != nil {
		t.Fatal(err)
	}
	stopped := false
	defer func() {
		if !stopped {
			c.Stop(false)
		}
	}()

	if out, err := inSB("curl", "-sf", "-o", "/dev/null", "-w", "%{size_download}", "http://10.99.8.2:8080/"); err != nil || string(out) != "100000" {
		t.Fatalf("allowed request: %v %s", err, out)
	}
	if out, err := inSB("curl", "-s", "-m", "1", "http://10.99.8.3:8080/"); err == nil {
		t.Fatalf("the denied address answered: %s", out)
	}
	// A connection held open (a client that connects and waits).
	holder := exec.Command("ip", "netns", "exec", sb, "python3", "-c",
		`import socket, time; s = socket.create_connection(("10.99.8.2", 8081)); s.sendall(b"hello"); s.recv(400); time.sleep(60)`)
	if err := holder.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { holder.Process.Kill(); holder.Wait() })

	var got []Entry
	deadline := time.Now().Add(30 * time.Second) // the holder's python3 starts slowly on a loaded host
	var allowed, denied, open *Entry
	for time.Now().Before(deadline) {
		got, _ = j.Query(id, time.Time{}, 0)
		allowed, denied, open = nil, nil, nil
		for i := range got {
			e := &got[i]
			switch {
			case e.Allowed && !e.Open && e.Dst == "10.99.8.2:8080":
				allowed = e
			case !e.Allowed && strings.HasPrefix(e.Dst, "10.99.8.3:"):
				denied = e
			case e.Open && e.Dst == "10.99.8.2:8081":
				open = e
			}
		}
		if allowed != nil && denied != nil && open != nil {
			break
		}
		time.Sleep(50 * time.Millisecond)
	}
	if allowed == nil || denied == nil || open == nil {
		t.Fatalf("journal after an allowed request, a denied attempt and a held connection: %+v", got)
	}
	if allowed.Proto != "tcp" || allowed.End == nil || allowed.BytesIn < 100000 || allowed.BytesOut <= 0 {
		t.Errorf("allowed entry: %+v", *allowed)
	}
	if denied.Proto != "tcp" || denied.Dst != "10.99.8.3:8080" || denied.Rule != "deny" {
		t.Errorf("denied entry: %+v", *denied)
	}
	for _, e := range got {
		if strings.HasPrefix(e.Dst, "10.99.8.3:") && e.Allowed {
			t.Errorf("a denied attempt journaled as allowed: %+v", e)
		}
	}

	c.Stop(true)
	stopped = true
	got, _ = j.Query(id, time.Time{}, 0)
	closed := 0
	for _, e := range got {
		if e.Open {
			t.Errorf("an entry still open after the final stop: %+v", e)
		}
		if e.Reason == "open when the sandbox's network went" && e.Dst == "10.99.8.2:8081" && e.BytesIn > 0 && e.BytesOut > 0 && e.End != nil {
			closed++
		}
	}
	if closed != 1 {
		t.Fatalf("the held connection after the final stop (want it once, with its bytes): %+v", got)
	}
}

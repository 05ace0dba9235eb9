package sdk

import (
	"net"
	"os/exec"
	"strconv"
	"strings"
	"testing"
	"time"
)

// TestNetworkThroughTheSDK: E2B's network and lifecycle settings through
// the stock SDK (network.mjs): its most common egress pattern (denyOut
// 0.0.0.0/0 with one address in allowOut reaches that address and nothing
// else; deny-first, the order before, locked the sandbox out),
// updateNetwork replacing the lists at run time, a bad entry refused with
// nothing changed; allowPublicTraffic false (a port answers only with the
// traffic access token, also by the Host the SDK's getHost names with
// --domain); lifecycle autoResume (traffic resumes a paused sandbox). Two
// outside hosts live in a network namespace of this test (198.18.0.2 and
// .3: the test range, outside the operator floor).
func TestNetworkThroughTheSDK(t *testing.T) {
	s := newServer(t, "--domain", "spore.localhost")
	peerHosts(t, "sporetest-egress-peer", "sptegp", []string{"198.18.0.2", "198.18.0.3", "2001:2:0:18::2", "2001:2:0:18::3"}, 18781)
	out := s.node("network.mjs", "PEER_A=http://198.18.0.2:18781", "PEER_B=http://198.18.0.3:18781",
		"PEER_A6=2001:2:0:18::2", "PEER_B6=2001:2:0:18::3", "PEER_PORT=18781")
	t.Log(out)
	if !strings.Contains(out, "7 passed, 0 failed") {
		t.Fatal("network flow did not pass")
	}
}

// peerHosts makes a namespace ns linked to the host (veth <veth>0 on the
// host, 198.18.0.1/29 and 2001:2:0:18::1/64) holding addrs (IPv4 in the
// first, IPv6 in the second), each serving "outside" over HTTP on port;
// removed when t ends.
func peerHosts(t *testing.T, ns, veth string, addrs []string, port int) {
	t.Helper()
	script := "ip netns add " + ns + " && ip link add " + veth + "0 type veth peer name " + veth + "1 netns " + ns +
		" && ip addr add 198.18.0.1/29 dev " + veth + "0 && ip -6 addr add 2001:2:0:18::1/64 dev " + veth + "0 nodad && ip link set " + veth + "0 up" +
		" && ip -n " + ns + " link set " + veth + "1 up && ip -n " + ns + " link set lo up"
	six := false
	for _, a := range addrs {
		if strings.Contains(a, ":") {
			script += " && ip -n " + ns + " -6 addr add " + a + "/64 dev " + veth + "1 nodad"
			six = true
		} else {
			script += " && ip -n " + ns + " addr add " + a + "/29 dev " + veth + "1"
		}
	}
	script += " && ip -n " + ns + " route add default via 198.18.0.1"
	if six {
		script += " && ip -n " + ns + " -6 route add default via 2001:2:0:18::1"
	}
	t.Cleanup(func() {
		exec.Command("ip", "link", "del", veth+"0").Run()
		exec.Command("ip", "netns", "del", ns).Run()
	})
	if out, err := exec.Command("sh", "-c", script).CombinedOutput(); err != nil {
		t.Fatalf("peer namespace: %v %s", err, out)
	}
	srv := exec.Command("ip", "netns", "exec", ns, "/usr/bin/python3", "-c", `import socket, sys
s = socket.socket(socket.AF_INET6); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
s.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 0)
s.bind(("::", int(sys.argv[1]))); s.listen(16)
while True:
    c, _ = s.accept(); c.recv(1000); c.sendall(b"HTTP/1.0 200 OK\r\nContent-Length: 7\r\n\r\noutside"); c.close()`, strconv.Itoa(port))
	if err := srv.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { srv.Process.Kill(); srv.Wait() })
	for _, a := range addrs { // the host reaches them on its end of the link (once python3 is up: slow on a loaded host)
		deadline := time.Now().Add(30 * time.Second)
		for {
			c, err := net.DialTimeout("tcp", net.JoinHostPort(a, strconv.Itoa(port)), time.Second)
			if err == nil {
				c.Close()
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("outside host %s does not answer: %v", a, err)
			}
			time.Sleep(20 * time.Millisecond)
		}
	}
}

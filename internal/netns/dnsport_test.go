package netns_test

import (
	"context"
	"errors"
	"net"
	"os"
	"strconv"
	"syscall"
	"testing"
	"time"

	"github.com/spore-run/spore/internal/netns"
)

// The host table's rule that keeps other hosts off the DNS forwarder's
// port spares the host's own loopback traffic on that port number: a
// client whose ephemeral port it is gets its replies, and a listener that
// took the number after the forwarder went (the table outlives it when a
// node is killed or a server stops, for the sandboxes left running) is
// reached. Before, both stalled until the connection timed out: the rule
// dropped every packet to the port, so a SYN-ACK to such a client never
// arrived (seen as `connect: connection timed out` from the bench, and as
// the stock SDK's "fetch failed" after 10 s in CI). That other hosts stay
// off the port is TestDNSThroughGateway's last step.
func TestDNSPortRuleSparesLoopback(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Fatal("network tests need root")
	}
	// A port no forwarder holds, as when the table outlived its node.
	l, err := net.Listen("tcp4", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	port := l.Addr().(*net.TCPAddr).Port
	l.Close()
	m, err := netns.New(context.Background(), netns.Config{Prefix: "spk", StateDir: t.TempDir(), DNSPort: uint16(port)})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { m.RemoveHostRules() })

	// A listener on the port: reached over loopback.
	l, err = net.Listen("tcp4", "127.0.0.1:"+strconv.Itoa(port))
	if err != nil {
		t.Fatal(err)
	}
	go func() {
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			c.Close()
		}
	}()
	if c, err := net.DialTimeout("tcp4", l.Addr().String(), 3*time.Second); err != nil {
		t.Errorf("a listener on the stale DNS port: %v", err)
	} else {
		c.Close()
	}
	l.Close()

	// A client on the port (its ephemeral port, as the kernel may pick):
	// the server's SYN-ACK to it arrives.
	srv, err := net.Listen("tcp4", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { srv.Close() })
	go func() {
		for {
			c, err := srv.Accept()
			if err != nil {
				return
			}
			c.Close()
		}
	}()
	// SO_REUSEADDR: the listener's closed connections still hold the port.
	d := net.Dialer{Timeout: 3 * time.Second, LocalAddr: &net.TCPAddr{IP: net.IPv4(127, 0, 0, 1), Port: port},
		Control: func(_, _ string, rc syscall.RawConn) error {
			var serr error
			err := rc.Control(func(fd uintptr) { serr = syscall.SetsockoptInt(int(fd), syscall.SOL_SOCKET, syscall.SO_REUSEADDR, 1) })
			return errors.Join(err, serr)
		}}
	if c, err := d.Dial("tcp4", srv.Addr().String()); err != nil {
		t.Errorf("a client whose local port is the DNS port: %v", err)
	} else {
		c.Close()
	}
}

// Removing the host table twice is no error (a node's Close removes it
// when no sandbox network is left, and a purge removes it again).
func TestRemoveHostRulesTwice(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Fatal("network tests need root")
	}
	m, err := netns.New(context.Background(), netns.Config{Prefix: "spk", StateDir: t.TempDir()})
	if err != nil {
		t.Fatal(err)
	}
	if err := m.RemoveHostRules(); err != nil {
		t.Fatal(err)
	}
	if err := m.RemoveHostRules(); err != nil {
		t.Fatalf("second removal: %v", err)
	}
}

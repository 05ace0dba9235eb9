package node

import (
	"bufio"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"net"
	"net/netip"
	"os"
	"strconv"
	"strings"

	"github.com/spore-run/spore/internal/atomicfs"
	"github.com/spore-run/spore/internal/dnsfwd"
	"github.com/spore-run/spore/internal/netns"
)

// HostResolvers returns the nameservers of a resolv.conf (port 53), the
// default upstream of the sandboxes' DNS forwarder. The node asks them
// from the root namespace, where the sandbox floor does not apply (the
// host's resolver is often on a private or loopback address).
func HostResolvers(path string) ([]netip.AddrPort, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	var out []netip.AddrPort
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		fields := strings.Fields(sc.Text())
		if len(fields) >= 2 && fields[0] == "nameserver" {
			if a, err := netip.ParseAddr(fields[1]); err == nil {
				out = append(out, netip.AddrPortFrom(a, 53))
			}
		}
	}
	return out, sc.Err()
}

// ParseUpstreams parses "addr" or "addr:port" entries (port 53 when
// missing).
func ParseUpstreams(list []string) ([]netip.AddrPort, error) {
	var out []netip.AddrPort
	for _, s := range list {
		s = strings.TrimSpace(s)
		if s == "" {
			continue
		}
		if ap, err := netip.ParseAddrPort(s); err == nil {
			out = append(out, ap)
			continue
		}
		a, err := netip.ParseAddr(strings.Trim(s, "[]"))
		if err != nil {
			return nil, fmt.Errorf("DNS upstream %q is not an address or address:port", s)
		}
		out = append(out, netip.AddrPortFrom(a, 53))
	}
	return out, nil
}

// dnsSockets are the forwarder's sockets, on every address of the root
// namespace: the host ends come and go with sandboxes. The root
// namespace's rules keep everything but sandboxes out, and the forwarder
// ignores sources that are no sandbox of this node.
type dnsSockets struct {
	udp  net.PacketConn
	tcp  net.Listener
	port uint16
}

func (s dnsSockets) Close() {
	s.udp.Close()
	s.tcp.Close()
}

func listenPort(port uint16) (dnsSockets, error) {
	u, t, err := dnsfwd.Listen(netip.IPv4Unspecified(), port)
	if err != nil {
		return dnsSockets{}, err
	}
	return dnsSockets{udp: u, tcp: t, port: uint16(u.LocalAddr().(*net.UDPAddr).Port)}, nil
}

// listenDNS opens the forwarder's sockets: on the operator's port, else
// on the port recorded in file (running sandboxes' gateways send there),
// else on a free one, which is recorded.
func listenDNS(file string, want uint16, log *slog.Logger) (dnsSockets, error) {
	if want != 0 {
		s, err := listenPort(want)
		if err != nil {
			return s, fmt.Errorf("DNS forwarder on port %d: %w", want, err)
		}
		return s, atomicfs.WriteFile(file, []byte(strconv.Itoa(int(s.port))), 0o600)
	}
	if b, err := os.ReadFile(file); err == nil {
		if p, err := strconv.ParseUint(strings.TrimSpace(string(b)), 10, 16); err == nil && p != 0 {
			s, err := listenPort(uint16(p))
			if err == nil {
				return s, nil
			}
			log.Warn("recorded DNS forwarder port unavailable; sandboxes still running keep asking it, new ones get a new port", "port", p, "err", err)
		}
	} else if !errors.Is(err, fs.ErrNotExist) {
		return dnsSockets{}, err
	}
	s, err := listenPort(0)
	if err != nil {
		return s, fmt.Errorf("DNS forwarder: %w", err)
	}
	return s, atomicfs.WriteFile(file, []byte(strconv.Itoa(int(s.port))), 0o600)
}

// dnsPolicy maps the network manager's verdicts to the forwarder's.
func dnsPolicy(nm *netns.Manager) func(netip.Addr) dnsfwd.Verdict {
	return func(src netip.Addr) dnsfwd.Verdict {
		switch nm.DNSVerdictFor(src) {
		case netns.DNSForward:
			return dnsfwd.Forward
		case netns.DNSRefuse:
			return dnsfwd.Refuse
		}
		return dnsfwd.Drop
	}
}

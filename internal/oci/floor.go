package oci

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/netip"
	"syscall"
	"time"
)

// ErrFloor marks a connection the registry client refused to open because
// the address it resolved to is in the floor (see Floor). It comes wrapped
// together with errdefs.ErrInvalidArgument: the reference named a host the
// node must not reach.
var ErrFloor = errors.New("address is in the egress floor")

// FloorError is one refused connection: Host as the URL named it
// ("name:port"), Addr the address it resolved to.
type FloorError struct {
	Host string
	Addr netip.Addr
}

func (e *FloorError) Error() string {
	return fmt.Sprintf("%s is at %s, in the node's egress floor (private, loopback, link-local or the host's own addresses)", e.Host, e.Addr)
}

// Unwrap makes errors.Is(err, ErrFloor) hold.
func (e *FloorError) Unwrap() error { return ErrFloor }

// Floor keeps the registry client off addresses a reference must not make
// the node reach: its LAN, loopback, the cloud metadata address, the
// host's own addresses (the sandboxes' egress floor, netns).
type Floor struct {
	// Prefixes are refused.
	Prefixes []netip.Prefix
	// Allowed reports whether a host, as a connection names it
	// ("name:port", "[v6]:port"), may be reached at any address (the
	// registries the operator listed). Nil: none.
	Allowed func(hostport string) bool
}

// Transport returns an HTTP transport with http.DefaultTransport's
// settings whose every connection is checked against the floor on the
// address actually dialled: after name resolution, for each address tried,
// for the registry and for every host a redirect sends the client to
// (registries redirect blob downloads to storage hosts), so neither a name
// resolving to a private address nor a redirect reaches one. It uses no
// HTTP proxy from the environment: through a proxy, the address dialled
// would be the proxy's, and the floor would check nothing.
func (f Floor) Transport() *http.Transport {
	tr := http.DefaultTransport.(*http.Transport).Clone()
	tr.Proxy = nil
	d := &net.Dialer{Timeout: 30 * time.Second, KeepAlive: 30 * time.Second}
	tr.DialContext = func(ctx context.Context, network, addr string) (net.Conn, error) {
		if f.Allowed != nil && f.Allowed(addr) {
			return d.DialContext(ctx, network, addr)
		}
		check := *d
		check.ControlContext = func(_ context.Context, _, address string, _ syscall.RawConn) error {
			return f.check(addr, address)
		}
		return check.DialContext(ctx, network, addr)
	}
	return tr
}

// check refuses address (an "ip:port" about to be connected to for host)
// when it is in the floor. An address that does not parse is refused:
// the check fails closed.
func (f Floor) check(host, address string) error {
	ap, err := netip.ParseAddrPort(address)
	if err != nil {
		return fmt.Errorf("%w: %s: unexpected address %q", ErrFloor, host, address)
	}
	// Prefix.Contains never matches a zoned address; an IPv4-mapped one
	// is checked in both forms.
	a := ap.Addr().WithZone("")
	for _, p := range f.Prefixes {
		if p.Contains(a) || p.Contains(a.Unmap()) {
			return &FloorError{Host: host, Addr: a}
		}
	}
	return nil
}

package fleet

import (
	"errors"
	"fmt"
	sporenet "github.com/spore-run/spore/internal/netns"
	"github.com/spore-run/spore/internal/nftexpr"
	"net/netip"
	"os"
	"path/filepath"
	"runtime"
	"strings"

	"github.com/google/nftables"
	"github.com/google/nftables/expr"
	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"

	"github.com/spore-run/spore/internal/errdefs"
)

// The fleet's private address range: node K's link is 10.201.K.0/30, the
// root end 10.201.K.1 (the node's gateway, where it reaches the API), the
// node's end 10.201.K.2 (where the API reaches the node). 10.200.0.0/16 is
// each node's own sandbox space inside its namespace; 10.201 is outside it.
var fleetSpace = netip.MustParsePrefix("10.201.0.0/16")

const (
	maxNodes    = 250
	netnsRunDir = "/var/run/netns"
	nodeIfName  = "eth0" // the node's end, inside its namespace
)

func nodeAddrs(k int) (host, node netip.Addr) {
	b := fleetSpace.Addr().As4()
	b[2] = byte(k)
	b[3] = 1
	host = netip.AddrFrom4(b)
	b[3] = 2
	return host, netip.AddrFrom4(b)
}

// checkNetFree refuses to start when a namespace or interface name the
// fleet would make exists, or when the host already has an address in the
// fleet's range (another fleet is up, perhaps from another directory).
func checkNetFree(names []string, veths []string) error {
	for _, n := range names {
		if _, err := os.Stat(filepath.Join(netnsRunDir, n)); err == nil {
			return fmt.Errorf("network namespace %s exists (another fleet is up? `spore fleet down --dir` it): %w", n, errdefs.ErrAlreadyExists)
		}
	}
	for _, v := range veths {
		if _, err := netlink.LinkByName(v); err == nil {
			return fmt.Errorf("interface %s exists (another fleet is up?): %w", v, errdefs.ErrAlreadyExists)
		}
	}
	addrs, err := sporenet.HostAddrs()
	if err != nil {
		return err
	}
	for ip := range addrs {
		if fleetSpace.Contains(ip) {
			return fmt.Errorf("the host already has %s in the fleet range %s: another fleet is up: %w", ip, fleetSpace, errdefs.ErrAlreadyExists)
		}
	}
	return nil
}

// sharedRunDir makes /var/run/netns a shared mount point, as iproute2 does
// on its first `ip netns add`: without it, a later `ip netns` command
// mounts the directory over itself and hides the namespaces made before.
func sharedRunDir() error {
	if err := os.MkdirAll(netnsRunDir, 0o755); err != nil {
		return err
	}
	err := unix.Mount("", netnsRunDir, "none", unix.MS_SHARED|unix.MS_REC, "")
	if errors.Is(err, unix.EINVAL) { // not a mount point yet
		if err := unix.Mount(netnsRunDir, netnsRunDir, "none", unix.MS_BIND|unix.MS_REC, ""); err != nil {
			return fmt.Errorf("bind %s: %w", netnsRunDir, err)
		}
		err = unix.Mount("", netnsRunDir, "none", unix.MS_SHARED|unix.MS_REC, "")
	}
	if err != nil {
		return fmt.Errorf("make %s shared: %w", netnsRunDir, err)
	}
	return nil
}

// createNetns makes a named network namespace with lo up. The namespace is
// created by a thread that is thrown away afterwards, so no goroutine of
// ours ever runs in it.
func createNetns(name string) error {
	if err := sharedRunDir(); err != nil {
		return err
	}
	errc := make(chan error, 1)
	go func() {
		runtime.LockOSThread() // never unlocked: the thread exits with this goroutine
		ns, err := netns.NewNamed(name)
		if err != nil {
			errc <- fmt.Errorf("create network namespace %s: %w", name, err)
			return
		}
		ns.Close()
		errc <- nil
	}()
	if err := <-errc; err != nil {
		return err
	}
	return inNetns(name, func(h *netlink.Handle) error {
		lo, err := h.LinkByName("lo")
		if err != nil {
			return err
		}
		return h.LinkSetUp(lo)
	})
}

// inNetns runs fn with a netlink handle in the named namespace.
func inNetns(name string, fn func(h *netlink.Handle) error) error {
	ns, err := netns.GetFromName(name)
	if err != nil {
		return fmt.Errorf("open network namespace %s: %w", name, err)
	}
	defer ns.Close()
	h, err := netlink.NewHandleAt(ns)
	if err != nil {
		return err
	}
	defer h.Close()
	return fn(h)
}

// deleteNetns unmounts and removes a named namespace (gone: not an error).
// The namespace itself ends with its last process.
func deleteNetns(name string) error {
	p := filepath.Join(netnsRunDir, name)
	if _, err := os.Stat(p); errors.Is(err, os.ErrNotExist) {
		return nil
	}
	for unix.Unmount(p, unix.MNT_DETACH) == nil {
	}
	if err := os.Remove(p); err != nil && !errors.Is(err, os.ErrNotExist) {
		return fmt.Errorf("remove network namespace %s: %w", name, err)
	}
	return nil
}

// linkNode joins the node's namespace to the root one: a veth pair, root
// end veth with host/30, the node's end eth0 with node/30 and its default
// route via host.
func linkNode(nsName, veth string, host, node netip.Addr) error {
	ns, err := netns.GetFromName(nsName)
	if err != nil {
		return fmt.Errorf("open network namespace %s: %w", nsName, err)
	}
	defer ns.Close()
	peer := veth + "p"
	if err := netlink.LinkAdd(&netlink.Veth{LinkAttrs: netlink.LinkAttrs{Name: veth}, PeerName: peer, PeerNamespace: netlink.NsFd(ns)}); err != nil {
		return fmt.Errorf("veth %s: %w", veth, err)
	}
	root, err := netlink.NewHandle()
	if err != nil {
		return err
	}
	defer root.Close()
	if err := sporenet.ConfigureLink(root, veth, "", netip.PrefixFrom(host, 30), nil, netip.Addr{}); err != nil {
		return fmt.Errorf("root end %s: %w", veth, err)
	}
	return inNetns(nsName, func(h *netlink.Handle) error {
		if err := sporenet.ConfigureLink(h, peer, nodeIfName, netip.PrefixFrom(node, 30), nil, host); err != nil {
			return fmt.Errorf("node end in %s: %w", nsName, err)
		}
		return nil
	})
}

var netlinkLinkByName = netlink.LinkByName

// deleteLink removes a root-namespace interface (gone: not an error; a
// veth's end goes with its namespace).
func deleteLink(name string) error {
	l, err := netlink.LinkByName(name)
	if err != nil {
		var nf netlink.LinkNotFoundError
		if errors.As(err, &nf) {
			return nil
		}
		return fmt.Errorf("find interface %s: %w", name, err)
	}
	if err := netlink.LinkDel(l); err != nil {
		return fmt.Errorf("delete interface %s: %w", name, err)
	}
	return nil
}

// hostTable installs the fleet's root-namespace table (inet: IPv4 and
// IPv6):
//   - input: the API ports answer only on loopback and the nodes' links
//     (the replicas listen on the wildcard address, so that the nodes reach
//     them at their gateway; nothing beyond the machine does);
//   - postrouting: the nodes' traffic leaving the machine is masqueraded
//     (their sandboxes' egress; the nodes' own DNS upstreams).
func hostTable(name string, veths []string, apiPorts []uint16) error {
	c, err := nftables.New()
	if err != nil {
		return err
	}
	t := c.AddTable(&nftables.Table{Family: nftables.TableFamilyINet, Name: name})
	accept := nftables.ChainPolicyAccept
	input := c.AddChain(&nftables.Chain{Name: "input", Table: t, Type: nftables.ChainTypeFilter,
		Hooknum: nftables.ChainHookInput, Priority: nftables.ChainPriorityFilter, Policy: &accept})
	for _, port := range apiPorts {
		for _, ifn := range append([]string{"lo"}, veths...) {
			c.AddRule(&nftables.Rule{Table: t, Chain: input, Exprs: nftexpr.Rule(nftexpr.IfName(expr.MetaKeyIIFNAME, ifn, expr.CmpOpEq), nftexpr.Dport(unix.IPPROTO_TCP, port), nftexpr.Verdict(expr.VerdictAccept))})
		}
		c.AddRule(&nftables.Rule{Table: t, Chain: input, Exprs: nftexpr.Rule(nftexpr.Dport(unix.IPPROTO_TCP, port), nftexpr.Verdict(expr.VerdictDrop))})
	}
	post := c.AddChain(&nftables.Chain{Name: "postrouting", Table: t, Type: nftables.ChainTypeNAT,
		Hooknum: nftables.ChainHookPostrouting, Priority: nftables.ChainPriorityNATSource})
	c.AddRule(&nftables.Rule{Table: t, Chain: post, Exprs: nftexpr.Rule(nftexpr.IPv4(), nftexpr.InPrefix(12, fleetSpace, expr.CmpOpEq),
		nftexpr.InPrefix(16, fleetSpace, expr.CmpOpNeq), &expr.Masq{})})
	if err := c.Flush(); err != nil {
		return fmt.Errorf("nftables table %s: %w", name, err)
	}
	return nil
}

// deleteTable removes an inet table (gone: not an error).
func deleteTable(name string) error {
	c, err := nftables.New()
	if err != nil {
		return err
	}
	tables, err := c.ListTablesOfFamily(nftables.TableFamilyINet)
	if err != nil {
		return fmt.Errorf("list nftables tables: %w", err)
	}
	for _, t := range tables {
		if t.Name == name {
			c.DelTable(t)
			if err := c.Flush(); err != nil {
				return fmt.Errorf("delete nftables table %s: %w", name, err)
			}
		}
	}
	return nil
}

// tableExists reports whether the inet table is installed.
func tableExists(name string) (bool, error) {
	c, err := nftables.New()
	if err != nil {
		return false, err
	}
	tables, err := c.ListTablesOfFamily(nftables.TableFamilyINet)
	if err != nil {
		return false, err
	}
	for _, t := range tables {
		if t.Name == name {
			return true, nil
		}
	}
	return false, nil
}

const ipForwardPath = "/proc/sys/net/ipv4/ip_forward"

// enableForwarding turns on IPv4 forwarding in the root namespace (the
// nodes' egress crosses it) and returns the value it had, "" when it was
// on already (then down leaves it alone).
func enableForwarding() (string, error) {
	b, err := os.ReadFile(ipForwardPath)
	if err != nil {
		return "", err
	}
	was := strings.TrimSpace(string(b))
	if was == "1" {
		return "", nil
	}
	if err := os.WriteFile(ipForwardPath, []byte("1"), 0o644); err != nil {
		return "", fmt.Errorf("enable forwarding: %w", err)
	}
	return was, nil
}

// Package controltest is a fake node for fast tests of the control plane,
// the API and the proxy: the real engine (its state machine, journal and
// snapshot repository) over the in-memory fake runtime (runtime/fake) and
// a fake network that hands each instance a loopback address. It needs no
// runsc, no root filesystem and no root, and runs under -race.
//
// Every instance gets its own address in 127.0.0.0/8 (all of it is
// loopback on Linux): a test that wants the proxy to reach "the sandbox"
// listens on 0.0.0.0 (or the instance's address) at some port and names
// that port in E2b-Sandbox-Port.
package controltest

import (
	"context"
	"fmt"
	"log/slog"
	"maps"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/spore-run/spore/internal/control"
	"github.com/spore-run/spore/internal/engine"
	"github.com/spore-run/spore/internal/netns"
	"github.com/spore-run/spore/internal/nodeapi/local"
	"github.com/spore-run/spore/internal/runtime/fake"
	"github.com/spore-run/spore/internal/snapshot"
	"github.com/spore-run/spore/internal/tenant"
)

// Templates are built by New (the names `spore up` builds).
var Templates = []string{"base", "code-interpreter-v1"}

// Node is a fake node.
type Node struct {
	Dir     string
	Runtime *fake.Runtime
	Net     *Network
	Engine  *engine.Engine
	// Local is the node contract over Engine, as `spore up` has it.
	Local *local.Node
	// Volumes is its volume store (templates have volume slots).
	Volumes *Volumes
}

// NodeID is the fake node's ID (the one `spore up` uses).
const NodeID = "local"

// Nodes is a registry of the one fake node, for control.Config.
func (n *Node) Nodes() control.Nodes { return control.Nodes{NodeID: n.Local} }

// New opens a fake node in a temporary directory with Templates built;
// the engine is closed when t ends.
func New(t testing.TB) *Node {
	t.Helper()
	n := &Node{Dir: t.TempDir(), Runtime: fake.New(), Net: NewNetwork()}
	rootfs := filepath.Join(n.Dir, "rootfs")
	if err := os.MkdirAll(filepath.Join(rootfs, "base"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(rootfs, "base.json"), []byte(`{"id":"fake-base-1","suite":"fake"}`), 0o644); err != nil {
		t.Fatal(err)
	}
	repo, err := snapshot.Open(filepath.Join(n.Dir, "snapshots"))
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	n.Volumes = newVolumes(filepath.Join(n.Dir, "volumes"))
	n.Engine, err = engine.Open(ctx, engine.Config{
		Dir: filepath.Join(n.Dir, "engine"), RootFSDir: rootfs, Runtime: n.Runtime, Snapshots: repo,
		Network: n.Net, MemoryReserve: -1, Logger: slog.New(slog.DiscardHandler), Volumes: n.Volumes,
	})
	if err != nil {
		t.Fatalf("open engine: %v", err)
	}
	t.Cleanup(func() { n.Engine.Close() })
	n.Local = local.New(n.Engine, local.Config{ID: NodeID, Images: n.Volumes})
	slots, err := n.Volumes.slots()
	if err != nil {
		t.Fatal(err)
	}
	for _, name := range Templates {
		if _, err := n.Engine.BuildTemplate(ctx, engine.TemplateSpec{
			Name: name, Run: snapshot.RunConfig{Args: []string{"init"}, Env: []string{"PATH=/usr/bin:/bin"}, Mounts: slots}, Ready: []string{"true"},
		}); err != nil {
			t.Fatalf("build template %s: %v", name, err)
		}
	}
	return n
}

// Network is the fake network: one loopback address per instance, the
// egress policy remembered.
type Network struct {
	mu     sync.Mutex
	next   uint32
	nets   map[string]netns.Net
	setups int
	teams  map[string]string // instance -> the team its launch acted for (tenant.Of)
	// The next FailClaims claims and FailReserves reserves fail (nothing
	// changed).
	FailClaims, FailReserves int
}

// NewNetwork returns an empty fake network.
func NewNetwork() *Network { return &Network{nets: map[string]netns.Net{}} }

var _ engine.Network = (*Network)(nil)

// Setup gives the instance the next address of 127.1.0.0/16.
func (n *Network) Setup(ctx context.Context, instance string, p netns.Policy) (netns.Net, error) {
	n.mu.Lock()
	defer n.mu.Unlock()
	nt, err := n.addLocked(instance, p)
	if err == nil {
		n.setups++
		if n.teams == nil {
			n.teams = map[string]string{}
		}
		n.teams[instance] = tenant.Of(ctx)
	}
	return nt, err
}

// LaunchTeams is, for each instance set up so far, the team its launch
// acted for ("" none): what the node's launch gate queued it under.
func (n *Network) LaunchTeams() map[string]string {
	n.mu.Lock()
	defer n.mu.Unlock()
	return maps.Clone(n.teams)
}

// Reserve sets up a network for an instance no sandbox holds yet.
func (n *Network) Reserve(ctx context.Context, instance string) (netns.Net, error) {
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.FailReserves > 0 {
		n.FailReserves--
		return netns.Net{}, fmt.Errorf("fake network: injected failure to reserve %s", instance)
	}
	nt, err := n.addLocked(instance, netns.Policy{})
	if err != nil {
		return nt, err
	}
	nt.Reserved = true
	n.nets[instance] = nt
	return nt, nil
}

func (n *Network) addLocked(instance string, p netns.Policy) (netns.Net, error) {
	if _, ok := n.nets[instance]; ok {
		return netns.Net{}, fmt.Errorf("fake network: %s already set up", instance)
	}
	n.next++
	addr := netip.AddrFrom4([4]byte{127, 1, byte(n.next >> 8), byte(n.next)})
	nt := netns.Net{Instance: instance, Slot: int(n.next), Addr: addr, HostAddr: netip.AddrFrom4([4]byte{127, 0, 0, 1}), Policy: p}
	n.nets[instance] = nt
	return nt, nil
}

// Teardown forgets the instance's network.
func (n *Network) Teardown(ctx context.Context, instance string) error {
	n.mu.Lock()
	defer n.mu.Unlock()
	delete(n.nets, instance)
	return nil
}

// SetPolicy changes the instance's policy.
func (n *Network) SetPolicy(ctx context.Context, instance string, p netns.Policy) error {
	n.mu.Lock()
	defer n.mu.Unlock()
	nt, ok := n.nets[instance]
	if !ok {
		return fmt.Errorf("fake network: no network for %s", instance)
	}
	nt.Policy = p
	n.nets[instance] = nt
	return nil
}

// Claim sets a network's policy and the sandbox it belongs to.
func (n *Network) Claim(ctx context.Context, instance, sandbox string, p netns.Policy) error {
	n.mu.Lock()
	defer n.mu.Unlock()
	nt, ok := n.nets[instance]
	if !ok || !nt.Reserved {
		return fmt.Errorf("fake network: no reserved network for %s", instance)
	}
	if n.FailClaims > 0 {
		n.FailClaims--
		return fmt.Errorf("fake network: injected failure to claim %s", instance)
	}
	nt.Policy, nt.Owner, nt.Reserved = p, sandbox, false
	n.nets[instance] = nt
	return nil
}

// Sweep drops every network not in keep.
func (n *Network) Sweep(ctx context.Context, keep map[string]bool) error {
	n.mu.Lock()
	defer n.mu.Unlock()
	for id := range n.nets {
		if !keep[id] {
			delete(n.nets, id)
		}
	}
	return nil
}

// Policy returns an instance's policy.
func (n *Network) Policy(instance string) (netns.Policy, bool) {
	n.mu.Lock()
	defer n.mu.Unlock()
	nt, ok := n.nets[instance]
	return nt.Policy, ok
}

// Len is how many instances have a network.
func (n *Network) Len() int {
	n.mu.Lock()
	defer n.mu.Unlock()
	return len(n.nets)
}

// Get returns an instance's network.
func (n *Network) Get(instance string) (netns.Net, bool) {
	n.mu.Lock()
	defer n.mu.Unlock()
	nt, ok := n.nets[instance]
	return nt, ok
}

// All returns every network, by instance.
func (n *Network) All() map[string]netns.Net {
	n.mu.Lock()
	defer n.mu.Unlock()
	return maps.Clone(n.nets)
}

// Reserved lists the instances whose networks are reserved (set up ahead,
// not claimed), sorted.
func (n *Network) Reserved() []string {
	n.mu.Lock()
	defer n.mu.Unlock()
	var out []string
	for id, nt := range n.nets {
		if nt.Reserved {
			out = append(out, id)
		}
	}
	slices.Sort(out)
	return out
}

// Setups counts the networks Setup made (not Reserve).
func (n *Network) Setups() int {
	n.mu.Lock()
	defer n.mu.Unlock()
	return n.setups
}

// Clone is the network as a crash of its node's process leaves it: it
// outlives the process.
func (n *Network) Clone() *Network {
	n.mu.Lock()
	defer n.mu.Unlock()
	return &Network{next: n.next, nets: maps.Clone(n.nets), setups: n.setups}
}

package server

import (
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"net/http"
	"os"
	"sort"
	"strings"
	"sync"
	"time"

	"github.com/spore-run/spore/internal/control"
	"github.com/spore-run/spore/internal/fleetauth"
	"github.com/spore-run/spore/internal/ids"
	"github.com/spore-run/spore/internal/nodeapi"
	"github.com/spore-run/spore/internal/nodeapi/rpc"
	"github.com/spore-run/spore/internal/store"
)

// HeartbeatEvery is how often a node agent registers itself again (the
// control plane counts it lost after control.LostAfter without one).
const HeartbeatEvery = 2 * time.Second

// RegisterPath is the API role's internal route a node agent registers
// and heartbeats on: on the replica's fleet listener, with the node's
// fleet certificate (or, in an insecure fleet, the cluster token on the
// API listener); never an API key.
const RegisterPath = "/internal/nodes/"

// Registration is what a node agent sends on RegisterPath + its ID.
type Registration struct {
	Info nodeapi.NodeInfo `json:"info"`
	// Addr is where control planes reach the node (its RPC and proxy).
	Addr string `json:"addr"`
	// Joined is true until the first registration of this node agent
	// process succeeded: the control plane reconciles the node then.
	Joined bool `json:"joined"`
}

// ReadToken reads a cluster token from a file (white space trimmed).
func ReadToken(path string) (string, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return "", fmt.Errorf("cluster token: %w", err)
	}
	tok := strings.TrimSpace(string(b))
	if len(tok) < rpc.MinTokenLen {
		return "", fmt.Errorf("cluster token in %s: %d characters, want at least %d", path, len(tok), rpc.MinTokenLen)
	}
	return tok, nil
}

// registry is the API role's view of the fleet: an RPC client per node
// row of the store, refreshed as nodes join, move and leave.
type registry struct {
	fleet *fleetauth.Fleet
	log   *slog.Logger

	mu    sync.RWMutex
	nodes map[string]regNode
	hops  map[string]http.RoundTripper // by node address: to that node's proxy
}

type regNode struct {
	addr   string
	state  string
	client nodeapi.Node
	hc     *http.Client
}

func newRegistry(f *fleetauth.Fleet, log *slog.Logger) *registry {
	return &registry{fleet: f, log: log, nodes: map[string]regNode{}, hops: map[string]http.RoundTripper{}}
}

// Node implements control.Registry.
func (r *registry) Node(id string) (nodeapi.Node, bool) {
	r.mu.RLock()
	defer r.mu.RUnlock()
	n, ok := r.nodes[id]
	return n.client, ok
}

// IDs implements control.Registry.
func (r *registry) IDs() []string {
	r.mu.RLock()
	defer r.mu.RUnlock()
	out := make([]string, 0, len(r.nodes))
	for id := range r.nodes {
		out = append(out, id)
	}
	sort.Strings(out)
	return out
}

// hop is where a node's proxy answers (control.Config.Hop).
func (r *registry) hop(id string) string {
	r.mu.RLock()
	defer r.mu.RUnlock()
	return r.nodes[id].addr
}

// refresh reads the store's nodes: a client for each new node (or one
// whose address changed); nodes gone from the store are dropped. It
// returns the ready nodes.
func (r *registry) refresh(ctx context.Context, st store.Store) ([]string, error) {
	rows, err := st.ListNodes(ctx)
	if err != nil {
		return nil, err
	}
	next := map[string]regNode{}
	var ready []string
	r.mu.RLock()
	old := r.nodes
	r.mu.RUnlock()
	for _, n := range rows {
		if n.Addr == "" {
			continue
		}
		rn, ok := old[n.ID]
		if !ok || rn.addr != n.Addr {
			// Each node its own client: its TLS checks that it reached
			// that node (its certificate names n.ID), not just a member.
			hc := rpc.HTTPClient(r.fleet.ClientTLS(fleetauth.IsNode(n.ID)))
			c, err := rpc.NewClient(r.fleet.Scheme()+"://"+n.Addr, r.fleet.Token(), hc)
			if err != nil {
				r.log.Warn("node registry: bad node address", "node_id", n.ID, "addr", n.Addr, "err", err)
				continue
			}
			if ok {
				rn.hc.CloseIdleConnections()
			}
			rn = regNode{addr: n.Addr, client: c, hc: hc}
		}
		rn.state = n.State
		next[n.ID] = rn
		if n.State == store.NodeReady {
			ready = append(ready, n.ID)
		}
	}
	r.mu.Lock()
	r.nodes = next
	for addr := range r.hops {
		if !hasAddr(next, addr) {
			delete(r.hops, addr)
		}
	}
	r.mu.Unlock()
	for id, rn := range old {
		if cur, ok := next[id]; !ok || cur.hc != rn.hc {
			rn.hc.CloseIdleConnections()
		}
	}
	return ready, nil
}

func hasAddr(nodes map[string]regNode, addr string) bool {
	for _, n := range nodes {
		if n.addr == addr {
			return true
		}
	}
	return false
}

// hopTransport is the transport to the proxy of the node at addr (the
// proxy's WithHop): its TLS checks the node's identity, as the node's
// RPC client does. An address no node has gets a transport that fails.
func (r *registry) hopTransport(addr string) http.RoundTripper {
	r.mu.RLock()
	rt, ok := r.hops[addr]
	r.mu.RUnlock()
	if ok {
		return rt
	}
	id := ""
	r.mu.RLock()
	for nid, n := range r.nodes {
		if n.addr == addr {
			id = nid
		}
	}
	r.mu.RUnlock()
	if id == "" {
		return failingRT{fmt.Errorf("no node of this fleet is at %s", addr)}
	}
	rt = r.fleet.Transport(fleetauth.IsNode(id))
	r.mu.Lock()
	defer r.mu.Unlock()
	if cur, ok := r.hops[addr]; ok {
		return cur
	}
	r.hops[addr] = rt
	return rt
}

type failingRT struct{ err error }

func (f failingRT) RoundTrip(*http.Request) (*http.Response, error) { return nil, f.err }

// registerHandler serves RegisterPath{id} for node agents: the node's
// fleet certificate, which must name node id (or, insecure, the cluster
// token), and a Registration body. A node that is new, was lost or left,
// or says it just started is reconciled (its rows against its List)
// before the answer.
func registerHandler(ctl *control.Service, st store.Store, reg *registry, f *fleetauth.Fleet, log *slog.Logger) http.HandlerFunc {
	nodes := fleetauth.Roles(fleetauth.RoleNode)
	return func(w http.ResponseWriter, r *http.Request) {
		who, ok := f.Admit(r, false, nodes)
		if !ok {
			http.Error(w, "registration: not a node of this fleet (no fleet certificate, or missing or wrong cluster token)", http.StatusUnauthorized)
			return
		}
		id := r.PathValue("id")
		if err := ids.Validate("node ID", id); err != nil {
			http.Error(w, err.Error(), http.StatusBadRequest)
			return
		}
		if who.Role == fleetauth.RoleNode && who.Name != id {
			log.Warn("registration refused: a node registered under another node's ID", "node_id", id, "certificate", who.String())
			http.Error(w, fmt.Sprintf("registration: the certificate names %s, not node %s", who, id), http.StatusForbidden)
			return
		}
		var body Registration
		dec := json.NewDecoder(http.MaxBytesReader(w, r.Body, 1<<20))
		if err := dec.Decode(&body); err != nil {
			http.Error(w, "registration: "+err.Error(), http.StatusBadRequest)
			return
		}
		if body.Addr == "" || (body.Info.ID != "" && body.Info.ID != id) {
			http.Error(w, "registration: addr missing or info names another node", http.StatusBadRequest)
			return
		}
		join, err := ctl.Heartbeat(r.Context(), id, body.Addr, body.Info, body.Joined)
		if err != nil {
			log.Error("node heartbeat", "node_id", id, "err", err)
			http.Error(w, "could not record the heartbeat", http.StatusServiceUnavailable)
			return
		}
		if join {
			if _, err := reg.refresh(r.Context(), st); err != nil {
				http.Error(w, "could not refresh the node registry", http.StatusServiceUnavailable)
				return
			}
			ctl.Follow(id)
			// Answered only once reconciled and ready: a failure leaves
			// the node joining, and its next heartbeat joins it again.
			ctx, cancel := context.WithTimeout(r.Context(), time.Minute)
			defer cancel()
			if err := ctl.ReconcileNode(ctx, id); err != nil {
				log.Warn("reconcile a joining node", "node_id", id, "err", err)
				http.Error(w, "could not reconcile the node", http.StatusServiceUnavailable)
				return
			}
			if err := ctl.Joined(ctx, id); err != nil {
				http.Error(w, "could not mark the node ready", http.StatusServiceUnavailable)
				return
			}
			log.Info("node joined", "node_id", id, "addr", body.Addr)
		}
		w.WriteHeader(http.StatusNoContent)
	}
}

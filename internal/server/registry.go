package server

import (
	"context"
	"crypto/sha256"
	"crypto/subtle"
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
	"github.com/spore-run/spore/internal/ids"
	"github.com/spore-run/spore/internal/nodeapi"
	"github.com/spore-run/spore/internal/nodeapi/rpc"
	"github.com/spore-run/spore/internal/store"
)

// HeartbeatEvery is how often a node agent registers itself again (the
// control plane counts it lost after control.LostAfter without one).
const HeartbeatEvery = 2 * time.Second

// RegisterPath is the API role's internal route a node agent registers
// and heartbeats on (cluster token, not an API key).
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

// tokenOK compares a presented token with the cluster token in constant
// time (over digests: no length leak).
func tokenOK(got, want string) bool {
	a, b := sha256.Sum256([]byte(got)), sha256.Sum256([]byte(want))
	return got != "" && subtle.ConstantTimeCompare(a[:], b[:]) == 1
}

func bearerOK(h http.Header, token string) bool {
	got, ok := strings.CutPrefix(h.Get("Authorization"), "Bearer ")
	return ok && tokenOK(got, token)
}

// registry is the API role's view of the fleet: an RPC client per node
// row of the store, refreshed as nodes join, move and leave.
type registry struct {
	token string
	log   *slog.Logger
	hc    *http.Client

	mu    sync.RWMutex
	nodes map[string]regNode
}

type regNode struct {
	addr   string
	state  string
	client nodeapi.Node
}

func newRegistry(token string, log *slog.Logger) *registry {
	return &registry{token: token, log: log, hc: rpc.HTTPClient(nil), nodes: map[string]regNode{}}
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
			c, err := rpc.NewClient("http://"+n.Addr, r.token, r.hc)
			if err != nil {
				r.log.Warn("node registry: bad node address", "node_id", n.ID, "addr", n.Addr, "err", err)
				continue
			}
			rn = regNode{addr: n.Addr, client: c}
		}
		rn.state = n.State
		next[n.ID] = rn
		if n.State == store.NodeReady {
			ready = append(ready, n.ID)
		}
	}
	r.mu.Lock()
	r.nodes = next
	r.mu.Unlock()
	return ready, nil
}

// registerHandler serves RegisterPath{id} for node agents: the cluster
// token as a Bearer credential, a Registration body. A node that is new,
// was lost or left, or says it just started is reconciled (its rows
// against its List) before the answer.
func registerHandler(ctl *control.Service, st store.Store, reg *registry, token string, log *slog.Logger) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		if !bearerOK(r.Header, token) {
			http.Error(w, "missing or wrong cluster token", http.StatusUnauthorized)
			return
		}
		id := r.PathValue("id")
		if err := ids.Validate("node ID", id); err != nil {
			http.Error(w, err.Error(), http.StatusBadRequest)
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

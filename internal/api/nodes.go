package api

import (
	"net/http"
	"time"

	"github.com/spore-run/spore/internal/errdefs"
	"github.com/spore-run/spore/internal/ids"
	"github.com/spore-run/spore/internal/nodeapi"
)

// NodeInfo is one node of the fleet as GET /nodes shows it.
type NodeInfo struct {
	NodeID       string            `json:"nodeID"`
	Addr         string            `json:"addr"`
	State        string            `json:"state"` // ready, joining, lost, left
	Draining     bool              `json:"draining"`
	Labels       map[string]string `json:"labels,omitempty"`
	Sandboxes    int               `json:"sandboxes"`    // running, paused and being created
	MemoryUsedMB int64             `json:"memoryUsedMB"` // the sum of their memory limits
	// MemoryCapacityMB and VCPUs are the host's real memory and CPUs; the
	// overcommit ratios are the operator's (1: none); placement may promise
	// MemoryAllocatableMB = capacity × memoryOvercommit − memoryReservedMB
	// of sandbox limits.
	MemoryCapacityMB    int64   `json:"memoryCapacityMB"`
	MemoryOvercommit    float64 `json:"memoryOvercommit"`
	MemoryReservedMB    int64   `json:"memoryReservedMB"`
	MemoryAllocatableMB int64   `json:"memoryAllocatableMB"`
	VCPUs               float64 `json:"vcpus"`
	CPUOvercommit       float64 `json:"cpuOvercommit"`
	HeartbeatAgeMs      int64   `json:"heartbeatAgeMs"`
	RunscBuild          string  `json:"runscBuild,omitempty"`
}

// DrainResult says what a drain did.
type DrainResult struct {
	NodeID     string `json:"nodeID"`
	Hibernated int    `json:"hibernated"`
}

func (s *Server) listNodes(w http.ResponseWriter, r *http.Request) {
	list, err := s.c.Nodes(r.Context())
	if err != nil {
		s.fail(w, r, err)
		return
	}
	out := make([]NodeInfo, 0, len(list))
	for _, n := range list {
		memOC, cpuOC := ratioOr1(n.Overcommit.Memory), ratioOr1(n.Overcommit.VCPUs)
		out = append(out, NodeInfo{NodeID: n.ID, Addr: n.Addr, State: n.State, Draining: n.Draining, Labels: n.Labels,
			Sandboxes: n.Sandboxes, MemoryUsedMB: n.MemoryUsedMB, MemoryCapacityMB: n.Capacity.MemoryMB,
			MemoryOvercommit: memOC, MemoryReservedMB: n.Reserved.MemoryMB,
			MemoryAllocatableMB: int64(float64(n.Capacity.MemoryMB)*memOC) - n.Reserved.MemoryMB,
			VCPUs:               n.Capacity.VCPUs, CPUOvercommit: cpuOC,
			HeartbeatAgeMs: n.HeartbeatAge.Milliseconds(), RunscBuild: n.RunscBuild})
	}
	writeJSON(w, http.StatusOK, out)
}

// ratioOr1 is an overcommit ratio as placement reads it: 0 (a node row
// from before the setting) is 1.
func ratioOr1(r float64) float64 {
	if r == 0 {
		return 1
	}
	return r
}

func nodeID(w http.ResponseWriter, r *http.Request) (string, bool) {
	id := r.PathValue("nodeID")
	if err := ids.Validate("node ID", id); err != nil {
		writeError(w, http.StatusBadRequest, err.Error())
		return "", false
	}
	return id, true
}

// drainNode stops placements on a node and hibernates its sandboxes
// (they resume there once it is undrained; moving them to another node
// needs shared snapshot storage).
func (s *Server) drainNode(w http.ResponseWriter, r *http.Request) {
	id, ok := nodeID(w, r)
	if !ok {
		return
	}
	n, err := s.c.Drain(r.Context(), id)
	if err != nil {
		s.fail(w, r, err)
		return
	}
	writeJSON(w, http.StatusOK, DrainResult{NodeID: id, Hibernated: n})
}

func (s *Server) undrainNode(w http.ResponseWriter, r *http.Request) {
	id, ok := nodeID(w, r)
	if !ok {
		return
	}
	if err := s.c.Undrain(r.Context(), id); err != nil {
		s.fail(w, r, err)
		return
	}
	w.WriteHeader(http.StatusNoContent)
}

// GCRequest is POST /blobs/gc.
type GCRequest struct {
	// GraceSeconds: chunks written more recently stay (0: 3600).
	GraceSeconds int64 `json:"graceSeconds"`
	DryRun       bool  `json:"dryRun"`
}

// GCResult is what a blob store garbage collection freed and kept.
type GCResult struct {
	NodeID        string `json:"nodeID"` // the node that ran it
	DeletedChunks int64  `json:"deletedChunks"`
	FreedBytes    int64  `json:"freedBytes"`
	KeptChunks    int64  `json:"keptChunks"`
	YoungChunks   int64  `json:"youngChunks"`
	Snapshots     int64  `json:"snapshots"`
	DryRun        bool   `json:"dryRun"`
}

func (s *Server) collectGarbage(w http.ResponseWriter, r *http.Request) {
	var body GCRequest
	if !decode(w, r, &body) {
		return
	}
	if body.GraceSeconds < 0 || body.GraceSeconds > 30*24*3600 {
		s.fail(w, r, errdefs.Invalidf("graceSeconds %d out of range 0..2592000", body.GraceSeconds))
		return
	}
	grace := time.Duration(body.GraceSeconds) * time.Second
	if grace == 0 {
		grace = time.Hour
	}
	id, rep, err := s.c.CollectGarbage(r.Context(), nodeapi.GCRequest{Grace: grace, DryRun: body.DryRun})
	if err != nil {
		s.fail(w, r, err)
		return
	}
	writeJSON(w, http.StatusOK, GCResult{NodeID: id, DeletedChunks: rep.DeletedChunks, FreedBytes: rep.FreedBytes, KeptChunks: rep.KeptChunks,
		YoungChunks: rep.YoungChunks, Snapshots: rep.Manifests, DryRun: body.DryRun})
}

// Package local is the in-process implementation of the node contract
// (nodeapi.Node) over an engine on this host: `spore up` runs the control
// plane against it, so the one-process mode and a fleet of remote nodes
// go through the same control code. It only converts types and forwards
// events; the engine does the work (and the idempotency: it accepts the
// control plane's IDs).
package local

import (
	"bufio"
	"context"
	"fmt"
	"os"
	goruntime "runtime"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/google/go-containerregistry/pkg/name"

	"github.com/spore-run/spore/internal/blob"
	"github.com/spore-run/spore/internal/chunk"
	"github.com/spore-run/spore/internal/egress"
	"github.com/spore-run/spore/internal/engine"
	"github.com/spore-run/spore/internal/errdefs"
	"github.com/spore-run/spore/internal/ids"
	"github.com/spore-run/spore/internal/netaudit"
	"github.com/spore-run/spore/internal/netns"
	"github.com/spore-run/spore/internal/node"
	"github.com/spore-run/spore/internal/nodeapi"
	"github.com/spore-run/spore/internal/oci"
	"github.com/spore-run/spore/internal/snapshot"
	"github.com/spore-run/spore/internal/snapsync"
	"github.com/spore-run/spore/internal/timing"
)

// Config describes the node to the control plane.
type Config struct {
	ID     string // default "local"
	Addr   string
	Labels map[string]string
	// Capacity defaults to the host's real memory and CPUs (see
	// HostCapacity); Reserved is the engine's memory reserve.
	Capacity, Reserved nodeapi.Resources
	// Overcommit is the operator's ratio of sandbox limits to capacity
	// (each 0: DefaultMemoryOvercommit, DefaultCPUOvercommit).
	Overcommit  nodeapi.Overcommit
	CPUFeatures []string
	// Sync, when set, is the node's way to the blob store: snapshots can
	// be uploaded, and durable ones it lacks are fetched on use.
	Sync *snapsync.Syncer
	// Images, when set, builds templates from OCI images (the node: a
	// *node.Node); without it BuildImage answers ErrConflict.
	Images ImageBuilder
	// PeerScheme is how peers (other nodes, at the addresses requests
	// name) are reached: "https" in a fleet with certificates, "http"
	// (the default) in an insecure one.
	PeerScheme string
}

// ImageBuilder builds a template from an OCI image, reaching the registry
// as the node's configuration says (node.Node.BuildImage).
type ImageBuilder interface {
	BuildImage(ctx context.Context, spec node.ImageTemplateSpec) (snapshot.Manifest, error)
}

// Exporter writes a sandbox's filesystem as an OCI image
// (node.Node.Export). The node's Images, when it implements it, does
// exports too (a *node.Node does).
type Exporter interface {
	Export(ctx context.Context, spec node.ExportSpec) (node.ExportResult, error)
}

// VolumePreparer makes and mounts the volumes a new sandbox shows
// (node.Node.PrepareVolumes). The node's Images, when it implements it,
// prepares volumes (a *node.Node does); without it a create that mounts a
// volume is refused.
type VolumePreparer interface {
	PrepareVolumes(ctx context.Context, mounts []nodeapi.VolumeMount) ([]engine.Volume, error)
}

// EgressAuditor reads a node's egress audit journal
// (node.Node.EgressAudit). The node's Images, when it implements it,
// answers EgressAudit (a *node.Node does).
type EgressAuditor interface {
	EgressAudit(ctx context.Context, sandboxID string, since time.Time, limit int) ([]netaudit.Entry, error)
}

// FileReader reads a running sandbox's files through its daemon
// (node.Node.FileTree, ReadFiles). The node's Images, when it implements
// it, does (a *node.Node does).
type FileReader interface {
	FileTree(ctx context.Context, id string) ([]nodeapi.FileEntry, error)
	ReadFiles(ctx context.Context, id string, paths []string) ([]nodeapi.FileData, error)
}

// Node is a nodeapi.Node over an engine in this process.
type Node struct {
	eng *engine.Engine
	cfg Config

	mu   sync.Mutex
	subs map[chan nodeapi.Event]struct{}
}

var _ nodeapi.Node = (*Node)(nil)

// MaxSandboxes is the slot count a node advertises: ~40 host threads per
// gVisor sandbox against a raised pid_max; the engine's admission check
// (memory, task table) stays the last word.
const MaxSandboxes = 4096

// New wraps eng.
func New(eng *engine.Engine, cfg Config) *Node {
	if cfg.ID == "" {
		cfg.ID = "local"
	}
	if cfg.Capacity == (nodeapi.Resources{}) {
		cfg.Capacity = HostCapacity()
	}
	if cfg.Overcommit.Memory == 0 {
		cfg.Overcommit.Memory = DefaultMemoryOvercommit
	}
	if cfg.Overcommit.VCPUs == 0 {
		cfg.Overcommit.VCPUs = DefaultCPUOvercommit
	}
	n := &Node{eng: eng, cfg: cfg, subs: map[chan nodeapi.Event]struct{}{}}
	eng.OnDeath(func(es engine.Sandbox) {
		ev := nodeapi.Event{Kind: nodeapi.EventDied, SandboxID: es.ID, At: time.Now().UTC()}
		if es.Death != nil {
			ev.Reason, ev.Detail, ev.At = string(es.Death.Reason), es.Death.Detail, es.Death.At
		}
		n.publish(ev)
	})
	eng.OnRelieved(func(es engine.Sandbox, detail string) {
		n.publish(nodeapi.Event{Kind: nodeapi.EventHibernated, SandboxID: es.ID, Reason: engine.PressureReason, Detail: detail, At: time.Now().UTC()})
	})
	return n
}

// Default overcommit ratios (the operator's `--memory-overcommit` and
// `--cpu-overcommit`). A sandbox's limits are caps, not reservations, so
// placement may promise more than the host has; the node's admission
// check (available memory above the reserve, task table) still refuses,
// with ErrResourceLimit, what the host cannot take. docs/control-plane.md
// (Placement) gives the reasoning:
//
//   - memory 10: the bet is that sandboxes use on average at most a tenth
//     of their limits. An idle `base` sandbox holds ~23 MB of its 1024 MB
//     (2 %), so idle fleets fit with 4-5× headroom; overcommitting memory
//     further risks the host's OOM killer among running sandboxes, which
//     admission (it only gates new ones) cannot prevent.
//   - vCPUs 320: a vCPU limit is a CPU quota, overcommitting it only shares
//     cores (nothing dies of it), so memory, whose overcommit can fail,
//     should bind first. The default sandbox (1024 MB, 2 vCPUs) asks 2
//     vCPUs per GiB; at memory ratio 10, a host with 16 GiB per core
//     places 160 of them per core = 320 vCPUs. Up to 16 GiB per core
//     (most hosts) memory binds first; an operator who wants to cap CPU
//     contention lowers the ratio.
const (
	DefaultMemoryOvercommit = 10
	DefaultCPUOvercommit    = 320
)

// HostCapacity is this host's real memory (MemTotal) and CPUs, and
// MaxSandboxes slots.
func HostCapacity() nodeapi.Resources {
	r := nodeapi.Resources{VCPUs: float64(goruntime.NumCPU()), Sandboxes: MaxSandboxes}
	if f, err := os.Open("/proc/meminfo"); err == nil {
		defer f.Close()
		sc := bufio.NewScanner(f)
		for sc.Scan() {
			if rest, ok := strings.CutPrefix(sc.Text(), "MemTotal:"); ok {
				kb, _ := strconv.ParseInt(strings.TrimSuffix(strings.TrimSpace(rest), " kB"), 10, 64)
				r.MemoryMB = kb >> 10
			}
		}
	}
	return r
}

// Engine is the engine behind the node (for the node's own housekeeping
// reports; the control plane never reaches it).
func (n *Node) Engine() *engine.Engine { return n.eng }

// Info describes the node.
func (n *Node) Info(ctx context.Context) (nodeapi.NodeInfo, error) {
	defer timing.Track(ctx, "node")()
	info := nodeapi.NodeInfo{ID: n.cfg.ID, Addr: n.cfg.Addr, Capacity: n.cfg.Capacity, Reserved: n.cfg.Reserved, Overcommit: n.cfg.Overcommit,
		RunscBuild: n.eng.Runtime().Name(), CPUFeatures: n.cfg.CPUFeatures, Labels: n.cfg.Labels, Durable: n.cfg.Sync != nil}
	for _, m := range n.eng.Snapshots().List() {
		if m.Kind == snapshot.KindTemplate {
			info.Templates = append(info.Templates, m.Names...)
		}
	}
	if free, ok := n.eng.MemoryFree(ctx); ok {
		mb := free >> 20
		info.MemoryFreeMB = &mb
	}
	info.LaunchesQueued = n.eng.LaunchLoad().Queued
	return info, nil
}

// Create restores a sandbox under the caller's ID and token.
func (n *Node) Create(ctx context.Context, req nodeapi.CreateRequest) (nodeapi.Sandbox, error) {
	defer timing.Track(ctx, "node")()
	if req.SandboxID == "" || req.AccessToken == "" {
		return nodeapi.Sandbox{}, errdefs.Invalidf("create: the sandbox ID and access token are minted by the caller")
	}
	if err := n.ensure(ctx, req.Template, req.Peers); err != nil {
		n.opDone("create", req.SandboxID, err)
		return nodeapi.Sandbox{}, err
	}
	vols, err := n.prepareVolumes(ctx, req.Volumes)
	if err != nil {
		n.opDone("create", req.SandboxID, err)
		return nodeapi.Sandbox{}, err
	}
	es, err := n.eng.Create(ctx, engine.CreateOptions{ID: req.SandboxID, AccessToken: req.AccessToken, Template: req.Template,
		Env: req.Env, VCPUs: req.VCPUs, MemoryMB: req.MemoryMB, Policy: toNetPolicy(req.Policy), Volumes: vols})
	n.opDone("create", req.SandboxID, err)
	if err != nil {
		return nodeapi.Sandbox{}, err
	}
	return Sandbox(es), nil
}

// Get returns one sandbox.
func (n *Node) Get(ctx context.Context, id string) (nodeapi.Sandbox, error) {
	defer timing.Track(ctx, "node")()
	es, err := n.eng.Get(ctx, id)
	if err != nil {
		return nodeapi.Sandbox{}, err
	}
	return Sandbox(es), nil
}

// List returns every sandbox.
func (n *Node) List(ctx context.Context) ([]nodeapi.Sandbox, error) {
	defer timing.Track(ctx, "node")()
	list := n.eng.List(ctx)
	out := make([]nodeapi.Sandbox, len(list))
	for i, es := range list {
		out[i] = Sandbox(es)
	}
	return out, nil
}

// Kill kills a sandbox.
func (n *Node) Kill(ctx context.Context, id string) error {
	defer timing.Track(ctx, "node")()
	err := n.eng.Kill(ctx, id)
	n.opDone("kill", id, err)
	return err
}

// Pause pauses a sandbox.
func (n *Node) Pause(ctx context.Context, id string) error {
	defer timing.Track(ctx, "node")()
	err := n.eng.Pause(ctx, id)
	n.opDone("pause", id, err)
	return err
}

// Resume resumes a sandbox and returns it.
func (n *Node) Resume(ctx context.Context, id string) (nodeapi.Sandbox, error) {
	defer timing.Track(ctx, "node")()
	err := n.eng.Resume(ctx, id)
	n.opDone("resume", id, err)
	if err != nil {
		return nodeapi.Sandbox{}, err
	}
	es, err := n.eng.Get(ctx, id)
	if err != nil {
		return nodeapi.Sandbox{}, err
	}
	return Sandbox(es), nil
}

// Hibernate hibernates a sandbox.
func (n *Node) Hibernate(ctx context.Context, id string) error {
	defer timing.Track(ctx, "node")()
	err := n.eng.Hibernate(ctx, id)
	n.opDone("hibernate", id, err)
	return err
}

// Quiesce finds nothing in flight: the in-process node has no proxy of
// its own in front of its sandboxes (a node agent's RPC handler puts its
// proxy's in front of this: server.NodeHandler). Unknown: ErrNotFound.
func (n *Node) Quiesce(ctx context.Context, id string, _ time.Duration) (int, error) {
	if _, err := n.eng.Get(ctx, id); err != nil {
		return 0, err
	}
	return 0, nil
}

// Snapshot takes a live snapshot under the caller's ID.
func (n *Node) Snapshot(ctx context.Context, id string, req nodeapi.SnapshotRequest) (nodeapi.SnapshotInfo, error) {
	defer timing.Track(ctx, "node")()
	if req.SnapshotID == "" {
		return nodeapi.SnapshotInfo{}, errdefs.Invalidf("snapshot: the snapshot ID is minted by the caller")
	}
	res, err := n.eng.Snapshot(ctx, id, engine.SnapshotOptions{ID: req.SnapshotID, Names: req.Names, Template: req.Template})
	n.opDone("snapshot", id, err)
	if err != nil {
		return nodeapi.SnapshotInfo{}, err
	}
	return SnapshotInfo(res.Manifest), nil
}

// Fork makes the named children of a sandbox.
func (n *Node) Fork(ctx context.Context, id string, req nodeapi.ForkRequest) (nodeapi.ForkResult, error) {
	defer timing.Track(ctx, "node")()
	if len(req.Children) == 0 {
		return nodeapi.ForkResult{}, errdefs.Invalidf("fork: no children named")
	}
	specs := make([]engine.ForkChildSpec, len(req.Children))
	for i, c := range req.Children {
		if c.SandboxID == "" || c.AccessToken == "" {
			return nodeapi.ForkResult{}, errdefs.Invalidf("fork: child %d: the sandbox ID and access token are minted by the caller", i)
		}
		specs[i] = engine.ForkChildSpec{ID: c.SandboxID, AccessToken: c.AccessToken}
	}
	fr, err := n.eng.Fork(ctx, id, engine.ForkOptions{Children: specs, Concurrency: req.Concurrency})
	n.opDone("fork", id, err)
	if err != nil {
		return nodeapi.ForkResult{}, err
	}
	out := nodeapi.ForkResult{Children: make([]nodeapi.ForkChild, len(fr.Children))}
	for i, c := range fr.Children {
		out.Children[i].Err = c.Err
		if c.Err == nil {
			out.Children[i].Sandbox = Sandbox(c.Sandbox)
		}
	}
	return out, nil
}

// Rollback rolls a sandbox back in place.
func (n *Node) Rollback(ctx context.Context, id, snapshotRef string) (nodeapi.Sandbox, error) {
	defer timing.Track(ctx, "node")()
	if err := n.ensure(ctx, snapshotRef, nil); err != nil {
		return nodeapi.Sandbox{}, err
	}
	es, err := n.eng.Rollback(ctx, id, snapshotRef)
	n.opDone("rollback", id, err)
	if err != nil {
		return nodeapi.Sandbox{}, err
	}
	return Sandbox(es), nil
}

// GetSnapshot returns one snapshot by ID or name.
func (n *Node) GetSnapshot(ctx context.Context, ref string) (nodeapi.SnapshotInfo, error) {
	defer timing.Track(ctx, "node")()
	m, err := n.eng.Snapshots().Get(ref)
	if err != nil {
		return nodeapi.SnapshotInfo{}, err
	}
	return SnapshotInfo(m), nil
}

// DeleteSnapshot deletes a snapshot or template: the node's copy and,
// with a blob store, the durable one (its chunks go at the next GC unless
// another snapshot uses them). NotFound when neither was there.
func (n *Node) DeleteSnapshot(ctx context.Context, ref string) error {
	defer timing.Track(ctx, "node")()
	err := n.eng.DeleteSnapshot(ctx, ref)
	if n.cfg.Sync == nil || (err != nil && !errdefs.IsNotFound(err)) {
		return err
	}
	id := ref
	if ids.Validate("snapshot ID", ref) != nil {
		return err // a name: only the node's copy had it
	}
	durable, derr := n.cfg.Sync.Durable(ctx, id)
	if derr != nil {
		return derr
	}
	if !durable {
		return err
	}
	return n.cfg.Sync.Delete(ctx, id)
}

// ensure gives the node a snapshot it does not hold but the blob store
// has (ref must then be its ID). Templates by name and snapshots held
// here need nothing; so does a node without a blob store.
func (n *Node) ensure(ctx context.Context, ref string, peers []string) error {
	if n.cfg.Sync == nil || ref == "" {
		return nil
	}
	if _, err := n.eng.Snapshots().Get(ref); err == nil || !errdefs.IsNotFound(err) {
		return nil // held, or an error the engine reports itself
	}
	if ids.Validate("snapshot ID", ref) != nil {
		return nil // a name: the engine says not found
	}
	urls := make([]string, 0, len(peers))
	for _, p := range peers {
		if p != "" && p != n.cfg.Addr {
			urls = append(urls, n.peerScheme()+"://"+p)
		}
	}
	_, err := n.cfg.Sync.Ensure(ctx, ref, urls)
	if errdefs.IsNotFound(err) {
		return nil // nowhere: the engine's own not-found answers
	}
	return err
}

// Upload makes a snapshot durable in the blob store.
func (n *Node) Upload(ctx context.Context, ref string) (nodeapi.UploadInfo, error) {
	defer timing.Track(ctx, "node")()
	if n.cfg.Sync == nil {
		return nodeapi.UploadInfo{}, errdefs.Conflictf("node %s has no blob store: its snapshots stay on its disk", n.cfg.ID)
	}
	res, err := n.cfg.Sync.Upload(ctx, ref)
	if err != nil {
		return nodeapi.UploadInfo{}, err
	}
	return nodeapi.UploadInfo{TotalBytes: res.TotalBytes, StoredBytes: res.StoredBytes}, nil
}

// Snapshots lists what the node holds.
func (n *Node) Snapshots(ctx context.Context) ([]nodeapi.SnapshotInfo, error) {
	defer timing.Track(ctx, "node")()
	list := n.eng.Snapshots().List()
	out := make([]nodeapi.SnapshotInfo, len(list))
	for i, m := range list {
		out[i] = SnapshotInfo(m)
	}
	return out, nil
}

// SetPolicy replaces a sandbox's egress policy.
func (n *Node) SetPolicy(ctx context.Context, id string, p nodeapi.Policy) error {
	defer timing.Track(ctx, "node")()
	return n.eng.SetPolicy(ctx, id, *toNetPolicy(&p))
}

// Reconfigure gives a running sandbox a new environment and policy.
func (n *Node) Reconfigure(ctx context.Context, id string, env []string, p *nodeapi.Policy) (nodeapi.Sandbox, error) {
	defer timing.Track(ctx, "node")()
	es, err := n.eng.Reconfigure(ctx, id, env, toNetPolicy(p))
	if err != nil {
		return nodeapi.Sandbox{}, err
	}
	return Sandbox(es), nil
}

// Stats reads a sandbox's resource use.
func (n *Node) Stats(ctx context.Context, id string) (nodeapi.Stats, error) {
	defer timing.Track(ctx, "node")()
	st, err := n.eng.Stats(ctx, id)
	if err != nil {
		return nodeapi.Stats{}, err
	}
	return nodeapi.Stats{At: st.At, CPUUsage: st.CPUUsage, MemoryBytes: st.MemoryBytes, MemoryLimit: st.MemoryLimit,
		DiskBytes: st.DiskBytes, DiskLimit: st.DiskLimit}, nil
}

// StatsHistory lists the samples of a sandbox's resource use the engine
// keeps.
func (n *Node) StatsHistory(ctx context.Context, id string, start, end time.Time) ([]nodeapi.StatsSample, error) {
	defer timing.Track(ctx, "node")()
	if err := ids.Validate("sandbox ID", id); err != nil {
		return nil, err
	}
	h, err := n.eng.StatsHistory(id, start, end)
	if err != nil {
		return nil, err
	}
	out := make([]nodeapi.StatsSample, 0, len(h))
	for _, s := range h {
		out = append(out, nodeapi.StatsSample{At: s.At, CPUPct: s.CPUPct, VCPUs: s.VCPUs, MemoryBytes: s.MemoryBytes,
			MemoryLimit: s.MemoryLimit, DiskBytes: s.DiskBytes})
	}
	return out, nil
}

// eventBuffer is how many events a slow subscriber may lag before it
// misses some (events are hints: it then reconciles with List).
const eventBuffer = 1024

// Events streams deaths, hibernations under memory pressure and finished
// operations until ctx ends.
func (n *Node) Events(ctx context.Context) (<-chan nodeapi.Event, error) {
	ch := make(chan nodeapi.Event, eventBuffer)
	n.mu.Lock()
	n.subs[ch] = struct{}{}
	n.mu.Unlock()
	go func() {
		<-ctx.Done()
		n.mu.Lock()
		delete(n.subs, ch)
		close(ch)
		n.mu.Unlock()
	}()
	return ch, nil
}

func (n *Node) publish(ev nodeapi.Event) {
	n.mu.Lock()
	defer n.mu.Unlock()
	for ch := range n.subs {
		select {
		case ch <- ev:
		default: // full: the subscriber lags; it misses this one
		}
	}
}

func (n *Node) opDone(op, id string, err error) {
	n.mu.Lock()
	none := len(n.subs) == 0
	n.mu.Unlock()
	if none {
		return
	}
	ev := nodeapi.Event{Kind: nodeapi.EventOpDone, SandboxID: id, Op: op, At: time.Now().UTC()}
	if err != nil {
		ev.Err = err.Error()
	}
	n.publish(ev)
}

// Sandbox converts the engine's view.
func Sandbox(es engine.Sandbox) nodeapi.Sandbox {
	sb := nodeapi.Sandbox{ID: es.ID, State: string(es.State), Template: es.Template, Parent: es.Parent,
		AccessToken: es.Run.AccessToken, Limits: limits(es.Run.Limits.VCPUs, es.Run.Limits.MemoryMB, es.Run.Limits.DiskMB, es.Run.Limits.MaxProcs),
		Policy: nodeapi.Policy{Internet: es.Policy.Internet, Allow: es.Policy.Allow, Deny: es.Policy.Deny, AllowDomains: es.Policy.AllowDomains, DenyDomains: es.Policy.DenyDomains},
		Env:    es.Run.Env, CreatedAt: es.CreatedAt, Hibernation: es.Hibernation,
		RulesLoaded: es.Policy.CA != nil || len(es.Policy.Inject) > 0}
	if es.Addr.IsValid() {
		sb.Addr = es.Addr.String()
	}
	if es.Death != nil {
		sb.Death = &nodeapi.Death{Reason: string(es.Death.Reason), Detail: es.Death.Detail, At: es.Death.At}
	}
	return sb
}

func limits(vcpus float64, mem, disk, procs int64) nodeapi.Limits {
	return nodeapi.Limits{VCPUs: vcpus, MemoryMB: mem, DiskMB: disk, MaxProcs: procs}
}

// SnapshotInfo converts a manifest.
func SnapshotInfo(m snapshot.Manifest) nodeapi.SnapshotInfo {
	l := m.Run.Limits
	return nodeapi.SnapshotInfo{ID: m.ID, Names: m.Names, Kind: string(m.Kind), Template: m.Template, Origin: m.Origin,
		Parent: m.Parent, CreatedAt: m.CreatedAt, SizeBytes: m.SizeBytes, Limits: limits(l.VCPUs, l.MemoryMB, l.DiskMB, l.MaxProcs), Copy: m.Copy}
}

func toNetPolicy(p *nodeapi.Policy) *netns.Policy {
	if p == nil {
		return nil
	}
	np := &netns.Policy{Internet: p.Internet, Allow: p.Allow, Deny: p.Deny, AllowDomains: p.AllowDomains, DenyDomains: p.DenyDomains}
	for _, in := range p.Inject {
		e := egress.Injection{Pattern: in.Pattern}
		for _, h := range in.Headers {
			e.Headers = append(e.Headers, egress.Header{Name: h.Name, Value: h.Value})
		}
		np.Inject = append(np.Inject, e)
	}
	if p.CA != nil {
		np.CA = &egress.CA{CertPEM: p.CA.CertPEM, KeyPEM: p.CA.KeyPEM}
	}
	return np
}

// CollectGarbage runs a GC over the node's blob store.
func (n *Node) CollectGarbage(ctx context.Context, req nodeapi.GCRequest) (nodeapi.GCReport, error) {
	defer timing.Track(ctx, "node")()
	if n.cfg.Sync == nil {
		return nodeapi.GCReport{}, errdefs.Conflictf("node %s has no blob store", n.cfg.ID)
	}
	// The sweep's budget: half the grace, but at least 30 s, so a short
	// grace does not cut a big sweep short (Packs wait at most that long
	// for a run that was killed).
	budget := min(max(req.Grace/2, 30*time.Second), 10*time.Minute)
	rep, err := chunk.GC(ctx, n.cfg.Sync.Store(), chunk.GCOptions{Grace: req.Grace, Budget: budget, DryRun: req.DryRun})
	if err != nil {
		return nodeapi.GCReport{}, err
	}
	return nodeapi.GCReport{DeletedChunks: int64(rep.Deleted), FreedBytes: rep.FreedBytes, KeptChunks: int64(rep.Kept),
		YoungChunks: int64(rep.Young), Manifests: int64(rep.Manifests)}, nil
}

// Adopt takes over a sandbox hibernated on another node.
func (n *Node) Adopt(ctx context.Context, req nodeapi.AdoptRequest) (nodeapi.Sandbox, error) {
	defer timing.Track(ctx, "node")()
	if n.cfg.Sync == nil {
		return nodeapi.Sandbox{}, errdefs.Conflictf("node %s has no blob store: it cannot take over sandboxes of other nodes", n.cfg.ID)
	}
	if err := ids.Validate("sandbox ID", req.SandboxID); err != nil {
		return nodeapi.Sandbox{}, err
	}
	if err := ids.Validate("snapshot ID", req.Hibernation); err != nil {
		return nodeapi.Sandbox{}, err
	}
	if err := n.ensure(ctx, req.Hibernation, req.Peers); err != nil {
		return nodeapi.Sandbox{}, err
	}
	p := netns.Policy{Internet: true}
	if req.Policy != nil {
		p = *toNetPolicy(req.Policy)
	}
	es, err := n.eng.Adopt(ctx, req.SandboxID, req.Hibernation, p)
	n.opDone("adopt", req.SandboxID, err)
	if err != nil {
		return nodeapi.Sandbox{}, err
	}
	return Sandbox(es), nil
}

// BuildImage builds template req.Name from an OCI image. The request is
// checked here first, so a malformed one is ErrInvalidArgument on any
// node, one that builds images or not.
func (n *Node) BuildImage(ctx context.Context, req nodeapi.ImageBuildRequest) (nodeapi.SnapshotInfo, error) {
	defer timing.Track(ctx, "node")()
	if err := ids.ValidateName("template name", req.Name); err != nil {
		return nodeapi.SnapshotInfo{}, err
	}
	if _, err := name.ParseReference(req.Ref); err != nil {
		return nodeapi.SnapshotInfo{}, errdefs.Invalidf("template %s: image reference %q: %v", req.Name, req.Ref, err)
	}
	if (req.Username == "") != (req.Password == "") {
		return nodeapi.SnapshotInfo{}, errdefs.Invalidf("template %s: registry auth needs both a username and a password", req.Name)
	}
	if n.cfg.Images == nil {
		return nodeapi.SnapshotInfo{}, errdefs.Conflictf("node %s does not build templates from images", n.cfg.ID)
	}
	m, err := n.cfg.Images.BuildImage(ctx, node.ImageTemplateSpec{Name: req.Name, Ref: req.Ref,
		Registry: oci.Options{Username: req.Username, Password: req.Password, Platform: req.Platform}})
	if err != nil {
		return nodeapi.SnapshotInfo{}, err
	}
	return SnapshotInfo(m), nil
}

// Export writes a sandbox's filesystem as an OCI image. The request is
// checked here first, so a malformed one is ErrInvalidArgument on any
// node.
func (n *Node) Export(ctx context.Context, req nodeapi.ExportRequest) (nodeapi.ExportInfo, error) {
	defer timing.Track(ctx, "node")()
	if err := ids.Validate("sandbox ID", req.SandboxID); err != nil {
		return nodeapi.ExportInfo{}, err
	}
	dests := 0
	for _, d := range []string{req.Ref, req.LayoutDir, req.BlobKey} {
		if d != "" {
			dests++
		}
	}
	if dests != 1 {
		return nodeapi.ExportInfo{}, errdefs.Invalidf("export %s: give one of a registry reference, a layout directory or a blob key", req.SandboxID)
	}
	if req.BlobKey != "" {
		if err := blob.CheckKey(req.BlobKey); err != nil {
			return nodeapi.ExportInfo{}, fmt.Errorf("export %s: %w", req.SandboxID, err)
		}
	}
	if req.Ref != "" {
		if _, err := name.ParseReference(req.Ref); err != nil {
			return nodeapi.ExportInfo{}, errdefs.Invalidf("export %s: image reference %q: %v", req.SandboxID, req.Ref, err)
		}
	}
	if (req.Username == "") != (req.Password == "") {
		return nodeapi.ExportInfo{}, errdefs.Invalidf("export %s: registry auth needs both a username and a password", req.SandboxID)
	}
	ex, ok := n.cfg.Images.(Exporter)
	if !ok {
		return nodeapi.ExportInfo{}, errdefs.Conflictf("node %s does not export sandboxes as images", n.cfg.ID)
	}
	res, err := ex.Export(ctx, node.ExportSpec{SandboxID: req.SandboxID, Ref: req.Ref, LayoutDir: req.LayoutDir, BlobKey: req.BlobKey,
		Registry: oci.Options{Username: req.Username, Password: req.Password}})
	if err != nil {
		return nodeapi.ExportInfo{}, err
	}
	return nodeapi.ExportInfo{Ref: res.Ref, Digest: res.Digest, Layers: res.Layers, Bytes: res.Bytes, DiffBytes: res.DiffBytes,
		Changed: int64(res.Changed), Deleted: int64(res.Deleted), LayoutBytes: res.LayoutBytes}, nil
}

// EgressAudit returns a sandbox's recorded outbound connection attempts.
func (n *Node) EgressAudit(ctx context.Context, id string, since time.Time, limit int) ([]nodeapi.EgressEntry, error) {
	if err := ids.Validate("sandbox ID", id); err != nil {
		return nil, err
	}
	a, ok := n.cfg.Images.(EgressAuditor)
	if !ok {
		return nil, errdefs.Conflictf("node %s does not audit egress", n.cfg.ID)
	}
	es, err := a.EgressAudit(ctx, id, since, limit)
	if err != nil {
		return nil, err
	}
	out := make([]nodeapi.EgressEntry, len(es))
	for i, e := range es {
		out[i] = nodeapi.EgressEntry{At: e.At, End: e.End, Proto: e.Proto, Dst: e.Dst, Domain: e.Domain, Allowed: e.Allowed,
			Rule: e.Rule, Reason: e.Reason, BytesOut: e.BytesOut, BytesIn: e.BytesIn, Open: e.Open}
	}
	return out, nil
}

func (n *Node) peerScheme() string {
	if n.cfg.PeerScheme == "" {
		return "http"
	}
	return n.cfg.PeerScheme
}

// VolumeDeleter removes a volume's content from the node
// (node.Node.DeleteVolume); a node without it stores none.
type VolumeDeleter interface {
	DeleteVolume(ctx context.Context, volumeID string) error
}

// DeleteVolume removes a volume's content from the node.
func (n *Node) DeleteVolume(ctx context.Context, volumeID string) error {
	defer timing.Track(ctx, "node")()
	if err := ids.Validate("volume ID", volumeID); err != nil {
		return err
	}
	vd, ok := n.cfg.Images.(VolumeDeleter)
	if !ok {
		return nil
	}
	return vd.DeleteVolume(ctx, volumeID)
}

// VolumeUsager reports a volume's usage on the node
// (node.Node.VolumeUsage); a node without it stores none.
type VolumeUsager interface {
	VolumeUsage(ctx context.Context, volumeID string) (nodeapi.VolumeUsage, error)
}

// VolumeUsage is a volume's bytes in use and its capacity on the node.
func (n *Node) VolumeUsage(ctx context.Context, volumeID string) (nodeapi.VolumeUsage, error) {
	defer timing.Track(ctx, "node")()
	if err := ids.Validate("volume ID", volumeID); err != nil {
		return nodeapi.VolumeUsage{}, err
	}
	vu, ok := n.cfg.Images.(VolumeUsager)
	if !ok {
		return nodeapi.VolumeUsage{}, errdefs.NotFoundf("volume %s: this node stores no volumes", volumeID)
	}
	return vu.VolumeUsage(ctx, volumeID)
}

// prepareVolumes has the node make and mount a create's volumes.
func (n *Node) prepareVolumes(ctx context.Context, mounts []nodeapi.VolumeMount) ([]engine.Volume, error) {
	if len(mounts) == 0 {
		return nil, nil
	}
	vp, ok := n.cfg.Images.(VolumePreparer)
	if !ok {
		return nil, fmt.Errorf("%w: node %s cannot mount volumes", errdefs.ErrConflict, n.cfg.ID)
	}
	return vp.PrepareVolumes(ctx, mounts)
}

// FileTree lists a running sandbox's filesystem.
func (n *Node) FileTree(ctx context.Context, id string) ([]nodeapi.FileEntry, error) {
	defer timing.Track(ctx, "node")()
	if err := ids.Validate("sandbox ID", id); err != nil {
		return nil, err
	}
	fr, ok := n.cfg.Images.(FileReader)
	if !ok {
		return nil, errdefs.Conflictf("node %s does not read sandboxes' files", n.cfg.ID)
	}
	return fr.FileTree(ctx, id)
}

// ReadFiles reads regular files of a running sandbox. The request is
// checked here first, so a malformed one is ErrInvalidArgument on any
// node.
func (n *Node) ReadFiles(ctx context.Context, id string, paths []string) ([]nodeapi.FileData, error) {
	defer timing.Track(ctx, "node")()
	if err := ids.Validate("sandbox ID", id); err != nil {
		return nil, err
	}
	if err := node.CheckReadPaths(paths); err != nil {
		return nil, err
	}
	fr, ok := n.cfg.Images.(FileReader)
	if !ok {
		return nil, errdefs.Conflictf("node %s does not read sandboxes' files", n.cfg.ID)
	}
	return fr.ReadFiles(ctx, id, paths)
}

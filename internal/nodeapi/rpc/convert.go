package rpc

import (
	"fmt"
	"math"
	"net/netip"
	"time"

	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/spore-run/spore/internal/egress"
	"github.com/spore-run/spore/internal/errdefs"
	"github.com/spore-run/spore/internal/nodeapi"
	nodev1 "github.com/spore-run/spore/proto/gen/node/v1"
)

// Conversions between the contract's types and their messages. A zero
// time travels as an unset timestamp, so it comes back zero.

func ts(t time.Time) *timestamppb.Timestamp {
	if t.IsZero() {
		return nil
	}
	return timestamppb.New(t)
}

func fromTS(t *timestamppb.Timestamp) time.Time {
	if t == nil {
		return time.Time{}
	}
	return t.AsTime()
}

func resourcesPB(r nodeapi.Resources) *nodev1.Resources {
	return &nodev1.Resources{MemoryMb: r.MemoryMB, Vcpus: r.VCPUs, Sandboxes: int64(r.Sandboxes)}
}

func resources(r *nodev1.Resources) nodeapi.Resources {
	return nodeapi.Resources{MemoryMB: r.GetMemoryMb(), VCPUs: r.GetVcpus(), Sandboxes: int(r.GetSandboxes())}
}

func limitsPB(l nodeapi.Limits) *nodev1.Limits {
	return &nodev1.Limits{Vcpus: l.VCPUs, MemoryMb: l.MemoryMB, DiskMb: l.DiskMB, MaxProcs: l.MaxProcs}
}

func limits(l *nodev1.Limits) nodeapi.Limits {
	return nodeapi.Limits{VCPUs: l.GetVcpus(), MemoryMB: l.GetMemoryMb(), DiskMB: l.GetDiskMb(), MaxProcs: l.GetMaxProcs()}
}

func prefixStrings(ps []netip.Prefix) []string {
	if len(ps) == 0 {
		return nil
	}
	out := make([]string, len(ps))
	for i, p := range ps {
		out[i] = p.String()
	}
	return out
}

func parsePrefixes(what string, ss []string) ([]netip.Prefix, error) {
	if len(ss) == 0 {
		return nil, nil
	}
	out := make([]netip.Prefix, len(ss))
	for i, s := range ss {
		p, err := netip.ParsePrefix(s)
		if err != nil {
			return nil, errdefs.Invalidf("policy %s entry %q: not a CIDR prefix", what, s)
		}
		out[i] = p
	}
	return out, nil
}

func policyPB(p nodeapi.Policy) *nodev1.Policy {
	// Domain entries travel in the same string lists as the prefixes (a
	// domain never parses as one): no change to the wire format.
	pb := &nodev1.Policy{Internet: p.Internet, Allow: append(prefixStrings(p.Allow), p.AllowDomains...), Deny: append(prefixStrings(p.Deny), p.DenyDomains...)}
	for _, in := range p.Inject {
		e := &nodev1.Injection{Pattern: in.Pattern}
		for _, h := range in.Headers {
			e.Headers = append(e.Headers, &nodev1.Header{Name: h.Name, Value: h.Value})
		}
		pb.Inject = append(pb.Inject, e)
	}
	if p.CA != nil {
		pb.CaCert, pb.CaKey = p.CA.CertPEM, p.CA.KeyPEM
	}
	return pb
}

// splitEntries parses a policy list: prefixes, and domain entries kept as
// they came (the node validates them).
func splitEntries(what string, ss []string) ([]netip.Prefix, []string, error) {
	var prefixes, domains []string
	for _, s := range ss {
		if egress.IsDomain(s) {
			domains = append(domains, s)
		} else {
			prefixes = append(prefixes, s)
		}
	}
	out, err := parsePrefixes(what, prefixes)
	return out, domains, err
}

// policy parses a policy; nil stays nil (unset).
func policy(p *nodev1.Policy) (*nodeapi.Policy, error) {
	if p == nil {
		return nil, nil
	}
	allow, allowDomains, err := splitEntries("allow", p.GetAllow())
	if err != nil {
		return nil, err
	}
	deny, denyDomains, err := splitEntries("deny", p.GetDeny())
	if err != nil {
		return nil, err
	}
	out := &nodeapi.Policy{Internet: p.GetInternet(), Allow: allow, Deny: deny, AllowDomains: allowDomains, DenyDomains: denyDomains}
	for _, in := range p.GetInject() {
		e := nodeapi.Injection{Pattern: in.GetPattern()}
		for _, h := range in.GetHeaders() {
			e.Headers = append(e.Headers, nodeapi.Header{Name: h.GetName(), Value: h.GetValue()})
		}
		out.Inject = append(out.Inject, e)
	}
	if len(p.GetCaCert()) > 0 || len(p.GetCaKey()) > 0 {
		out.CA = &nodeapi.CA{CertPEM: p.GetCaCert(), KeyPEM: p.GetCaKey()}
	}
	return out, nil
}

func policyOrNil(p *nodeapi.Policy) *nodev1.Policy {
	if p == nil {
		return nil
	}
	return policyPB(*p)
}

func sandboxPB(s nodeapi.Sandbox) *nodev1.Sandbox {
	out := &nodev1.Sandbox{Id: s.ID, State: s.State, Template: s.Template, Parent: s.Parent, Addr: s.Addr,
		AccessToken: s.AccessToken, Limits: limitsPB(s.Limits), Policy: policyPB(s.Policy), Env: s.Env, CreatedAt: ts(s.CreatedAt), Hibernation: s.Hibernation,
		RulesLoaded: s.RulesLoaded}
	if s.Death != nil {
		out.Death = &nodev1.Death{Reason: s.Death.Reason, Detail: s.Death.Detail, At: ts(s.Death.At)}
	}
	return out
}

func sandbox(s *nodev1.Sandbox) (nodeapi.Sandbox, error) {
	p, err := policy(s.GetPolicy())
	if err != nil {
		return nodeapi.Sandbox{}, fmt.Errorf("sandbox %s from the node: %w", s.GetId(), err)
	}
	out := nodeapi.Sandbox{ID: s.GetId(), State: s.GetState(), Template: s.GetTemplate(), Parent: s.GetParent(), Addr: s.GetAddr(),
		AccessToken: s.GetAccessToken(), Limits: limits(s.GetLimits()), Env: s.GetEnv(), CreatedAt: fromTS(s.GetCreatedAt()), Hibernation: s.GetHibernation(),
		RulesLoaded: s.GetRulesLoaded()}
	if p != nil {
		out.Policy = *p
	}
	if d := s.GetDeath(); d != nil {
		out.Death = &nodeapi.Death{Reason: d.GetReason(), Detail: d.GetDetail(), At: fromTS(d.GetAt())}
	}
	return out, nil
}

func snapshotPB(m nodeapi.SnapshotInfo) *nodev1.SnapshotInfo {
	return &nodev1.SnapshotInfo{Id: m.ID, Names: m.Names, Kind: m.Kind, Template: m.Template, Origin: m.Origin, Parent: m.Parent,
		CreatedAt: ts(m.CreatedAt), SizeBytes: m.SizeBytes, Limits: limitsPB(m.Limits), Copy: m.Copy}
}

func snapshotInfo(m *nodev1.SnapshotInfo) nodeapi.SnapshotInfo {
	return nodeapi.SnapshotInfo{ID: m.GetId(), Names: m.GetNames(), Kind: m.GetKind(), Template: m.GetTemplate(), Origin: m.GetOrigin(),
		Parent: m.GetParent(), CreatedAt: fromTS(m.GetCreatedAt()), SizeBytes: m.GetSizeBytes(), Limits: limits(m.GetLimits()), Copy: m.GetCopy()}
}

func infoPB(i nodeapi.NodeInfo) *nodev1.InfoResponse {
	return &nodev1.InfoResponse{Id: i.ID, Addr: i.Addr, Capacity: resourcesPB(i.Capacity), Reserved: resourcesPB(i.Reserved),
		RunscBuild: i.RunscBuild, CpuFeatures: i.CPUFeatures, Labels: i.Labels, Templates: i.Templates,
		Overcommit: &nodev1.Overcommit{Memory: i.Overcommit.Memory, Vcpus: i.Overcommit.VCPUs}, Durable: i.Durable,
		MemoryFreeMb: i.MemoryFreeMB, LaunchesQueued: int32(min(i.LaunchesQueued, math.MaxInt32))}
}

func info(i *nodev1.InfoResponse) nodeapi.NodeInfo {
	return nodeapi.NodeInfo{ID: i.GetId(), Addr: i.GetAddr(), Capacity: resources(i.GetCapacity()), Reserved: resources(i.GetReserved()),
		RunscBuild: i.GetRunscBuild(), CPUFeatures: i.GetCpuFeatures(), Labels: i.GetLabels(), Templates: i.GetTemplates(),
		Overcommit: nodeapi.Overcommit{Memory: i.GetOvercommit().GetMemory(), VCPUs: i.GetOvercommit().GetVcpus()}, Durable: i.GetDurable(),
		MemoryFreeMB: i.MemoryFreeMb, LaunchesQueued: max(int(i.GetLaunchesQueued()), 0)}
}

func statsPB(s nodeapi.Stats) *nodev1.StatsResponse {
	return &nodev1.StatsResponse{At: ts(s.At), CpuUsage: durationpb.New(s.CPUUsage), MemoryBytes: s.MemoryBytes,
		MemoryLimit: s.MemoryLimit, DiskBytes: s.DiskBytes, DiskLimit: s.DiskLimit}
}

func stats(s *nodev1.StatsResponse) nodeapi.Stats {
	return nodeapi.Stats{At: fromTS(s.GetAt()), CPUUsage: s.GetCpuUsage().AsDuration(), MemoryBytes: s.GetMemoryBytes(),
		MemoryLimit: s.GetMemoryLimit(), DiskBytes: s.GetDiskBytes(), DiskLimit: s.GetDiskLimit()}
}

func statsSamplesPB(in []nodeapi.StatsSample) *nodev1.StatsHistoryResponse {
	out := &nodev1.StatsHistoryResponse{Samples: make([]*nodev1.StatsSample, 0, len(in))}
	for _, s := range in {
		out.Samples = append(out.Samples, &nodev1.StatsSample{At: ts(s.At), CpuPct: s.CPUPct, Vcpus: s.VCPUs,
			MemoryBytes: s.MemoryBytes, MemoryLimit: s.MemoryLimit, DiskBytes: s.DiskBytes})
	}
	return out
}

func statsSamples(in *nodev1.StatsHistoryResponse) []nodeapi.StatsSample {
	out := make([]nodeapi.StatsSample, 0, len(in.GetSamples()))
	for _, s := range in.GetSamples() {
		out = append(out, nodeapi.StatsSample{At: fromTS(s.GetAt()), CPUPct: s.GetCpuPct(), VCPUs: s.GetVcpus(),
			MemoryBytes: s.GetMemoryBytes(), MemoryLimit: s.GetMemoryLimit(), DiskBytes: s.GetDiskBytes()})
	}
	return out
}

func eventPB(e nodeapi.Event) *nodev1.Event {
	return &nodev1.Event{Kind: e.Kind, SandboxId: e.SandboxID, Op: e.Op, Reason: e.Reason, Detail: e.Detail, Err: e.Err, At: ts(e.At)}
}

func event(e *nodev1.Event) nodeapi.Event {
	return nodeapi.Event{Kind: e.GetKind(), SandboxID: e.GetSandboxId(), Op: e.GetOp(), Reason: e.GetReason(), Detail: e.GetDetail(),
		Err: e.GetErr(), At: fromTS(e.GetAt())}
}

func fileEntriesPB(in []nodeapi.FileEntry) *nodev1.FileTreeResponse {
	out := &nodev1.FileTreeResponse{Entries: make([]*nodev1.FileEntry, len(in))}
	for i, e := range in {
		out.Entries[i] = &nodev1.FileEntry{Path: e.Path, Type: e.Type, Mode: e.Mode, Uid: e.UID, Gid: e.GID, Size: e.Size, Mtime: ts(e.Mtime), Link: e.Link}
	}
	return out
}

func fileEntries(in *nodev1.FileTreeResponse) []nodeapi.FileEntry {
	out := make([]nodeapi.FileEntry, len(in.GetEntries()))
	for i, e := range in.GetEntries() {
		out[i] = nodeapi.FileEntry{Path: e.GetPath(), Type: e.GetType(), Mode: e.GetMode(), UID: e.GetUid(), GID: e.GetGid(), Size: e.GetSize(),
			Mtime: fromTS(e.GetMtime()), Link: e.GetLink()}
	}
	return out
}

func fileDataPB(in []nodeapi.FileData) *nodev1.ReadFilesResponse {
	out := &nodev1.ReadFilesResponse{Files: make([]*nodev1.FileData, len(in))}
	for i, f := range in {
		out.Files[i] = &nodev1.FileData{Path: f.Path, Size: f.Size, Data: f.Data, Missing: f.Missing, HasData: f.Data != nil}
	}
	return out
}

func fileData(in *nodev1.ReadFilesResponse) []nodeapi.FileData {
	out := make([]nodeapi.FileData, len(in.GetFiles()))
	for i, f := range in.GetFiles() {
		out[i] = nodeapi.FileData{Path: f.GetPath(), Size: f.GetSize(), Missing: f.GetMissing()}
		if f.GetHasData() {
			out[i].Data = append([]byte{}, f.GetData()...)
		}
	}
	return out
}

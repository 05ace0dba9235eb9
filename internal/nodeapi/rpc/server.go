// Package rpc carries the node contract (nodeapi.Node) over Connect-RPC
// (proto/node/v1): NewHandler serves a node to control planes, NewClient
// is a nodeapi.Node that calls one. Both ends keep the contract: the same
// errdefs kinds (errors.go), the same idempotency (the IDs in the
// requests), deadlines carried by Connect's timeout header.
//
// # Authentication
//
// A fleet authenticates with mutual TLS (internal/fleetauth): the node's
// listener requires a client certificate of the fleet CA, and
// NewFleetHandler serves the protocol only to a caller whose certificate
// names an API replica (spore://replica/<name>); a client (NewClient over
// HTTPClient(f.ClientTLS(fleetauth.IsNode(id)))) checks that it reached
// node id. In an insecure fleet (--insecure-fleet), and in tests,
// NewHandler serves holders of the cluster token instead
// (`Authorization: Bearer <token>`), over cleartext. Either way the handler
// checks twice: before Connect reads the request at all (so an
// unauthenticated caller gets nothing decoded, and no path of the listener
// answers it), and in an interceptor on every procedure (so a handler
// mounted without the outer wrapper is still closed). A refused caller gets
// CodeUnauthenticated; an empty or short token is refused when the handler
// is built, so no node ever answers an unauthenticated caller.
//
// # Transport
//
// HTTP/2 over TLS 1.3 in a fleet with certificates; over cleartext (h2c,
// prior knowledge) only in an insecure fleet: Server and HTTPClient set
// both up.
package rpc

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"net/http"
	"strings"
	"time"

	"connectrpc.com/connect"

	"github.com/spore-run/spore/internal/errdefs"
	"github.com/spore-run/spore/internal/fleetauth"
	"github.com/spore-run/spore/internal/nodeapi"
	nodev1 "github.com/spore-run/spore/proto/gen/node/v1"
	"github.com/spore-run/spore/proto/gen/node/v1/nodev1connect"
)

// MinTokenLen is the shortest cluster token a handler accepts (ids'
// tokens are 48 hex characters).
const MinTokenLen = 16

// MaxRequestBytes bounds a request message (the largest, a fork of
// MaxFork children or a reconfigure's environment, is a few KiB).
const MaxRequestBytes = 4 << 20

var errUnauthenticated = errors.New("not a fleet member allowed to call this node (missing or wrong cluster token, or no replica certificate)")

// checkToken refuses a cluster token that would not protect a node.
func checkToken(token string) error {
	if token == "" {
		return errdefs.Invalidf("node protocol: an empty cluster token would let anyone in")
	}
	if len(token) < MinTokenLen {
		return errdefs.Invalidf("node protocol: the cluster token is %d characters, want at least %d", len(token), MinTokenLen)
	}
	if strings.ContainsAny(token, " \t\r\n") {
		return errdefs.Invalidf("node protocol: the cluster token holds white space")
	}
	return nil
}

// guard admits the callers of the node protocol: API replicas (a fleet
// certificate of role replica) or, in an insecure fleet, holders of the
// cluster token. The outer wrapper puts the caller's identity in the
// request's context; the interceptor refuses a call without one (or,
// insecure, without the token in its own header), so a handler mounted
// without the wrapper is still closed.
type guard struct{ f *fleetauth.Fleet }

func (g guard) admitted(ctx context.Context, h http.Header) bool {
	if _, ok := fleetauth.FromContext(ctx); ok {
		return true
	}
	return g.f.TokenOK(h)
}

func unauthenticated() error {
	return connect.NewError(connect.CodeUnauthenticated, errUnauthenticated)
}

// WrapUnary checks a unary call.
func (g guard) WrapUnary(next connect.UnaryFunc) connect.UnaryFunc {
	return func(ctx context.Context, req connect.AnyRequest) (connect.AnyResponse, error) {
		if !g.admitted(ctx, req.Header()) {
			return nil, unauthenticated()
		}
		return next(ctx, req)
	}
}

// WrapStreamingClient is the client side: nothing to check.
func (g guard) WrapStreamingClient(next connect.StreamingClientFunc) connect.StreamingClientFunc {
	return next
}

// WrapStreamingHandler checks a streaming call before it runs.
func (g guard) WrapStreamingHandler(next connect.StreamingHandlerFunc) connect.StreamingHandlerFunc {
	return func(ctx context.Context, conn connect.StreamingHandlerConn) error {
		if !g.admitted(ctx, conn.RequestHeader()) {
			return unauthenticated()
		}
		return next(ctx, conn)
	}
}

// NewHandler serves node under the path it returns (mount the handler
// there, e.g. mux.Handle(path, h)) to holders of the cluster token, over
// cleartext (an insecure fleet, and tests); opts are added after the
// authentication interceptor.
func NewHandler(node nodeapi.Node, token string, opts ...connect.HandlerOption) (string, http.Handler, error) {
	if err := checkToken(token); err != nil {
		return "", nil, err
	}
	f, err := fleetauth.Insecure(token, nil)
	if err != nil {
		return "", nil, err
	}
	return NewFleetHandler(node, f, opts...)
}

// NewFleetHandler serves node to the replicas of fleet f (mutual TLS: the
// listener's TLS is f.ServerTLS), or to holders of its token when f is
// insecure. Callers it does not admit get Connect's Unauthenticated, and
// nothing of their request is decoded.
func NewFleetHandler(node nodeapi.Node, f *fleetauth.Fleet, opts ...connect.HandlerOption) (string, http.Handler, error) {
	h, err := newFleetHandler(node, f, opts...)
	if err != nil {
		return "", nil, err
	}
	ew := connect.NewErrorWriter()
	replicas := fleetauth.Roles(fleetauth.RoleReplica)
	return "/" + nodev1connect.NodeName + "/", http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		id, ok := f.Admit(r, false, replicas)
		if !ok {
			if ew.IsSupported(r) {
				_ = ew.Write(w, r, unauthenticated())
			} else {
				http.Error(w, errUnauthenticated.Error(), http.StatusUnauthorized)
			}
			return
		}
		h.ServeHTTP(w, r.WithContext(fleetauth.WithIdentity(r.Context(), id)))
	}), nil
}

// newHandler is the Connect handler of a token fleet with only the
// interceptor's check.
func newHandler(node nodeapi.Node, token string, opts ...connect.HandlerOption) (http.Handler, error) {
	if err := checkToken(token); err != nil {
		return nil, err
	}
	f, err := fleetauth.Insecure(token, nil)
	if err != nil {
		return nil, err
	}
	return newFleetHandler(node, f, opts...)
}

// newFleetHandler is the Connect handler with only the interceptor's
// check.
func newFleetHandler(node nodeapi.Node, f *fleetauth.Fleet, opts ...connect.HandlerOption) (http.Handler, error) {
	if node == nil {
		return nil, errdefs.Invalidf("node protocol: no node to serve")
	}
	all := append([]connect.HandlerOption{
		connect.WithInterceptors(guard{f}, serverTiming{}, serverTeam),
		connect.WithReadMaxBytes(MaxRequestBytes),
		// Small messages on a private network: compressing costs more
		// than it saves. Big lists still get gzip when asked for.
		connect.WithCompressMinBytes(64 << 10),
	}, opts...)
	_, h := nodev1connect.NewNodeHandler(&server{node: node}, all...)
	return h, nil
}

// Server is an http.Server for a node handler: HTTP/1.1 and HTTP/2, the
// latter over cleartext (h2c) when tlsCfg is nil, over TLS otherwise. It
// sets no write timeout: Events is a stream that lasts as long as its
// caller.
func Server(h http.Handler, tlsCfg *tls.Config) *http.Server {
	p := new(http.Protocols)
	p.SetHTTP1(true)
	if tlsCfg == nil {
		p.SetUnencryptedHTTP2(true)
	} else {
		p.SetHTTP2(true)
	}
	return &http.Server{Handler: h, Protocols: p, TLSConfig: tlsCfg, ReadHeaderTimeout: 10 * time.Second,
		HTTP2: &http.HTTP2Config{SendPingTimeout: pingEvery, PingTimeout: pingTimeout}}
}

// HTTP/2 pings on idle connections: a peer that vanished without closing
// (host down, partition) ends the Events stream within ~15 s, and the
// caller reconciles with List.
const (
	pingEvery   = 10 * time.Second
	pingTimeout = 5 * time.Second
)

// server adapts a nodeapi.Node to the generated handler interface.
type server struct{ node nodeapi.Node }

var _ nodev1connect.NodeHandler = (*server)(nil)

func ok[T any](m *T) (*connect.Response[T], error) { return connect.NewResponse(m), nil }

func (s *server) Info(ctx context.Context, _ *connect.Request[nodev1.InfoRequest]) (*connect.Response[nodev1.InfoResponse], error) {
	i, err := s.node.Info(ctx)
	if err != nil {
		return nil, toConnect(err)
	}
	return ok(infoPB(i))
}

func (s *server) Create(ctx context.Context, req *connect.Request[nodev1.CreateRequest]) (*connect.Response[nodev1.CreateResponse], error) {
	m := req.Msg
	p, err := policy(m.GetPolicy())
	if err != nil {
		return nil, toConnect(err)
	}
	sb, err := s.node.Create(ctx, nodeapi.CreateRequest{SandboxID: m.GetSandboxId(), AccessToken: m.GetAccessToken(),
		Template: m.GetTemplate(), Env: m.GetEnv(), VCPUs: m.GetVcpus(), MemoryMB: m.GetMemoryMb(), Policy: p, Peers: m.GetPeers(),
		Volumes: volumes(m.GetVolumes())})
	if err != nil {
		return nil, toConnect(err)
	}
	return ok(&nodev1.CreateResponse{Sandbox: sandboxPB(sb)})
}

func (s *server) Adopt(ctx context.Context, req *connect.Request[nodev1.AdoptRequest]) (*connect.Response[nodev1.AdoptResponse], error) {
	m := req.Msg
	p, err := policy(m.GetPolicy())
	if err != nil {
		return nil, toConnect(err)
	}
	sb, err := s.node.Adopt(ctx, nodeapi.AdoptRequest{SandboxID: m.GetSandboxId(), Hibernation: m.GetHibernation(), Policy: p, Peers: m.GetPeers()})
	if err != nil {
		return nil, toConnect(err)
	}
	return ok(&nodev1.AdoptResponse{Sandbox: sandboxPB(sb)})
}

func (s *server) Get(ctx context.Context, req *connect.Request[nodev1.GetRequest]) (*connect.Response[nodev1.GetResponse], error) {
	sb, err := s.node.Get(ctx, req.Msg.GetId())
	if err != nil {
		return nil, toConnect(err)
	}
	return ok(&nodev1.GetResponse{Sandbox: sandboxPB(sb)})
}

func (s *server) List(ctx context.Context, _ *connect.Request[nodev1.ListRequest]) (*connect.Response[nodev1.ListResponse], error) {
	list, err := s.node.List(ctx)
	if err != nil {
		return nil, toConnect(err)
	}
	out := &nodev1.ListResponse{Sandboxes: make([]*nodev1.Sandbox, len(list))}
	for i, sb := range list {
		out.Sandboxes[i] = sandboxPB(sb)
	}
	return ok(out)
}

func (s *server) Kill(ctx context.Context, req *connect.Request[nodev1.KillRequest]) (*connect.Response[nodev1.KillResponse], error) {
	if err := s.node.Kill(ctx, req.Msg.GetId()); err != nil {
		return nil, toConnect(err)
	}
	return ok(&nodev1.KillResponse{})
}

func (s *server) Pause(ctx context.Context, req *connect.Request[nodev1.PauseRequest]) (*connect.Response[nodev1.PauseResponse], error) {
	if err := s.node.Pause(ctx, req.Msg.GetId()); err != nil {
		return nil, toConnect(err)
	}
	return ok(&nodev1.PauseResponse{})
}

func (s *server) Resume(ctx context.Context, req *connect.Request[nodev1.ResumeRequest]) (*connect.Response[nodev1.ResumeResponse], error) {
	sb, err := s.node.Resume(ctx, req.Msg.GetId())
	if err != nil {
		return nil, toConnect(err)
	}
	return ok(&nodev1.ResumeResponse{Sandbox: sandboxPB(sb)})
}

func (s *server) Hibernate(ctx context.Context, req *connect.Request[nodev1.HibernateRequest]) (*connect.Response[nodev1.HibernateResponse], error) {
	if err := s.node.Hibernate(ctx, req.Msg.GetId()); err != nil {
		return nil, toConnect(err)
	}
	return ok(&nodev1.HibernateResponse{})
}

func (s *server) Quiesce(ctx context.Context, req *connect.Request[nodev1.QuiesceRequest]) (*connect.Response[nodev1.QuiesceResponse], error) {
	grace := time.Duration(req.Msg.GetGraceMs()) * time.Millisecond
	if grace < 0 || grace > nodeapi.MaxQuiesceGrace {
		return nil, toConnect(errdefs.Invalidf("quiesce grace %v: want 0 to %v", grace, nodeapi.MaxQuiesceGrace))
	}
	n, err := s.node.Quiesce(ctx, req.Msg.GetId(), grace)
	if err != nil {
		return nil, toConnect(err)
	}
	return ok(&nodev1.QuiesceResponse{InFlight: int32(n)})
}

func (s *server) DeleteVolume(ctx context.Context, req *connect.Request[nodev1.DeleteVolumeRequest]) (*connect.Response[nodev1.DeleteVolumeResponse], error) {
	if err := s.node.DeleteVolume(ctx, req.Msg.GetVolumeId()); err != nil {
		return nil, toConnect(err)
	}
	return ok(&nodev1.DeleteVolumeResponse{})
}

func (s *server) VolumeUsage(ctx context.Context, req *connect.Request[nodev1.VolumeUsageRequest]) (*connect.Response[nodev1.VolumeUsageResponse], error) {
	u, err := s.node.VolumeUsage(ctx, req.Msg.GetVolumeId())
	if err != nil {
		return nil, toConnect(err)
	}
	return ok(&nodev1.VolumeUsageResponse{UsedBytes: u.UsedBytes, CapacityBytes: u.CapacityBytes})
}

func (s *server) Snapshot(ctx context.Context, req *connect.Request[nodev1.SnapshotRequest]) (*connect.Response[nodev1.SnapshotResponse], error) {
	m := req.Msg
	info, err := s.node.Snapshot(ctx, m.GetId(), nodeapi.SnapshotRequest{SnapshotID: m.GetSnapshotId(), Names: m.GetNames(), Template: m.GetTemplate()})
	if err != nil {
		return nil, toConnect(err)
	}
	return ok(&nodev1.SnapshotResponse{Snapshot: snapshotPB(info)})
}

func (s *server) Fork(ctx context.Context, req *connect.Request[nodev1.ForkRequest]) (*connect.Response[nodev1.ForkResponse], error) {
	m := req.Msg
	fr := nodeapi.ForkRequest{Concurrency: int(m.GetConcurrency()), Children: make([]nodeapi.ForkChildSpec, len(m.GetChildren()))}
	for i, c := range m.GetChildren() {
		fr.Children[i] = nodeapi.ForkChildSpec{SandboxID: c.GetSandboxId(), AccessToken: c.GetAccessToken()}
	}
	res, err := s.node.Fork(ctx, m.GetId(), fr)
	if err != nil {
		return nil, toConnect(err)
	}
	out := &nodev1.ForkResponse{Children: make([]*nodev1.ForkChild, len(res.Children))}
	for i, c := range res.Children {
		if c.Err != nil {
			out.Children[i] = &nodev1.ForkChild{Error: &nodev1.Error{Code: uint32(codeOf(c.Err)), Message: c.Err.Error()}}
		} else {
			out.Children[i] = &nodev1.ForkChild{Sandbox: sandboxPB(c.Sandbox)}
		}
	}
	return ok(out)
}

func (s *server) Rollback(ctx context.Context, req *connect.Request[nodev1.RollbackRequest]) (*connect.Response[nodev1.RollbackResponse], error) {
	sb, err := s.node.Rollback(ctx, req.Msg.GetId(), req.Msg.GetSnapshotRef())
	if err != nil {
		return nil, toConnect(err)
	}
	return ok(&nodev1.RollbackResponse{Sandbox: sandboxPB(sb)})
}

func (s *server) GetSnapshot(ctx context.Context, req *connect.Request[nodev1.GetSnapshotRequest]) (*connect.Response[nodev1.GetSnapshotResponse], error) {
	info, err := s.node.GetSnapshot(ctx, req.Msg.GetRef())
	if err != nil {
		return nil, toConnect(err)
	}
	return ok(&nodev1.GetSnapshotResponse{Snapshot: snapshotPB(info)})
}

func (s *server) DeleteSnapshot(ctx context.Context, req *connect.Request[nodev1.DeleteSnapshotRequest]) (*connect.Response[nodev1.DeleteSnapshotResponse], error) {
	if err := s.node.DeleteSnapshot(ctx, req.Msg.GetRef()); err != nil {
		return nil, toConnect(err)
	}
	return ok(&nodev1.DeleteSnapshotResponse{})
}

func (s *server) Upload(ctx context.Context, req *connect.Request[nodev1.UploadRequest]) (*connect.Response[nodev1.UploadResponse], error) {
	res, err := s.node.Upload(ctx, req.Msg.GetRef())
	if err != nil {
		return nil, toConnect(err)
	}
	return ok(&nodev1.UploadResponse{TotalBytes: res.TotalBytes, StoredBytes: res.StoredBytes})
}

func (s *server) CollectGarbage(ctx context.Context, req *connect.Request[nodev1.CollectGarbageRequest]) (*connect.Response[nodev1.CollectGarbageResponse], error) {
	rep, err := s.node.CollectGarbage(ctx, nodeapi.GCRequest{Grace: req.Msg.GetGrace().AsDuration(), DryRun: req.Msg.GetDryRun()})
	if err != nil {
		return nil, toConnect(err)
	}
	return ok(&nodev1.CollectGarbageResponse{DeletedChunks: rep.DeletedChunks, FreedBytes: rep.FreedBytes, KeptChunks: rep.KeptChunks,
		YoungChunks: rep.YoungChunks, Manifests: rep.Manifests})
}

func (s *server) BuildImage(ctx context.Context, req *connect.Request[nodev1.BuildImageRequest]) (*connect.Response[nodev1.BuildImageResponse], error) {
	m := req.Msg
	info, err := s.node.BuildImage(ctx, nodeapi.ImageBuildRequest{Name: m.GetName(), Ref: m.GetRef(), Username: m.GetUsername(),
		Password: m.GetPassword(), Platform: m.GetPlatform()})
	if err != nil {
		return nil, toConnect(err)
	}
	return ok(&nodev1.BuildImageResponse{Snapshot: snapshotPB(info)})
}

func (s *server) Export(ctx context.Context, req *connect.Request[nodev1.ExportRequest]) (*connect.Response[nodev1.ExportResponse], error) {
	m := req.Msg
	info, err := s.node.Export(ctx, nodeapi.ExportRequest{SandboxID: m.GetSandboxId(), Ref: m.GetRef(), Username: m.GetUsername(),
		Password: m.GetPassword(), LayoutDir: m.GetLayoutDir(), BlobKey: m.GetBlobKey()})
	if err != nil {
		return nil, toConnect(err)
	}
	return ok(&nodev1.ExportResponse{Ref: info.Ref, Digest: info.Digest, Layers: int32(info.Layers), Bytes: info.Bytes,
		DiffBytes: info.DiffBytes, Changed: info.Changed, Deleted: info.Deleted, LayoutBytes: info.LayoutBytes})
}

func (s *server) Snapshots(ctx context.Context, _ *connect.Request[nodev1.SnapshotsRequest]) (*connect.Response[nodev1.SnapshotsResponse], error) {
	list, err := s.node.Snapshots(ctx)
	if err != nil {
		return nil, toConnect(err)
	}
	out := &nodev1.SnapshotsResponse{Snapshots: make([]*nodev1.SnapshotInfo, len(list))}
	for i, m := range list {
		out.Snapshots[i] = snapshotPB(m)
	}
	return ok(out)
}

func (s *server) SetPolicy(ctx context.Context, req *connect.Request[nodev1.SetPolicyRequest]) (*connect.Response[nodev1.SetPolicyResponse], error) {
	p, err := policy(req.Msg.GetPolicy())
	if err != nil {
		return nil, toConnect(err)
	}
	if p == nil {
		return nil, toConnect(errdefs.Invalidf("set policy of %s: no policy given", req.Msg.GetId()))
	}
	if err := s.node.SetPolicy(ctx, req.Msg.GetId(), *p); err != nil {
		return nil, toConnect(err)
	}
	return ok(&nodev1.SetPolicyResponse{})
}

func (s *server) Reconfigure(ctx context.Context, req *connect.Request[nodev1.ReconfigureRequest]) (*connect.Response[nodev1.ReconfigureResponse], error) {
	p, err := policy(req.Msg.GetPolicy())
	if err != nil {
		return nil, toConnect(err)
	}
	sb, err := s.node.Reconfigure(ctx, req.Msg.GetId(), req.Msg.GetEnv(), p)
	if err != nil {
		return nil, toConnect(err)
	}
	return ok(&nodev1.ReconfigureResponse{Sandbox: sandboxPB(sb)})
}

func (s *server) Stats(ctx context.Context, req *connect.Request[nodev1.StatsRequest]) (*connect.Response[nodev1.StatsResponse], error) {
	st, err := s.node.Stats(ctx, req.Msg.GetId())
	if err != nil {
		return nil, toConnect(err)
	}
	return ok(statsPB(st))
}

func (s *server) StatsHistory(ctx context.Context, req *connect.Request[nodev1.StatsHistoryRequest]) (*connect.Response[nodev1.StatsHistoryResponse], error) {
	h, err := s.node.StatsHistory(ctx, req.Msg.GetId(), fromTS(req.Msg.GetStart()), fromTS(req.Msg.GetEnd()))
	if err != nil {
		return nil, toConnect(err)
	}
	return ok(statsSamplesPB(h))
}

func (s *server) FileTree(ctx context.Context, req *connect.Request[nodev1.FileTreeRequest]) (*connect.Response[nodev1.FileTreeResponse], error) {
	ents, err := s.node.FileTree(ctx, req.Msg.GetId())
	if err != nil {
		return nil, toConnect(err)
	}
	return ok(fileEntriesPB(ents))
}

func (s *server) ReadFiles(ctx context.Context, req *connect.Request[nodev1.ReadFilesRequest]) (*connect.Response[nodev1.ReadFilesResponse], error) {
	files, err := s.node.ReadFiles(ctx, req.Msg.GetId(), req.Msg.GetPaths())
	if err != nil {
		return nil, toConnect(err)
	}
	return ok(fileDataPB(files))
}

// Events subscribes first, then says so (an empty message), then streams
// until the caller hangs up or the node's stream ends.
func (s *server) Events(ctx context.Context, _ *connect.Request[nodev1.EventsRequest], stream *connect.ServerStream[nodev1.EventsResponse]) error {
	ch, err := s.node.Events(ctx)
	if err != nil {
		return toConnect(err)
	}
	if err := stream.Send(&nodev1.EventsResponse{}); err != nil {
		return err
	}
	for {
		select {
		case ev, open := <-ch:
			if !open {
				return nil
			}
			if err := stream.Send(&nodev1.EventsResponse{Event: eventPB(ev)}); err != nil {
				return fmt.Errorf("events: %w", err)
			}
		case <-ctx.Done():
			return nil
		}
	}
}

func (s *server) EgressAudit(ctx context.Context, req *connect.Request[nodev1.EgressAuditRequest]) (*connect.Response[nodev1.EgressAuditResponse], error) {
	m := req.Msg
	var since time.Time
	if m.GetSince() != nil {
		since = fromTS(m.GetSince())
	}
	es, err := s.node.EgressAudit(ctx, m.GetSandboxId(), since, int(m.GetLimit()))
	if err != nil {
		return nil, toConnect(err)
	}
	out := make([]*nodev1.EgressEntry, len(es))
	for i, e := range es {
		out[i] = &nodev1.EgressEntry{At: ts(e.At), Proto: e.Proto, Dst: e.Dst, Domain: e.Domain, Allowed: e.Allowed,
			Rule: e.Rule, Reason: e.Reason, BytesOut: e.BytesOut, BytesIn: e.BytesIn, Open: e.Open}
		if e.End != nil {
			out[i].End = ts(*e.End)
		}
	}
	return ok(&nodev1.EgressAuditResponse{Entries: out})
}

func volumes(vs []*nodev1.VolumeMount) []nodeapi.VolumeMount {
	var out []nodeapi.VolumeMount
	for _, v := range vs {
		out = append(out, nodeapi.VolumeMount{VolumeID: v.GetVolumeId(), SizeBytes: v.GetSizeBytes(), Path: v.GetPath(), ReadOnly: v.GetReadOnly(), Exclusive: v.GetExclusive()})
	}
	return out
}

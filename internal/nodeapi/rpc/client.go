package rpc

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/url"
	"time"

	"connectrpc.com/connect"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/spore-run/spore/internal/errdefs"
	"github.com/spore-run/spore/internal/nodeapi"
	nodev1 "github.com/spore-run/spore/proto/gen/node/v1"
	"github.com/spore-run/spore/proto/gen/node/v1/nodev1connect"
)

// Client is a remote node: a nodeapi.Node whose every call is a Connect
// call to a node agent's handler.
type Client struct {
	c nodev1connect.NodeClient
}

var _ nodeapi.Node = (*Client)(nil)

// NewClient calls the node handler at baseURL: https:// with mutual TLS
// (httpClient from HTTPClient with the fleet's client configuration; the
// token is then not sent), or http:// (h2c) with the cluster token of an
// insecure fleet. httpClient nil: HTTPClient(nil) (h2c).
func NewClient(baseURL, token string, httpClient *http.Client) (*Client, error) {
	u, err := url.Parse(baseURL)
	if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		return nil, errdefs.Invalidf("node URL %q: want http://host:port or https://host:port", baseURL)
	}
	if u.Scheme == "http" && token == "" {
		return nil, errdefs.Invalidf("node %s: no cluster token (the node refuses callers without one)", u.Host)
	}
	if httpClient == nil {
		httpClient = HTTPClient(nil)
	}
	ics := []connect.Interceptor{clientTiming{}, clientTeam}
	if u.Scheme == "http" {
		ics = append(ics, bearer("Bearer "+token))
	}
	return &Client{c: nodev1connect.NewNodeClient(httpClient, baseURL, connect.WithInterceptors(ics...))}, nil
}

// bearer sets the Authorization header on every call.
type bearer string

func (b bearer) WrapUnary(next connect.UnaryFunc) connect.UnaryFunc {
	return func(ctx context.Context, req connect.AnyRequest) (connect.AnyResponse, error) {
		req.Header().Set("Authorization", string(b))
		return next(ctx, req)
	}
}

func (b bearer) WrapStreamingClient(next connect.StreamingClientFunc) connect.StreamingClientFunc {
	return func(ctx context.Context, spec connect.Spec) connect.StreamingClientConn {
		conn := next(ctx, spec)
		conn.RequestHeader().Set("Authorization", string(b))
		return conn
	}
}

func (b bearer) WrapStreamingHandler(next connect.StreamingHandlerFunc) connect.StreamingHandlerFunc {
	return next
}

// HTTPClient is an HTTP client for node calls: HTTP/2 over cleartext
// (prior knowledge) for http:// URLs and over TLS with tlsCfg for https://
// ones; pings find a vanished peer on a long-lived Events stream. It has
// no overall timeout: each call's context bounds it (and Connect sends the
// deadline to the node).
func HTTPClient(tlsCfg *tls.Config) *http.Client {
	p := new(http.Protocols)
	p.SetUnencryptedHTTP2(true) // http://: h2c, no HTTP/1 fallback
	p.SetHTTP2(true)            // https://
	return &http.Client{Transport: &http.Transport{
		Protocols:           p,
		TLSClientConfig:     tlsCfg,
		DialContext:         (&net.Dialer{Timeout: 5 * time.Second, KeepAlive: 30 * time.Second}).DialContext,
		TLSHandshakeTimeout: 5 * time.Second,
		IdleConnTimeout:     90 * time.Second,
		HTTP2:               &http.HTTP2Config{SendPingTimeout: pingEvery, PingTimeout: pingTimeout},
	}}
}

func call[Req, Res any](ctx context.Context, fn func(context.Context, *connect.Request[Req]) (*connect.Response[Res], error), m *Req) (*Res, error) {
	res, err := fn(ctx, connect.NewRequest(m))
	if err != nil {
		return nil, fromConnect(err)
	}
	return res.Msg, nil
}

// Info describes the node.
func (c *Client) Info(ctx context.Context) (nodeapi.NodeInfo, error) {
	res, err := call(ctx, c.c.Info, &nodev1.InfoRequest{})
	if err != nil {
		return nodeapi.NodeInfo{}, err
	}
	return info(res), nil
}

// Create makes (or, replayed, returns) a sandbox.
func (c *Client) Create(ctx context.Context, req nodeapi.CreateRequest) (nodeapi.Sandbox, error) {
	res, err := call(ctx, c.c.Create, &nodev1.CreateRequest{SandboxId: req.SandboxID, AccessToken: req.AccessToken, Template: req.Template,
		Env: req.Env, Vcpus: req.VCPUs, MemoryMb: req.MemoryMB, Policy: policyOrNil(req.Policy), Peers: req.Peers,
		Volumes: volumesPB(req.Volumes)})
	if err != nil {
		return nodeapi.Sandbox{}, err
	}
	return sandbox(res.GetSandbox())
}

func volumesPB(vs []nodeapi.VolumeMount) []*nodev1.VolumeMount {
	var out []*nodev1.VolumeMount
	for _, v := range vs {
		out = append(out, &nodev1.VolumeMount{VolumeId: v.VolumeID, SizeBytes: v.SizeBytes, Path: v.Path, ReadOnly: v.ReadOnly, Exclusive: v.Exclusive})
	}
	return out
}

// Adopt takes over a sandbox hibernated on another node.
func (c *Client) Adopt(ctx context.Context, req nodeapi.AdoptRequest) (nodeapi.Sandbox, error) {
	res, err := call(ctx, c.c.Adopt, &nodev1.AdoptRequest{SandboxId: req.SandboxID, Hibernation: req.Hibernation,
		Policy: policyOrNil(req.Policy), Peers: req.Peers})
	if err != nil {
		return nodeapi.Sandbox{}, err
	}
	return sandbox(res.GetSandbox())
}

// Get returns one sandbox.
func (c *Client) Get(ctx context.Context, id string) (nodeapi.Sandbox, error) {
	res, err := call(ctx, c.c.Get, &nodev1.GetRequest{Id: id})
	if err != nil {
		return nodeapi.Sandbox{}, err
	}
	return sandbox(res.GetSandbox())
}

// List returns every sandbox of the node.
func (c *Client) List(ctx context.Context) ([]nodeapi.Sandbox, error) {
	res, err := call(ctx, c.c.List, &nodev1.ListRequest{})
	if err != nil {
		return nil, err
	}
	out := make([]nodeapi.Sandbox, len(res.GetSandboxes()))
	for i, s := range res.GetSandboxes() {
		if out[i], err = sandbox(s); err != nil {
			return nil, err
		}
	}
	return out, nil
}

// Kill kills a sandbox.
func (c *Client) Kill(ctx context.Context, id string) error {
	_, err := call(ctx, c.c.Kill, &nodev1.KillRequest{Id: id})
	return err
}

// Pause pauses a sandbox.
func (c *Client) Pause(ctx context.Context, id string) error {
	_, err := call(ctx, c.c.Pause, &nodev1.PauseRequest{Id: id})
	return err
}

// Resume resumes a sandbox and returns it.
func (c *Client) Resume(ctx context.Context, id string) (nodeapi.Sandbox, error) {
	res, err := call(ctx, c.c.Resume, &nodev1.ResumeRequest{Id: id})
	if err != nil {
		return nodeapi.Sandbox{}, err
	}
	return sandbox(res.GetSandbox())
}

// Hibernate hibernates a sandbox.
func (c *Client) Hibernate(ctx context.Context, id string) error {
	_, err := call(ctx, c.c.Hibernate, &nodev1.HibernateRequest{Id: id})
	return err
}

// Quiesce readies a sandbox's hibernation (see nodeapi.Node).
func (c *Client) Quiesce(ctx context.Context, id string, grace time.Duration) (int, error) {
	res, err := call(ctx, c.c.Quiesce, &nodev1.QuiesceRequest{Id: id, GraceMs: grace.Milliseconds()})
	if err != nil {
		return 0, err
	}
	return int(res.GetInFlight()), nil
}

// DeleteVolume removes a volume's content from the node.
func (c *Client) DeleteVolume(ctx context.Context, volumeID string) error {
	_, err := call(ctx, c.c.DeleteVolume, &nodev1.DeleteVolumeRequest{VolumeId: volumeID})
	return err
}

// VolumeUsage is a volume's bytes in use and its capacity on the node.
func (c *Client) VolumeUsage(ctx context.Context, volumeID string) (nodeapi.VolumeUsage, error) {
	res, err := call(ctx, c.c.VolumeUsage, &nodev1.VolumeUsageRequest{VolumeId: volumeID})
	if err != nil {
		return nodeapi.VolumeUsage{}, err
	}
	return nodeapi.VolumeUsage{UsedBytes: res.GetUsedBytes(), CapacityBytes: res.GetCapacityBytes()}, nil
}

// Snapshot takes (or, replayed, returns) a snapshot.
func (c *Client) Snapshot(ctx context.Context, id string, req nodeapi.SnapshotRequest) (nodeapi.SnapshotInfo, error) {
	res, err := call(ctx, c.c.Snapshot, &nodev1.SnapshotRequest{Id: id, SnapshotId: req.SnapshotID, Names: req.Names, Template: req.Template})
	if err != nil {
		return nodeapi.SnapshotInfo{}, err
	}
	return snapshotInfo(res.GetSnapshot()), nil
}

// Fork makes the named children of a sandbox.
func (c *Client) Fork(ctx context.Context, id string, req nodeapi.ForkRequest) (nodeapi.ForkResult, error) {
	m := &nodev1.ForkRequest{Id: id, Concurrency: int32(req.Concurrency), Children: make([]*nodev1.ForkChildSpec, len(req.Children))}
	for i, ch := range req.Children {
		m.Children[i] = &nodev1.ForkChildSpec{SandboxId: ch.SandboxID, AccessToken: ch.AccessToken}
	}
	res, err := call(ctx, c.c.Fork, m)
	if err != nil {
		return nodeapi.ForkResult{}, err
	}
	if len(res.GetChildren()) != len(req.Children) {
		return nodeapi.ForkResult{}, fmt.Errorf("fork of %s: the node answered %d children for %d asked: %w",
			id, len(res.GetChildren()), len(req.Children), errdefs.ErrInternal)
	}
	out := nodeapi.ForkResult{Children: make([]nodeapi.ForkChild, len(res.GetChildren()))}
	for i, ch := range res.GetChildren() {
		if e := ch.GetError(); e != nil {
			out.Children[i].Err = childError(e.GetCode(), e.GetMessage())
			continue
		}
		if out.Children[i].Sandbox, err = sandbox(ch.GetSandbox()); err != nil {
			out.Children[i].Err = err
		}
	}
	return out, nil
}

// Rollback rolls a sandbox back in place.
func (c *Client) Rollback(ctx context.Context, id, snapshotRef string) (nodeapi.Sandbox, error) {
	res, err := call(ctx, c.c.Rollback, &nodev1.RollbackRequest{Id: id, SnapshotRef: snapshotRef})
	if err != nil {
		return nodeapi.Sandbox{}, err
	}
	return sandbox(res.GetSandbox())
}

// GetSnapshot returns one snapshot.
func (c *Client) GetSnapshot(ctx context.Context, ref string) (nodeapi.SnapshotInfo, error) {
	res, err := call(ctx, c.c.GetSnapshot, &nodev1.GetSnapshotRequest{Ref: ref})
	if err != nil {
		return nodeapi.SnapshotInfo{}, err
	}
	return snapshotInfo(res.GetSnapshot()), nil
}

// DeleteSnapshot deletes a snapshot or template.
func (c *Client) DeleteSnapshot(ctx context.Context, ref string) error {
	_, err := call(ctx, c.c.DeleteSnapshot, &nodev1.DeleteSnapshotRequest{Ref: ref})
	return err
}

// Upload makes a snapshot durable in the node's blob store.
func (c *Client) Upload(ctx context.Context, ref string) (nodeapi.UploadInfo, error) {
	res, err := call(ctx, c.c.Upload, &nodev1.UploadRequest{Ref: ref})
	if err != nil {
		return nodeapi.UploadInfo{}, err
	}
	return nodeapi.UploadInfo{TotalBytes: res.GetTotalBytes(), StoredBytes: res.GetStoredBytes()}, nil
}

// CollectGarbage runs a GC over the node's blob store.
func (c *Client) CollectGarbage(ctx context.Context, req nodeapi.GCRequest) (nodeapi.GCReport, error) {
	res, err := call(ctx, c.c.CollectGarbage, &nodev1.CollectGarbageRequest{Grace: durationpb.New(req.Grace), DryRun: req.DryRun})
	if err != nil {
		return nodeapi.GCReport{}, err
	}
	return nodeapi.GCReport{DeletedChunks: res.GetDeletedChunks(), FreedBytes: res.GetFreedBytes(), KeptChunks: res.GetKeptChunks(),
		YoungChunks: res.GetYoungChunks(), Manifests: res.GetManifests()}, nil
}

// BuildImage builds a template from an OCI image on the node. It takes
// minutes at most: like every call, only ctx bounds it (the client sets
// no timeout of its own, and pings keep the connection's silence short).
func (c *Client) BuildImage(ctx context.Context, req nodeapi.ImageBuildRequest) (nodeapi.SnapshotInfo, error) {
	res, err := call(ctx, c.c.BuildImage, &nodev1.BuildImageRequest{Name: req.Name, Ref: req.Ref, Username: req.Username,
		Password: req.Password, Platform: req.Platform})
	if err != nil {
		return nodeapi.SnapshotInfo{}, err
	}
	return snapshotInfo(res.GetSnapshot()), nil
}

// Export writes a sandbox's filesystem as an OCI image on the node. Like
// BuildImage, only ctx bounds it.
func (c *Client) Export(ctx context.Context, req nodeapi.ExportRequest) (nodeapi.ExportInfo, error) {
	res, err := call(ctx, c.c.Export, &nodev1.ExportRequest{SandboxId: req.SandboxID, Ref: req.Ref, Username: req.Username,
		Password: req.Password, LayoutDir: req.LayoutDir, BlobKey: req.BlobKey})
	if err != nil {
		return nodeapi.ExportInfo{}, err
	}
	return nodeapi.ExportInfo{Ref: res.GetRef(), Digest: res.GetDigest(), Layers: int(res.GetLayers()), Bytes: res.GetBytes(),
		DiffBytes: res.GetDiffBytes(), Changed: res.GetChanged(), Deleted: res.GetDeleted(), LayoutBytes: res.GetLayoutBytes()}, nil
}

// Snapshots lists what the node holds.
func (c *Client) Snapshots(ctx context.Context) ([]nodeapi.SnapshotInfo, error) {
	res, err := call(ctx, c.c.Snapshots, &nodev1.SnapshotsRequest{})
	if err != nil {
		return nil, err
	}
	out := make([]nodeapi.SnapshotInfo, len(res.GetSnapshots()))
	for i, m := range res.GetSnapshots() {
		out[i] = snapshotInfo(m)
	}
	return out, nil
}

// SetPolicy replaces a sandbox's egress policy.
func (c *Client) SetPolicy(ctx context.Context, id string, p nodeapi.Policy) error {
	_, err := call(ctx, c.c.SetPolicy, &nodev1.SetPolicyRequest{Id: id, Policy: policyPB(p)})
	return err
}

// Reconfigure gives a running sandbox a new environment and policy.
func (c *Client) Reconfigure(ctx context.Context, id string, env []string, p *nodeapi.Policy) (nodeapi.Sandbox, error) {
	res, err := call(ctx, c.c.Reconfigure, &nodev1.ReconfigureRequest{Id: id, Env: env, Policy: policyOrNil(p)})
	if err != nil {
		return nodeapi.Sandbox{}, err
	}
	return sandbox(res.GetSandbox())
}

// Stats reads a sandbox's resource use.
func (c *Client) Stats(ctx context.Context, id string) (nodeapi.Stats, error) {
	res, err := call(ctx, c.c.Stats, &nodev1.StatsRequest{Id: id})
	if err != nil {
		return nodeapi.Stats{}, err
	}
	return stats(res), nil
}

// StatsHistory lists the samples of a sandbox's resource use the node keeps.
func (c *Client) StatsHistory(ctx context.Context, id string, start, end time.Time) ([]nodeapi.StatsSample, error) {
	res, err := call(ctx, c.c.StatsHistory, &nodev1.StatsHistoryRequest{Id: id, Start: ts(start), End: ts(end)})
	if ce := new(connect.Error); errors.As(err, &ce) && ce.Code() == connect.CodeUnimplemented {
		// A node of a release before histories (an upgrade under way):
		// the caller reads a sample now instead.
		return nil, fmt.Errorf("%w: the node keeps no resource history (an older release)", errdefs.ErrUnavailable)
	}
	if err != nil {
		return nil, err
	}
	return statsSamples(res), nil
}

// FileTree lists a running sandbox's filesystem.
func (c *Client) FileTree(ctx context.Context, id string) ([]nodeapi.FileEntry, error) {
	res, err := call(ctx, c.c.FileTree, &nodev1.FileTreeRequest{Id: id})
	if err != nil {
		return nil, olderNode(err, "list a sandbox's files")
	}
	return fileEntries(res), nil
}

// ReadFiles reads small regular files of a running sandbox.
func (c *Client) ReadFiles(ctx context.Context, id string, paths []string) ([]nodeapi.FileData, error) {
	res, err := call(ctx, c.c.ReadFiles, &nodev1.ReadFilesRequest{Id: id, Paths: paths})
	if err != nil {
		return nil, olderNode(err, "read a sandbox's files")
	}
	return fileData(res), nil
}

// olderNode is err, or, for a node of a release without the call (an
// upgrade under way), ErrConflict saying so.
func olderNode(err error, what string) error {
	if ce := new(connect.Error); errors.As(err, &ce) && ce.Code() == connect.CodeUnimplemented {
		return fmt.Errorf("%w: the node cannot %s (an older release)", errdefs.ErrConflict, what)
	}
	return err
}

// eventBuffer is how far the caller may lag before the stream waits (and
// the node, its own buffer full, drops events for this subscriber).
const eventBuffer = 256

// Events subscribes to the node's events. It returns once the node says
// the subscription is in place, so nothing that happens after is missed
// while the stream holds; the channel closes when ctx ends or the stream
// breaks (then reconcile with List).
func (c *Client) Events(ctx context.Context) (<-chan nodeapi.Event, error) {
	ctx, cancel := context.WithCancel(ctx)
	st, err := c.c.Events(ctx, connect.NewRequest(&nodev1.EventsRequest{}))
	if err != nil {
		cancel()
		return nil, fromConnect(err)
	}
	if !st.Receive() {
		err := st.Err()
		st.Close()
		cancel()
		if err == nil {
			err = connect.NewError(connect.CodeUnavailable, fmt.Errorf("events: the node ended the stream before subscribing"))
		}
		return nil, fromConnect(err)
	}
	ch := make(chan nodeapi.Event, eventBuffer)
	go func() {
		defer cancel()
		defer close(ch)
		defer st.Close()
		for st.Receive() {
			ev := st.Msg().GetEvent()
			if ev == nil {
				continue
			}
			select {
			case ch <- event(ev):
			case <-ctx.Done():
				return
			}
		}
	}()
	return ch, nil
}

// EgressAudit reads a sandbox's recorded outbound connection attempts.
func (c *Client) EgressAudit(ctx context.Context, id string, since time.Time, limit int) ([]nodeapi.EgressEntry, error) {
	req := &nodev1.EgressAuditRequest{SandboxId: id, Limit: int32(max(0, min(limit, 1<<30)))}
	if !since.IsZero() {
		req.Since = ts(since)
	}
	res, err := call(ctx, c.c.EgressAudit, req)
	if err != nil {
		return nil, err
	}
	out := make([]nodeapi.EgressEntry, len(res.GetEntries()))
	for i, e := range res.GetEntries() {
		out[i] = nodeapi.EgressEntry{At: fromTS(e.GetAt()), Proto: e.GetProto(), Dst: e.GetDst(), Domain: e.GetDomain(),
			Allowed: e.GetAllowed(), Rule: e.GetRule(), Reason: e.GetReason(), BytesOut: e.GetBytesOut(), BytesIn: e.GetBytesIn(), Open: e.GetOpen()}
		if e.GetEnd() != nil {
			end := fromTS(e.GetEnd())
			out[i].End = &end
		}
	}
	return out, nil
}

package rpc

import (
	"context"
	"sync/atomic"
	"time"

	"github.com/spore-run/spore/internal/nodeapi"
)

// stubNode answers every call with err (nil: zero values) and counts the
// calls that reached it.
type stubNode struct {
	err   error
	calls atomic.Int64
}

func (s *stubNode) hit() error { s.calls.Add(1); return s.err }

func (s *stubNode) Info(context.Context) (nodeapi.NodeInfo, error) {
	return nodeapi.NodeInfo{}, s.hit()
}
func (s *stubNode) Create(context.Context, nodeapi.CreateRequest) (nodeapi.Sandbox, error) {
	return nodeapi.Sandbox{}, s.hit()
}
func (s *stubNode) Get(context.Context, string) (nodeapi.Sandbox, error) {
	return nodeapi.Sandbox{}, s.hit()
}
func (s *stubNode) List(context.Context) ([]nodeapi.Sandbox, error) { return nil, s.hit() }
func (s *stubNode) Kill(context.Context, string) error              { return s.hit() }
func (s *stubNode) Pause(context.Context, string) error             { return s.hit() }
func (s *stubNode) Resume(context.Context, string) (nodeapi.Sandbox, error) {
	return nodeapi.Sandbox{}, s.hit()
}
func (s *stubNode) Hibernate(context.Context, string) error                     { return s.hit() }
func (s *stubNode) Quiesce(context.Context, string, time.Duration) (int, error) { return 0, s.hit() }
func (s *stubNode) DeleteVolume(context.Context, string) error                  { return s.hit() }
func (s *stubNode) VolumeUsage(context.Context, string) (nodeapi.VolumeUsage, error) {
	return nodeapi.VolumeUsage{}, s.hit()
}
func (s *stubNode) DeleteSnapshot(context.Context, string) error              { return s.hit() }
func (s *stubNode) Snapshots(context.Context) ([]nodeapi.SnapshotInfo, error) { return nil, s.hit() }
func (s *stubNode) SetPolicy(context.Context, string, nodeapi.Policy) error   { return s.hit() }
func (s *stubNode) Stats(context.Context, string) (nodeapi.Stats, error) {
	return nodeapi.Stats{}, s.hit()
}
func (s *stubNode) StatsHistory(context.Context, string, time.Time, time.Time) ([]nodeapi.StatsSample, error) {
	return nil, s.hit()
}
func (s *stubNode) FileTree(context.Context, string) ([]nodeapi.FileEntry, error) {
	return nil, s.hit()
}
func (s *stubNode) ReadFiles(context.Context, string, []string) ([]nodeapi.FileData, error) {
	return nil, s.hit()
}
func (s *stubNode) Adopt(context.Context, nodeapi.AdoptRequest) (nodeapi.Sandbox, error) {
	return nodeapi.Sandbox{}, s.hit()
}
func (s *stubNode) Upload(context.Context, string) (nodeapi.UploadInfo, error) {
	return nodeapi.UploadInfo{}, s.hit()
}
func (s *stubNode) CollectGarbage(context.Context, nodeapi.GCRequest) (nodeapi.GCReport, error) {
	return nodeapi.GCReport{}, s.hit()
}
func (s *stubNode) BuildImage(context.Context, nodeapi.ImageBuildRequest) (nodeapi.SnapshotInfo, error) {
	return nodeapi.SnapshotInfo{}, s.hit()
}
func (s *stubNode) Export(context.Context, nodeapi.ExportRequest) (nodeapi.ExportInfo, error) {
	return nodeapi.ExportInfo{}, s.hit()
}
func (s *stubNode) Snapshot(context.Context, string, nodeapi.SnapshotRequest) (nodeapi.SnapshotInfo, error) {
	return nodeapi.SnapshotInfo{}, s.hit()
}
func (s *stubNode) Fork(context.Context, string, nodeapi.ForkRequest) (nodeapi.ForkResult, error) {
	return nodeapi.ForkResult{}, s.hit()
}
func (s *stubNode) Rollback(context.Context, string, string) (nodeapi.Sandbox, error) {
	return nodeapi.Sandbox{}, s.hit()
}
func (s *stubNode) GetSnapshot(context.Context, string) (nodeapi.SnapshotInfo, error) {
	return nodeapi.SnapshotInfo{}, s.hit()
}
func (s *stubNode) Reconfigure(context.Context, string, []string, *nodeapi.Policy) (nodeapi.Sandbox, error) {
	return nodeapi.Sandbox{}, s.hit()
}
func (s *stubNode) Events(ctx context.Context) (<-chan nodeapi.Event, error) {
	if err := s.hit(); err != nil {
		return nil, err
	}
	ch := make(chan nodeapi.Event)
	go func() { <-ctx.Done(); close(ch) }()
	return ch, nil
}

func (s *stubNode) EgressAudit(context.Context, string, time.Time, int) ([]nodeapi.EgressEntry, error) {
	return nil, s.hit()
}

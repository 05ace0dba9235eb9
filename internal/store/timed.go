package store

import (
	"context"
	"time"

	"github.com/spore-run/spore/internal/timing"
)

// Timed returns st with every call recorded as the phase "store" of the
// caller's timing recorder (when its context has one): the API's
// Server-Timing then says how much of an operation the store took (on
// PostgreSQL, one round trip or transaction per call).
func Timed(st Store) Store { return timed{st} }

type timed struct{ st Store }

func (x timed) Close() error { return x.st.Close() }

func (x timed) CreateSandbox(ctx context.Context, s Sandbox) error {
	defer timing.Track(ctx, "store")()
	return x.st.CreateSandbox(ctx, s)
}

func (x timed) GetSandbox(ctx context.Context, id string) (Sandbox, error) {
	defer timing.Track(ctx, "store")()
	return x.st.GetSandbox(ctx, id)
}

func (x timed) UpdateSandbox(ctx context.Context, id string, fn func(*Sandbox) error) (Sandbox, error) {
	defer timing.Track(ctx, "store")()
	return x.st.UpdateSandbox(ctx, id, fn)
}

func (x timed) CompareAndSwapSandbox(ctx context.Context, s Sandbox) (Sandbox, error) {
	defer timing.Track(ctx, "store")()
	return x.st.CompareAndSwapSandbox(ctx, s)
}

func (x timed) DeleteSandbox(ctx context.Context, id string) error {
	defer timing.Track(ctx, "store")()
	return x.st.DeleteSandbox(ctx, id)
}

func (x timed) DeleteSandboxIf(ctx context.Context, id string, version int64) error {
	defer timing.Track(ctx, "store")()
	return x.st.DeleteSandboxIf(ctx, id, version)
}

func (x timed) ListSandboxes(ctx context.Context, f SandboxFilter) ([]Sandbox, string, error) {
	defer timing.Track(ctx, "store")()
	return x.st.ListSandboxes(ctx, f)
}

func (x timed) Expired(ctx context.Context, now time.Time, states ...string) ([]Sandbox, error) {
	defer timing.Track(ctx, "store")()
	return x.st.Expired(ctx, now, states...)
}

func (x timed) PutSnapshot(ctx context.Context, s Snapshot) error {
	defer timing.Track(ctx, "store")()
	return x.st.PutSnapshot(ctx, s)
}

func (x timed) CreateSnapshot(ctx context.Context, s Snapshot) error {
	defer timing.Track(ctx, "store")()
	return x.st.CreateSnapshot(ctx, s)
}

func (x timed) GetSnapshot(ctx context.Context, id string) (Snapshot, error) {
	defer timing.Track(ctx, "store")()
	return x.st.GetSnapshot(ctx, id)
}

func (x timed) UpdateSnapshot(ctx context.Context, id string, fn func(*Snapshot) error) (Snapshot, error) {
	defer timing.Track(ctx, "store")()
	return x.st.UpdateSnapshot(ctx, id, fn)
}

func (x timed) ListSnapshots(ctx context.Context, f SnapshotFilter) ([]Snapshot, string, error) {
	defer timing.Track(ctx, "store")()
	return x.st.ListSnapshots(ctx, f)
}

func (x timed) DeleteSnapshot(ctx context.Context, id string) error {
	defer timing.Track(ctx, "store")()
	return x.st.DeleteSnapshot(ctx, id)
}

func (x timed) ResolveRef(ctx context.Context, team, ref string) (Ref, error) {
	defer timing.Track(ctx, "store")()
	return x.st.ResolveRef(ctx, team, ref)
}

func (x timed) PutTemplate(ctx context.Context, t Template) (Template, error) {
	defer timing.Track(ctx, "store")()
	return x.st.PutTemplate(ctx, t)
}

func (x timed) GetTemplate(ctx context.Context, name string) (Template, error) {
	defer timing.Track(ctx, "store")()
	return x.st.GetTemplate(ctx, name)
}

func (x timed) ListTemplates(ctx context.Context) ([]Template, error) {
	defer timing.Track(ctx, "store")()
	return x.st.ListTemplates(ctx)
}

func (x timed) UpdateTemplate(ctx context.Context, name string, fn func(*Template) error) (Template, error) {
	defer timing.Track(ctx, "store")()
	return x.st.UpdateTemplate(ctx, name, fn)
}

func (x timed) DeleteTemplate(ctx context.Context, name string) error {
	defer timing.Track(ctx, "store")()
	return x.st.DeleteTemplate(ctx, name)
}

func (x timed) UpsertNode(ctx context.Context, n Node) (Node, error) {
	defer timing.Track(ctx, "store")()
	return x.st.UpsertNode(ctx, n)
}

func (x timed) GetNode(ctx context.Context, id string) (Node, error) {
	defer timing.Track(ctx, "store")()
	return x.st.GetNode(ctx, id)
}

func (x timed) ListNodes(ctx context.Context) ([]Node, error) {
	defer timing.Track(ctx, "store")()
	return x.st.ListNodes(ctx)
}

func (x timed) UpdateNode(ctx context.Context, id string, fn func(*Node) error) (Node, error) {
	defer timing.Track(ctx, "store")()
	return x.st.UpdateNode(ctx, id, fn)
}

func (x timed) DeleteNode(ctx context.Context, id string) error {
	defer timing.Track(ctx, "store")()
	return x.st.DeleteNode(ctx, id)
}

func (x timed) BindNodeKey(ctx context.Context, nodeID, keyID string) error {
	defer timing.Track(ctx, "store")()
	return x.st.BindNodeKey(ctx, nodeID, keyID)
}

func (x timed) AcquireLease(ctx context.Context, name, holder string, ttl time.Duration) (bool, error) {
	defer timing.Track(ctx, "store")()
	return x.st.AcquireLease(ctx, name, holder, ttl)
}

func (x timed) ReleaseLease(ctx context.Context, name, holder string) error {
	defer timing.Track(ctx, "store")()
	return x.st.ReleaseLease(ctx, name, holder)
}

func (x timed) AddAPIKey(ctx context.Context, k APIKey) error {
	defer timing.Track(ctx, "store")()
	return x.st.AddAPIKey(ctx, k)
}

func (x timed) APIKeyByHash(ctx context.Context, hash string) (APIKey, error) {
	defer timing.Track(ctx, "store")()
	return x.st.APIKeyByHash(ctx, hash)
}

func (x timed) CountAPIKeys(ctx context.Context) (int, error) {
	defer timing.Track(ctx, "store")()
	return x.st.CountAPIKeys(ctx)
}

func (x timed) ListAPIKeys(ctx context.Context, revoked bool) ([]APIKey, error) {
	defer timing.Track(ctx, "store")()
	return x.st.ListAPIKeys(ctx, revoked)
}

func (x timed) RevokeAPIKey(ctx context.Context, id string, at time.Time) (APIKey, error) {
	defer timing.Track(ctx, "store")()
	return x.st.RevokeAPIKey(ctx, id, at)
}

func (x timed) APIKeysVersion(ctx context.Context) (int64, error) {
	defer timing.Track(ctx, "store")()
	return x.st.APIKeysVersion(ctx)
}

func (x timed) CreateBuild(ctx context.Context, b Build) error {
	defer timing.Track(ctx, "store")()
	return x.st.CreateBuild(ctx, b)
}

func (x timed) GetBuild(ctx context.Context, id string) (Build, error) {
	defer timing.Track(ctx, "store")()
	return x.st.GetBuild(ctx, id)
}

func (x timed) UpdateBuild(ctx context.Context, id string, fn func(*Build) error) (Build, error) {
	defer timing.Track(ctx, "store")()
	return x.st.UpdateBuild(ctx, id, fn)
}

func (x timed) ListBuilds(ctx context.Context, template string) ([]Build, error) {
	defer timing.Track(ctx, "store")()
	return x.st.ListBuilds(ctx, template)
}

func (x timed) DeleteBuilds(ctx context.Context, template string) error {
	defer timing.Track(ctx, "store")()
	return x.st.DeleteBuilds(ctx, template)
}

func (x timed) AppendBuildLogs(ctx context.Context, id string, logs ...BuildLog) error {
	defer timing.Track(ctx, "store")()
	return x.st.AppendBuildLogs(ctx, id, logs...)
}

func (x timed) BuildLogs(ctx context.Context, id string, offset, limit int) ([]BuildLog, error) {
	defer timing.Track(ctx, "store")()
	return x.st.BuildLogs(ctx, id, offset, limit)
}

func (x timed) SetTag(ctx context.Context, t TemplateTag) error {
	defer timing.Track(ctx, "store")()
	return x.st.SetTag(ctx, t)
}

func (x timed) DeleteTag(ctx context.Context, template, tag string) error {
	defer timing.Track(ctx, "store")()
	return x.st.DeleteTag(ctx, template, tag)
}

func (x timed) ListTags(ctx context.Context, template string) ([]TemplateTag, error) {
	defer timing.Track(ctx, "store")()
	return x.st.ListTags(ctx, template)
}

func (x timed) GetTag(ctx context.Context, template, tag string) (TemplateTag, error) {
	defer timing.Track(ctx, "store")()
	return x.st.GetTag(ctx, template, tag)
}

func (x timed) CreateSecret(ctx context.Context, s Secret) error {
	defer timing.Track(ctx, "store")()
	return x.st.CreateSecret(ctx, s)
}

func (x timed) GetSecret(ctx context.Context, team, ref string) (Secret, error) {
	defer timing.Track(ctx, "store")()
	return x.st.GetSecret(ctx, team, ref)
}

func (x timed) UpdateSecret(ctx context.Context, team, ref string, fn func(*Secret) error) (Secret, error) {
	defer timing.Track(ctx, "store")()
	return x.st.UpdateSecret(ctx, team, ref, fn)
}

func (x timed) ListSecrets(ctx context.Context, team string, limit int, cursor string) ([]Secret, string, error) {
	defer timing.Track(ctx, "store")()
	return x.st.ListSecrets(ctx, team, limit, cursor)
}

func (x timed) DeleteSecret(ctx context.Context, team, ref string) error {
	defer timing.Track(ctx, "store")()
	return x.st.DeleteSecret(ctx, team, ref)
}

func (x timed) CreateVolume(ctx context.Context, v Volume) error {
	defer timing.Track(ctx, "store")()
	return x.st.CreateVolume(ctx, v)
}

func (x timed) GetVolume(ctx context.Context, team, ref string) (Volume, error) {
	defer timing.Track(ctx, "store")()
	return x.st.GetVolume(ctx, team, ref)
}

func (x timed) UpdateVolume(ctx context.Context, team, ref string, fn func(*Volume) error) (Volume, error) {
	defer timing.Track(ctx, "store")()
	return x.st.UpdateVolume(ctx, team, ref, fn)
}

func (x timed) ListVolumes(ctx context.Context, team string, limit int, cursor string) ([]Volume, string, error) {
	defer timing.Track(ctx, "store")()
	return x.st.ListVolumes(ctx, team, limit, cursor)
}

func (x timed) DeleteVolume(ctx context.Context, team, ref string, check func(Volume) error) error {
	defer timing.Track(ctx, "store")()
	return x.st.DeleteVolume(ctx, team, ref, check)
}

func (x timed) TouchAPIKey(ctx context.Context, id string, at time.Time) error {
	defer timing.Track(ctx, "store")()
	return x.st.TouchAPIKey(ctx, id, at)
}

func (x timed) CreateTeam(ctx context.Context, t Team) error {
	defer timing.Track(ctx, "store")()
	return x.st.CreateTeam(ctx, t)
}

func (x timed) GetTeam(ctx context.Context, ref string) (Team, error) {
	defer timing.Track(ctx, "store")()
	return x.st.GetTeam(ctx, ref)
}

func (x timed) ListTeams(ctx context.Context) ([]Team, error) {
	defer timing.Track(ctx, "store")()
	return x.st.ListTeams(ctx)
}

func (x timed) DeleteTeam(ctx context.Context, id string, at time.Time) error {
	defer timing.Track(ctx, "store")()
	return x.st.DeleteTeam(ctx, id, at)
}

func (x timed) SetTeamQuotas(ctx context.Context, id string, q Quotas) (Team, error) {
	defer timing.Track(ctx, "store")()
	return x.st.SetTeamQuotas(ctx, id, q)
}

func (x timed) TeamUsage(ctx context.Context, id string) (TeamUsage, error) {
	defer timing.Track(ctx, "store")()
	return x.st.TeamUsage(ctx, id)
}

func (x timed) AppendAudit(ctx context.Context, recs []AuditRecord) error {
	defer timing.Track(ctx, "store")()
	return x.st.AppendAudit(ctx, recs)
}

func (x timed) ListAudit(ctx context.Context, f AuditFilter) ([]AuditRecord, string, error) {
	defer timing.Track(ctx, "store")()
	return x.st.ListAudit(ctx, f)
}

func (x timed) PruneAudit(ctx context.Context, before time.Time, limit int) (int, error) {
	defer timing.Track(ctx, "store")()
	return x.st.PruneAudit(ctx, before, limit)
}

func (x timed) LiveSandboxes(ctx context.Context) (map[string]int, error) {
	defer timing.Track(ctx, "store")()
	return x.st.LiveSandboxes(ctx)
}

func (x timed) CountAuditActions(ctx context.Context, action string, since, until time.Time) (map[string]int, error) {
	defer timing.Track(ctx, "store")()
	return x.st.CountAuditActions(ctx, action, since, until)
}

func (x timed) NoteTeamSamples(ctx context.Context, samples []TeamSample) error {
	defer timing.Track(ctx, "store")()
	return x.st.NoteTeamSamples(ctx, samples)
}

func (x timed) ListTeamSamples(ctx context.Context, team string, since, until time.Time, bucket time.Duration) ([]TeamSample, error) {
	defer timing.Track(ctx, "store")()
	return x.st.ListTeamSamples(ctx, team, since, until, bucket)
}

func (x timed) TopTeamSample(ctx context.Context, team string, since, until time.Time, figure string) (TeamSample, bool, error) {
	defer timing.Track(ctx, "store")()
	return x.st.TopTeamSample(ctx, team, since, until, figure)
}

func (x timed) PruneTeamSamples(ctx context.Context, before time.Time) (int, error) {
	defer timing.Track(ctx, "store")()
	return x.st.PruneTeamSamples(ctx, before)
}

func (x timed) Census(ctx context.Context) (Census, error) {
	defer timing.Track(ctx, "store")()
	return x.st.Census(ctx)
}

package control

import (
	"context"
	"time"

	"github.com/spore-run/spore/internal/engine"
	"github.com/spore-run/spore/internal/errdefs"
	"github.com/spore-run/spore/internal/ids"
	"github.com/spore-run/spore/internal/snapshot"
	"github.com/spore-run/spore/internal/store"
)

// Snapshot takes a live snapshot of a sandbox; it outlives the sandbox
// and is usable as a template ID.
func (s *Service) Snapshot(ctx context.Context, id, name string, template bool) (store.Snapshot, error) {
	if _, err := s.st.GetSandbox(ctx, id); err != nil {
		return store.Snapshot{}, err
	}
	var names []string
	if name != "" {
		if err := ids.ValidateName("snapshot name", name); err != nil {
			return store.Snapshot{}, err
		}
		names = []string{name}
	}
	if template && name == "" {
		return store.Snapshot{}, errdefs.Invalidf("a template needs a name")
	}
	res, err := s.eng.Snapshot(ctx, id, engine.SnapshotOptions{Names: names, Template: template})
	if err != nil {
		return store.Snapshot{}, err
	}
	sn := snapshotRecord(res.Manifest)
	if template {
		return sn, nil // templates are listed from the node, not the store
	}
	if err := s.st.PutSnapshot(ctx, sn); err != nil {
		return store.Snapshot{}, err
	}
	return sn, nil
}

func snapshotRecord(m snapshot.Manifest) store.Snapshot {
	return store.Snapshot{ID: m.ID, Names: m.Names, SandboxID: m.Origin, Kind: string(m.Kind), CreatedAt: m.CreatedAt, SizeBytes: m.SizeBytes}
}

// ListSnapshots lists user snapshots.
func (s *Service) ListSnapshots(ctx context.Context, f store.SnapshotFilter) ([]store.Snapshot, string, error) {
	return s.st.ListSnapshots(ctx, f)
}

// DeleteSnapshot deletes a snapshot or a template by ID (or name).
func (s *Service) DeleteSnapshot(ctx context.Context, ref string) error {
	m, err := s.eng.Snapshots().Get(ref)
	if err != nil {
		return err
	}
	if m.Kind == snapshot.KindHibernation {
		return errdefs.Conflictf("snapshot %s holds a paused sandbox: kill the sandbox instead", m.ID)
	}
	if err := s.eng.DeleteSnapshot(ctx, m.ID); err != nil {
		return err
	}
	if err := s.st.DeleteSnapshot(ctx, m.ID); err != nil && !errdefs.IsNotFound(err) {
		return err
	}
	return nil
}

// Templates lists the templates the node holds.
func (s *Service) Templates() []snapshot.Manifest {
	var out []snapshot.Manifest
	for _, m := range s.eng.Snapshots().List() {
		if m.Kind == snapshot.KindTemplate {
			out = append(out, m)
		}
	}
	return out
}

// ForkResult is one child's outcome.
type ForkResult struct {
	Sandbox Sandbox
	Err     error
}

// Fork makes count copies of a running sandbox; each child has the
// parent's metadata and template, its own identity and token, and its own
// timeout.
func (s *Service) Fork(ctx context.Context, id string, count int, timeout time.Duration) ([]ForkResult, error) {
	parent, err := s.st.GetSandbox(ctx, id)
	if err != nil {
		return nil, err
	}
	if parent.State == store.StateHibernated {
		return nil, errdefs.Conflictf("sandbox %s is paused: connect to it first", id)
	}
	fr, err := s.eng.Fork(ctx, id, engine.ForkOptions{Count: count})
	if err != nil {
		return nil, err
	}
	out := make([]ForkResult, len(fr.Children))
	now := s.now()
	for i, ch := range fr.Children {
		if ch.Err != nil {
			out[i].Err = ch.Err
			continue
		}
		rec := parent
		rec.ID, rec.State, rec.StartedAt, rec.EndAt = ch.Sandbox.ID, store.StateRunning, now, now.Add(timeout)
		if err := s.st.CreateSandbox(ctx, rec); err != nil {
			s.eng.Kill(context.WithoutCancel(ctx), ch.Sandbox.ID)
			out[i].Err = err
			continue
		}
		s.setTarget(rec.ID, ch.Sandbox.Addr, store.StateRunning)
		out[i].Sandbox = Sandbox{Sandbox: rec, EngineState: string(ch.Sandbox.State), EnvdAccessToken: ch.Sandbox.Run.AccessToken, Addr: ch.Sandbox.Addr}
	}
	return out, nil
}

// Rollback puts a sandbox back to a snapshot in place (same ID). A paused
// sandbox is rolled back too and runs afterwards; a failed rollback leaves
// it as it was.
func (s *Service) Rollback(ctx context.Context, id, snapshotID string) (Sandbox, error) {
	rec, err := s.st.GetSandbox(ctx, id)
	if err != nil {
		return Sandbox{}, err
	}
	if rec.State == store.StateHibernated {
		if _, _, err := s.Connect(ctx, id, 0); err != nil {
			return Sandbox{}, err
		}
	}
	es, err := s.eng.Rollback(ctx, id, snapshotID)
	if err != nil {
		return Sandbox{}, err
	}
	rec, err = s.st.UpdateSandbox(ctx, id, func(x *store.Sandbox) error { x.State = store.StateRunning; return nil })
	if err != nil {
		return Sandbox{}, err
	}
	s.setTarget(id, es.Addr, store.StateRunning)
	return Sandbox{Sandbox: rec, EngineState: string(es.State), EnvdAccessToken: es.Run.AccessToken, Addr: es.Addr}, nil
}

// reconcileSnapshots makes the store list exactly the user snapshots the
// node's repository holds.
func (s *Service) reconcileSnapshots(ctx context.Context) error {
	inRepo := map[string]bool{}
	for _, m := range s.eng.Snapshots().List() {
		if m.Kind != snapshot.KindSnapshot {
			continue
		}
		inRepo[m.ID] = true
		if _, err := s.st.GetSnapshot(ctx, m.ID); errdefs.IsNotFound(err) {
			if err := s.st.PutSnapshot(ctx, snapshotRecord(m)); err != nil {
				return err
			}
		}
	}
	cursor := ""
	for {
		page, next, err := s.st.ListSnapshots(ctx, store.SnapshotFilter{Limit: 500, Cursor: cursor})
		if err != nil {
			return err
		}
		for _, sn := range page {
			if !inRepo[sn.ID] {
				if err := s.st.DeleteSnapshot(ctx, sn.ID); err != nil && !errdefs.IsNotFound(err) {
					return err
				}
			}
		}
		if next == "" {
			return nil
		}
		cursor = next
	}
}

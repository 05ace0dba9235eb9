package control

import (
	"context"
	"fmt"
	"maps"

	"github.com/spore-run/spore/internal/errdefs"
	"github.com/spore-run/spore/internal/secrets"
	"github.com/spore-run/spore/internal/store"
)

// MaxSecretsPage bounds a page of ListSecrets (and is its default).
const MaxSecretsPage = 100

// infoOf is a secret without its sealed value.
func infoOf(s store.Secret) store.Secret {
	s.Sealed = nil
	if s.Metadata == nil {
		s.Metadata = map[string]string{}
	}
	return s
}

func (s *Service) secretsBox() (*secrets.Box, error) {
	if s.cfg.Secrets == nil {
		return nil, fmt.Errorf("%w: this API has no secrets key (start it with --secrets-key-file or --data-dir)", errdefs.ErrUnavailable)
	}
	return s.cfg.Secrets, nil
}

// checkSecret checks a value and metadata to store, and returns the box
// that seals the value.
func (s *Service) checkSecret(value string, md map[string]string) (*secrets.Box, error) {
	if err := secrets.ValidateValue(value); err != nil {
		return nil, err
	}
	if err := secrets.ValidateMetadata(md); err != nil {
		return nil, err
	}
	return s.secretsBox()
}

// validRef checks a secret ID or name as given in a path.
func validRef(ref string) (string, error) {
	if secrets.IsID(ref) {
		if len(ref) > secrets.MaxNameLen {
			return "", errdefs.Invalidf("secret ID %q is malformed", ref)
		}
		return ref, nil
	}
	return secrets.NormalizeName(ref)
}

// CreateSecret stores a new secret of a team ("": the default team), its
// value sealed, at version 1, and returns it without the value. A name
// the team uses is ErrAlreadyExists.
func (s *Service) CreateSecret(ctx context.Context, team, name, value string, md map[string]string) (store.Secret, error) {
	team = teamOr(team)
	name, err := secrets.NormalizeName(name)
	if err != nil {
		return store.Secret{}, err
	}
	box, err := s.checkSecret(value, md)
	if err != nil {
		return store.Secret{}, err
	}
	sec := store.Secret{ID: secrets.NewID(), TeamID: team, Name: name, Version: 1, Metadata: maps.Clone(md)}
	sec.Sealed = box.Seal(sec.ID, sec.Version, []byte(value))
	if err := s.st.CreateSecret(ctx, sec); err != nil {
		if errdefs.IsAlreadyExists(err) {
			return store.Secret{}, fmt.Errorf("%w: a secret named %q exists", errdefs.ErrAlreadyExists, name)
		}
		return store.Secret{}, err
	}
	got, err := s.st.GetSecret(ctx, team, sec.ID)
	if err != nil {
		return store.Secret{}, err
	}
	return infoOf(got), nil
}

// UpdateSecret stores value as the secret's next version; md, when not
// nil, replaces its metadata. Sandboxes whose network rules name it get
// the new value from their next request on.
func (s *Service) UpdateSecret(ctx context.Context, team, ref, value string, md map[string]string) (store.Secret, error) {
	team = teamOr(team)
	ref, err := validRef(ref)
	if err != nil {
		return store.Secret{}, err
	}
	box, err := s.checkSecret(value, md)
	if err != nil {
		return store.Secret{}, err
	}
	sec, err := s.st.UpdateSecret(ctx, team, ref, func(x *store.Secret) error {
		x.Version++
		x.Sealed = box.Seal(x.ID, x.Version, []byte(value))
		if md != nil {
			x.Metadata = maps.Clone(md)
		}
		return nil
	})
	if err != nil {
		return store.Secret{}, err
	}
	s.pushSecret(ctx, team, sec.Name)
	return infoOf(sec), nil
}

// GetSecret returns a team's secret by ID or name, without its value.
func (s *Service) GetSecret(ctx context.Context, team, ref string) (store.Secret, error) {
	team = teamOr(team)
	ref, err := validRef(ref)
	if err != nil {
		return store.Secret{}, err
	}
	sec, err := s.st.GetSecret(ctx, team, ref)
	if err != nil {
		return store.Secret{}, err
	}
	return infoOf(sec), nil
}

// ListSecrets returns a page of a team's secrets (oldest first, without values)
// and the token of the next ("" at the end). limit <= 0 or over
// MaxSecretsPage: MaxSecretsPage.
func (s *Service) ListSecrets(ctx context.Context, team string, limit int, next string) ([]store.Secret, string, error) {
	team = teamOr(team)
	if limit <= 0 || limit > MaxSecretsPage {
		limit = MaxSecretsPage
	}
	list, cursor, err := s.st.ListSecrets(ctx, team, limit, next)
	if err != nil {
		return nil, "", err
	}
	for i := range list {
		list[i] = infoOf(list[i])
	}
	return list, cursor, nil
}

// DeleteSecret removes a secret and every version of it; sandboxes whose
// network rules name it stop sending its value (those headers are left
// out).
func (s *Service) DeleteSecret(ctx context.Context, team, ref string) error {
	team = teamOr(team)
	ref, err := validRef(ref)
	if err != nil {
		return err
	}
	sec, err := s.st.GetSecret(ctx, team, ref)
	if err != nil {
		return err
	}
	if err := s.st.DeleteSecret(ctx, team, sec.ID); err != nil {
		return err
	}
	s.pushSecret(ctx, team, sec.Name)
	return nil
}

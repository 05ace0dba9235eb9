package storetest

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/spore-run/spore/internal/errdefs"
	"github.com/spore-run/spore/internal/store"
)

// Secrets: E2B's secrets API keeps them in the store (values sealed by the
// control plane; the store holds bytes it cannot read).

func testSecrets(t *testing.T, s store.Store) {
	ctx := context.Background()
	before := time.Now().UTC().Add(-time.Second)
	mk := func(id, name string) store.Secret {
		return store.Secret{ID: id, TeamID: teamA, Name: name, Version: 1, Metadata: map[string]string{"team": "ml"}, Sealed: []byte{1, 2, 3, 0, 255}}
	}
	if err := s.CreateSecret(ctx, mk("sec_a", "openai")); err != nil {
		t.Fatal(err)
	}
	if err := s.CreateSecret(ctx, mk("sec_a", "other")); !errdefs.IsAlreadyExists(err) {
		t.Fatalf("duplicate ID = %v, want already exists", err)
	}
	if err := s.CreateSecret(ctx, mk("sec_b", "openai")); !errdefs.IsAlreadyExists(err) {
		t.Fatalf("duplicate name = %v, want already exists", err)
	}
	for _, ref := range []string{"sec_a", "openai"} {
		got, err := s.GetSecret(ctx, teamA, ref)
		if err != nil {
			t.Fatalf("get %s: %v", ref, err)
		}
		if got.ID != "sec_a" || got.Name != "openai" || got.Version != 1 || got.Metadata["team"] != "ml" ||
			fmt.Sprint(got.Sealed) != "[1 2 3 0 255]" || got.CreatedAt.Before(before) || !got.UpdatedAt.Equal(got.CreatedAt) {
			t.Fatalf("get %s = %+v", ref, got)
		}
	}
	if _, err := s.GetSecret(ctx, teamA, "nope"); !errdefs.IsNotFound(err) {
		t.Fatalf("unknown secret: %v", err)
	}
	created, _ := s.GetSecret(ctx, teamA, "sec_a")
	time.Sleep(5 * time.Millisecond)
	up, err := s.UpdateSecret(ctx, teamA, "openai", func(x *store.Secret) error {
		x.Version++
		x.Sealed = []byte("new")
		x.ID, x.Name, x.CreatedAt = "sec_z", "renamed", time.Time{} // kept whatever fn does
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if up.ID != "sec_a" || up.Name != "openai" || up.Version != 2 || string(up.Sealed) != "new" ||
		!up.CreatedAt.Equal(created.CreatedAt) || !up.UpdatedAt.After(created.UpdatedAt) {
		t.Fatalf("update = %+v (created %+v)", up, created)
	}
	if got, _ := s.GetSecret(ctx, teamA, "sec_a"); got.Version != 2 || string(got.Sealed) != "new" {
		t.Fatalf("after update: %+v", got)
	}
	if _, err := s.UpdateSecret(ctx, teamA, "sec_a", func(*store.Secret) error { return errdefs.Invalidf("no") }); !errdefs.IsInvalidArgument(err) {
		t.Fatalf("aborted update: %v", err)
	}
	if got, _ := s.GetSecret(ctx, teamA, "sec_a"); got.Version != 2 {
		t.Fatalf("an aborted update changed the row: %+v", got)
	}
	if _, err := s.UpdateSecret(ctx, teamA, "nope", func(*store.Secret) error { return nil }); !errdefs.IsNotFound(err) {
		t.Fatalf("update of an unknown secret: %v", err)
	}

	// Paging, oldest first.
	for i := range 4 {
		if err := s.CreateSecret(ctx, mk(fmt.Sprintf("sec_p%d", i), fmt.Sprintf("p%d", i))); err != nil {
			t.Fatal(err)
		}
	}
	var names []string
	cursor := ""
	for pages := 0; ; pages++ {
		list, next, err := s.ListSecrets(ctx, teamA, 2, cursor)
		if err != nil {
			t.Fatal(err)
		}
		for _, x := range list {
			names = append(names, x.Name)
		}
		if next == "" {
			break
		}
		if pages > 5 {
			t.Fatal("paging does not end")
		}
		cursor = next
	}
	if fmt.Sprint(names) != "[openai p0 p1 p2 p3]" {
		t.Fatalf("paged list = %v", names)
	}
	if all, next, err := s.ListSecrets(ctx, teamA, 0, ""); err != nil || len(all) != 5 || next != "" {
		t.Fatalf("unlimited list: %d %q %v", len(all), next, err)
	}
	if _, _, err := s.ListSecrets(ctx, teamA, 2, "garbage!"); !errdefs.IsInvalidArgument(err) {
		t.Fatalf("malformed cursor: %v", err)
	}

	for _, ref := range []string{"openai", "sec_p0"} {
		if err := s.DeleteSecret(ctx, teamA, ref); err != nil {
			t.Fatalf("delete %s: %v", ref, err)
		}
		if _, err := s.GetSecret(ctx, teamA, ref); !errdefs.IsNotFound(err) {
			t.Fatalf("after delete %s: %v", ref, err)
		}
		if err := s.DeleteSecret(ctx, teamA, ref); !errdefs.IsNotFound(err) {
			t.Fatalf("second delete %s: %v", ref, err)
		}
	}
	// A deleted name can be taken again, under a new ID.
	if err := s.CreateSecret(ctx, mk("sec_c", "openai")); err != nil {
		t.Fatal(err)
	}
}

// Two handles updating one secret: no update lost.
func testSecretNoLostUpdate(t *testing.T, open2 func(*testing.T) (store.Store, store.Store)) {
	a, b := open2(t)
	ctx := context.Background()
	if err := a.CreateSecret(ctx, store.Secret{ID: "sec_n", TeamID: teamA, Name: "n", Version: 1, Sealed: []byte("x")}); err != nil {
		t.Fatal(err)
	}
	const each = 10
	var wg sync.WaitGroup
	errs := make(chan error, 2*each)
	for _, st := range []store.Store{a, b} {
		wg.Go(func() {
			for range each {
				if _, err := st.UpdateSecret(ctx, teamA, "n", func(x *store.Secret) error { x.Version++; return nil }); err != nil {
					errs <- err
				}
			}
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	if got, _ := a.GetSecret(ctx, teamA, "sec_n"); got.Version != 1+2*each {
		t.Fatalf("version %d after %d updates from two handles", got.Version, 2*each)
	}
}

package storetest

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/spore-run/spore/internal/errdefs"
	"github.com/spore-run/spore/internal/store"
)

// testHibernationClaim is what the reaper's hibernation relies on across
// replicas: its claim (HibernatingAt, by compare-and-swap at the version
// it judged) loses to a change another handle committed first, and a
// change that reads the row after the claim sees it exactly (the claim's
// time is compared for equality), in an update's read-change-write too.
func testHibernationClaim(t *testing.T, two func(*testing.T) (store.Store, store.Store)) {
	ctx := context.Background()
	reaper, conn := two(t)
	if err := reaper.CreateSandbox(ctx, sb("h", nil)); err != nil {
		t.Fatal(err)
	}
	judged, err := reaper.GetSandbox(ctx, "h")
	if err != nil {
		t.Fatal(err)
	}
	// A connect through the other handle commits first: the claim fails.
	if _, err := conn.UpdateSandbox(ctx, "h", func(x *store.Sandbox) error { x.EndAt = x.EndAt.Add(time.Hour); return nil }); err != nil {
		t.Fatal(err)
	}
	claim := judged
	claim.HibernatingAt = time.Now().UTC() // nanoseconds: kept exactly
	if _, err := reaper.CompareAndSwapSandbox(ctx, claim); !errdefs.IsConflict(err) {
		t.Fatalf("claim at a stale version = %v, want conflict", err)
	}
	if got, _ := conn.GetSandbox(ctx, "h"); !got.HibernatingAt.IsZero() {
		t.Fatalf("a lost claim is on the row: %v", got.HibernatingAt)
	}
	// The claim at the current version wins; the other handle sees it.
	judged, _ = reaper.GetSandbox(ctx, "h")
	claim = judged
	claim.HibernatingAt = time.Now().UTC()
	claimed, err := reaper.CompareAndSwapSandbox(ctx, claim)
	if err != nil || !claimed.HibernatingAt.Equal(claim.HibernatingAt) {
		t.Fatalf("claim = %v, %v", claimed.HibernatingAt, err)
	}
	seen, err := conn.GetSandbox(ctx, "h")
	if err != nil || !seen.HibernatingAt.Equal(claim.HibernatingAt) || seen.Version != claimed.Version {
		t.Fatalf("the other handle reads claim %v version %d (%v); want %v version %d", seen.HibernatingAt, seen.Version, err, claim.HibernatingAt, claimed.Version)
	}
	// A connect that read before the claim writes only at what it read.
	errChanged := errors.New("changed")
	if _, err := conn.UpdateSandbox(ctx, "h", func(x *store.Sandbox) error {
		if x.Version != judged.Version {
			return errChanged
		}
		return nil
	}); !errors.Is(err, errChanged) {
		t.Fatalf("update conditioned on the version read before the claim = %v, want it refused", err)
	}
	// The reaper records the hibernation and clears its own claim.
	done, err := reaper.UpdateSandbox(ctx, "h", func(x *store.Sandbox) error {
		if !x.HibernatingAt.Equal(claimed.HibernatingAt) {
			return errors.New("claim not found as written")
		}
		x.State, x.HibernatingAt = store.StateHibernated, time.Time{}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if got, _ := conn.GetSandbox(ctx, "h"); got.State != store.StateHibernated || !got.HibernatingAt.IsZero() || got.Version != done.Version {
		t.Fatalf("after the record: %+v", got)
	}
}

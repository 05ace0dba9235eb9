package storetest

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/spore-run/spore/internal/errdefs"
	"github.com/spore-run/spore/internal/store"
)

// testAudit: records are appended with increasing Seq and read back
// whole, newest first, by team, resource and time range, in pages that
// neither repeat nor skip (also among records of one millisecond);
// pruning removes only what is older than asked, at most limit.
func testAudit(t *testing.T, s store.Store) {
	ctx := context.Background()
	base := time.Date(2026, 12, 1, 0, 0, 0, 0, time.UTC)
	var recs []store.AuditRecord
	for i := range 30 {
		team := []string{teamA, teamB}[i%2]
		recs = append(recs, store.AuditRecord{
			At:     base.Add(time.Duration(i/3) * time.Minute), // three to a minute
			TeamID: team, KeyID: "k" + team, KeyName: "key of " + team, Kind: store.AuditAPI,
			Action: "POST /v2/sandboxes", Resource: fmt.Sprintf("i%d", i%4), Status: 201, Remote: "10.0.0.1", Detail: fmt.Sprint(i),
		})
	}
	if err := s.AppendAudit(ctx, recs[:10]); err != nil {
		t.Fatal(err)
	}
	if err := s.AppendAudit(ctx, recs[10:]); err != nil {
		t.Fatal(err)
	}
	if err := s.AppendAudit(ctx, nil); err != nil {
		t.Fatal(err)
	}
	all := pagedAudit(t, s, store.AuditFilter{TeamID: teamA, Limit: 4})
	if len(all) != 15 {
		t.Fatalf("team A's records: %d, want 15", len(all))
	}
	for i, r := range all {
		want := recs[28-2*i] // newest first: 28, 26, ...
		if r.Detail != want.Detail || r.TeamID != teamA || r.KeyName != want.KeyName || !r.At.Equal(want.At) || r.Status != 201 ||
			r.Remote != "10.0.0.1" || r.Kind != store.AuditAPI || r.Action != want.Action || r.Resource != want.Resource || r.Seq == 0 {
			t.Fatalf("record %d = %+v, want %+v", i, r, want)
		}
		if i > 0 && r.Seq >= all[i-1].Seq {
			t.Fatalf("seq not decreasing newest first: %d then %d", all[i-1].Seq, r.Seq)
		}
	}
	if every := pagedAudit(t, s, store.AuditFilter{Limit: 7}); len(every) != 30 {
		t.Fatalf("every team's records: %d, want 30", len(every))
	}
	// By resource: i0 is records 0, 4, 8, ... of team A (even).
	byRes := pagedAudit(t, s, store.AuditFilter{TeamID: teamA, Resource: "i0"})
	if len(byRes) != 8 || byRes[0].Detail != "28" || byRes[7].Detail != "0" {
		t.Fatalf("team A's records of i0: %+v", byRes)
	}
	// A time range: minutes 2 and 3 hold records 6-11; team B's are 7, 9, 11.
	win := pagedAudit(t, s, store.AuditFilter{TeamID: teamB, Since: base.Add(2 * time.Minute), Until: base.Add(4 * time.Minute), Limit: 1})
	if len(win) != 3 || win[0].Detail != "11" || win[2].Detail != "7" {
		t.Fatalf("team B's records in minutes 2-3: %+v", win)
	}
	if _, _, err := s.ListAudit(ctx, store.AuditFilter{Cursor: "nope"}); !errdefs.IsInvalidArgument(err) {
		t.Fatalf("a malformed cursor: %v", err)
	}
	// Pruning: what is older than minute 5 (records 0-14), 10 at a time.
	n, err := s.PruneAudit(ctx, base.Add(5*time.Minute), 10)
	if err != nil || n != 10 {
		t.Fatalf("prune = %d %v, want 10", n, err)
	}
	if n, err = s.PruneAudit(ctx, base.Add(5*time.Minute), 10); err != nil || n != 5 {
		t.Fatalf("prune again = %d %v, want 5", n, err)
	}
	left := pagedAudit(t, s, store.AuditFilter{})
	if len(left) != 15 || left[len(left)-1].Detail != "15" {
		t.Fatalf("after pruning: %d records, oldest %+v", len(left), left[len(left)-1])
	}
}

func pagedAudit(t *testing.T, s store.Store, f store.AuditFilter) []store.AuditRecord {
	t.Helper()
	var out []store.AuditRecord
	seen := map[int64]bool{}
	for {
		page, next, err := s.ListAudit(context.Background(), f)
		if err != nil {
			t.Fatal(err)
		}
		for _, r := range page {
			if seen[r.Seq] {
				t.Fatalf("record %d listed twice", r.Seq)
			}
			seen[r.Seq] = true
		}
		out = append(out, page...)
		if next == "" {
			return out
		}
		if len(page) == 0 {
			t.Fatal("an empty page with a next cursor")
		}
		f.Cursor = next
	}
}

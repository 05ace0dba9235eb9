package postgres_test

import (
	"context"
	"fmt"
	"os"
	"sort"
	"strconv"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/spore-run/spore/internal/store"
	"github.com/spore-run/spore/internal/store/postgres"
	"github.com/spore-run/spore/internal/testenv"
)

// BenchmarkAuditAt10M: the audit trail's queries and writes with 10
// million records of one team in the table (SPORE_AUDIT_ROWS overrides),
// plus 100 000 of another:
//
//	go test -run '^$' -bench AuditAt10M -benchtime 1x -timeout 60m ./internal/store/postgres/
//
// The rows span 28 hours (10 ms apart) over 100 000 resources. Reported:
// p50 and p99 of 200 queries each: the newest page (100), a resource's
// newest page, a page of an hour in the middle, and the page after a
// cursor in the middle; and one 100-record append's cost per record.
func BenchmarkAuditAt10M(b *testing.B) {
	rows := 10_000_000
	if v := os.Getenv("SPORE_AUDIT_ROWS"); v != "" {
		rows, _ = strconv.Atoi(v)
	}
	ctx := context.Background()
	dsn := testenv.Postgres(b)
	s, err := postgres.Open(ctx, dsn)
	if err != nil {
		b.Fatal(err)
	}
	defer s.Close()
	conn, err := pgx.Connect(ctx, dsn)
	if err != nil {
		b.Fatal(err)
	}
	defer conn.Close(ctx)
	base := time.Date(2026, 11, 1, 0, 0, 0, 0, time.UTC)
	t0 := time.Now()
	for _, t := range []struct {
		team string
		n    int
	}{{"big", rows}, {"small", 100_000}} {
		// In chunks of a million: one statement each.
		for from := 0; from < t.n; from += 1_000_000 {
			to := min(from+1_000_000, t.n) - 1
			if _, err := conn.Exec(ctx, `INSERT INTO audit(at, team_id, key_id, key_name, kind, action, resource, status, remote, detail)
				SELECT $1::bigint + i * 10, $2, 'k1', 'ci', 'api', 'POST /sandboxes/{sandboxID}/pause', 'i' || (i % 100000), 204, '10.0.0.1', ''
				FROM generate_series($3::bigint, $4::bigint) AS i`, base.UnixMilli(), t.team, from, to); err != nil {
				b.Fatal(err)
			}
		}
	}
	if _, err := conn.Exec(ctx, `ANALYZE audit`); err != nil {
		b.Fatal(err)
	}
	fmt.Fprintf(os.Stderr, "audit: %d records in %v\n", rows+100_000, time.Since(t0).Round(time.Second))
	mid := base.Add(time.Duration(rows/2) * 10 * time.Millisecond)
	page, _, err := s.ListAudit(ctx, store.AuditFilter{TeamID: "big", Until: mid, Limit: 1})
	if err != nil || len(page) != 1 {
		b.Fatalf("the middle: %v %v", page, err)
	}
	midCursor := store.EncodeAuditCursor(page[0].At.UnixMilli(), page[0].Seq)
	measure := func(name string, f store.AuditFilter, want int) {
		ds := make([]time.Duration, 200)
		for i := range ds {
			t := time.Now()
			got, _, err := s.ListAudit(ctx, f)
			ds[i] = time.Since(t)
			if err != nil || len(got) != want {
				b.Fatalf("%s: %d records, %v", name, len(got), err)
			}
		}
		sort.Slice(ds, func(i, j int) bool { return ds[i] < ds[j] })
		b.ReportMetric(float64(ds[100].Microseconds()), name+"-p50-µs")
		b.ReportMetric(float64(ds[198].Microseconds()), name+"-p99-µs")
		fmt.Fprintf(os.Stderr, "%s: p50 %v p99 %v\n", name, ds[100], ds[198])
	}
	for range b.N {
		measure("newest", store.AuditFilter{TeamID: "big", Limit: 100}, 100)
		measure("resource", store.AuditFilter{TeamID: "big", Resource: "i4242", Limit: 100}, min(100, rows/100_000))
		measure("hour", store.AuditFilter{TeamID: "big", Since: mid, Until: mid.Add(time.Hour), Limit: 100}, 100)
		measure("after-cursor", store.AuditFilter{TeamID: "big", Cursor: midCursor, Limit: 100}, 100)
		recs := make([]store.AuditRecord, 100)
		for i := range recs {
			recs[i] = store.AuditRecord{At: time.Now(), TeamID: "big", KeyID: "k1", KeyName: "ci", Kind: store.AuditAPI, Action: "POST /v2/sandboxes", Resource: "inew", Status: 201, Remote: "10.0.0.1"}
		}
		ds := make([]time.Duration, 50)
		for i := range ds {
			t := time.Now()
			if err := s.AppendAudit(ctx, recs); err != nil {
				b.Fatal(err)
			}
			ds[i] = time.Since(t) / 100
		}
		sort.Slice(ds, func(i, j int) bool { return ds[i] < ds[j] })
		b.ReportMetric(float64(ds[25].Microseconds()), "append-per-record-p50-µs")
		fmt.Fprintf(os.Stderr, "append (batches of 100): p50 %v per record\n", ds[25])
	}
}

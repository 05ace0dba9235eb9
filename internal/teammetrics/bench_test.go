package teammetrics_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/spore-run/spore/internal/store"
	"github.com/spore-run/spore/internal/store/postgres"
	"github.com/spore-run/spore/internal/teammetrics"
	"github.com/spore-run/spore/internal/testenv"
)

func TestMain(m *testing.M) { testenv.Main(m) }

// BenchmarkSample is one replica's sample (what it costs every 10 s) with
// 1,000 live sandboxes of 20 teams and 100,000 audit records of the last
// half hour, 500 of them creates in the steps counted; and a day's series
// of one team. On SQLite and PostgreSQL:
//
//	go test -run '^$' -bench . -benchtime 100x ./internal/teammetrics/
func BenchmarkSample(b *testing.B) {
	for _, backend := range []string{"sqlite", "postgres"} {
		b.Run(backend, func(b *testing.B) {
			ctx := context.Background()
			var st interface {
				store.Store
			}
			if backend == "sqlite" {
				st = open(b)
			} else {
				pg, err := postgres.Open(ctx, testenv.Postgres(b))
				if err != nil {
					b.Fatal(err)
				}
				b.Cleanup(func() { pg.Close() })
				st = pg
			}
			for i := range 20 {
				if err := st.CreateTeam(ctx, store.Team{ID: fmt.Sprintf("t%02d", i), Name: fmt.Sprintf("team-%02d", i)}); err != nil {
					b.Fatal(err)
				}
			}
			for i := range 1000 {
				if err := st.CreateSandbox(ctx, store.Sandbox{ID: fmt.Sprintf("i%04d", i), TeamID: fmt.Sprintf("t%02d", i%20), TemplateID: "base",
					State: store.StateRunning, CPUCount: 1, MemoryMB: 256}); err != nil {
					b.Fatal(err)
				}
			}
			now := time.Now()
			recs := make([]store.AuditRecord, 0, 1000)
			for i := range 100_000 {
				action := "POST /sandboxes/{sandboxID}/pause"
				at := now.Add(-time.Duration(i) * 18 * time.Millisecond) // the last 30 minutes
				if i%200 == 0 {
					action = teammetrics.Created
				}
				recs = append(recs, store.AuditRecord{At: at, TeamID: fmt.Sprintf("t%02d", i%20), Kind: store.AuditAPI, Action: action, Resource: "x"})
				if len(recs) == cap(recs) {
					if err := st.AppendAudit(ctx, recs); err != nil {
						b.Fatal(err)
					}
					recs = recs[:0]
				}
			}
			b.Run("sample", func(b *testing.B) {
				for i := range b.N {
					if err := teammetrics.SampleOnce(ctx, st, now.Add(time.Duration(i)*time.Millisecond)); err != nil {
						b.Fatal(err)
					}
				}
			})
			var day []store.TeamSample
			for i := range 8640 {
				day = append(day, store.TeamSample{TeamID: "t00", At: now.Add(-time.Duration(i) * teammetrics.Step).Truncate(teammetrics.Step), Concurrent: i % 50, Starts: i % 3})
			}
			if err := st.NoteTeamSamples(ctx, day); err != nil {
				b.Fatal(err)
			}
			from, to, err := teammetrics.Range(now.Add(-24*time.Hour).Unix(), now.Unix(), now)
			if err != nil {
				b.Fatal(err)
			}
			b.Run("series-day", func(b *testing.B) {
				for range b.N {
					if pts, err := teammetrics.Series(ctx, st, "t00", from, to); err != nil || len(pts) < 900 {
						b.Fatalf("%d points, %v", len(pts), err)
					}
				}
			})
		})
	}
}

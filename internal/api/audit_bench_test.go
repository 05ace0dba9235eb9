package api_test

import (
	"context"
	"fmt"
	"net/http"
	"net/http/httptest"
	"sort"
	"testing"
	"time"

	"github.com/spore-run/spore/internal/api"
	"github.com/spore-run/spore/internal/audit"
	"github.com/spore-run/spore/internal/ids"
	"github.com/spore-run/spore/internal/store"
)

// BenchmarkAuditWrite is what recording a state-changing call adds, on
// SQLite and PostgreSQL:
//
//	go test -run '^$' -bench AuditWrite -benchtime 2000x ./internal/api/
//
// The call is a POST on one of the caller's sandboxes that does nothing
// more (an E2B route answered 501), without and then with the audit
// writer; p50 and p99 per call over loopback HTTP. The record is queued,
// and written in batches by the writer's goroutine.
func BenchmarkAuditWrite(b *testing.B) {
	for _, backend := range []string{"sqlite", "postgres"} {
		b.Run(backend, func(b *testing.B) {
			st := benchStore(b, backend)
			id := ids.New('i')
			if err := st.CreateSandbox(context.Background(), store.Sandbox{ID: id, TeamID: store.DefaultTeam, State: store.StateRunning,
				TemplateID: "base", EndAt: time.Now().Add(time.Hour)}); err != nil {
				b.Fatal(err)
			}
			w := audit.NewWriter(st, nil)
			b.Cleanup(func() { w.Close() })
			// The two servers' calls alternate, so both see the same
			// machine (caches, other load).
			post := func(url string) time.Duration {
				req, _ := http.NewRequest("POST", url+"/sandboxes/"+id+"/refreshes", nil)
				req.Header.Set("X-API-KEY", key)
				t0 := time.Now()
				resp, err := http.DefaultClient.Do(req)
				d := time.Since(t0)
				if err != nil {
					b.Fatal(err)
				}
				resp.Body.Close()
				if resp.StatusCode != http.StatusNotImplemented {
					b.Fatalf("POST refreshes = %d, want 501", resp.StatusCode)
				}
				return d
			}
			names := []string{"unaudited", "audited"}
			var urls []string
			for _, rec := range []audit.Recorder{nil, w} {
				srv := httptest.NewServer(api.New(api.Config{Store: st, Audit: rec}))
				b.Cleanup(srv.Close)
				urls = append(urls, srv.URL)
				post(srv.URL)
				post(srv.URL)
			}
			ds := [2][]time.Duration{make([]time.Duration, b.N), make([]time.Duration, b.N)}
			for i := range b.N {
				for k := range urls {
					ds[k][i] = post(urls[k])
				}
			}
			for k, name := range names {
				d := ds[k]
				sort.Slice(d, func(i, j int) bool { return d[i] < d[j] })
				b.ReportMetric(float64(d[len(d)/2].Microseconds()), name+"-p50-µs")
				b.ReportMetric(float64(d[len(d)*99/100].Microseconds()), name+"-p99-µs")
				fmt.Fprintf(testWriter{b}, "%s %s: p50 %v p99 %v\n", backend, name, d[len(d)/2], d[len(d)*99/100])
			}
			if err := w.Flush(context.Background()); err != nil {
				b.Fatal(err)
			}
			recs, _, err := st.ListAudit(context.Background(), store.AuditFilter{TeamID: store.DefaultTeam, Resource: id, Limit: 1})
			if err != nil || len(recs) != 1 || recs[0].Status != http.StatusNotImplemented {
				b.Fatalf("the audited calls' records: %+v %v", recs, err)
			}
		})
	}
}

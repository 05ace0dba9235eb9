package api_test

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"testing"
	"time"

	"github.com/spore-run/spore/internal/api"
	"github.com/spore-run/spore/internal/store"
)

// BenchmarkScrape is one GET /metrics with 1,000 sandboxes on 10 nodes and
// 200 snapshots in the store, on SQLite and PostgreSQL:
//
//	go test -run '^$' -bench Scrape ./internal/api/
func BenchmarkScrape(b *testing.B) {
	for _, backend := range []string{"sqlite", "postgres"} {
		b.Run(backend, func(b *testing.B) {
			ctx := context.Background()
			st := benchStore(b, backend)
			free := int64(2048)
			for n := range 10 {
				if _, err := st.UpsertNode(ctx, store.Node{ID: fmt.Sprintf("n%d", n), Capacity: store.Resources{MemoryMB: 65536, VCPUs: 16, Sandboxes: 500},
					MemoryFreeMB: &free, Heartbeat: time.Now(), State: store.NodeReady}); err != nil {
					b.Fatal(err)
				}
			}
			states := []string{store.StateRunning, store.StateRunning, store.StatePaused, store.StateHibernated}
			for i := range 1000 {
				if err := st.CreateSandbox(ctx, store.Sandbox{ID: fmt.Sprintf("i%04d", i), TeamID: store.DefaultTeam, TemplateID: "base",
					State: states[i%len(states)], NodeID: fmt.Sprintf("n%d", i%10)}); err != nil {
					b.Fatal(err)
				}
			}
			for i := range 200 {
				if err := st.PutSnapshot(ctx, store.Snapshot{ID: fmt.Sprintf("s%04d", i), TeamID: store.DefaultTeam, NodeID: "n0", Kind: "snapshot", SizeBytes: 1 << 20}); err != nil {
					b.Fatal(err)
				}
			}
			srv := httptest.NewServer(api.New(api.Config{Store: st}))
			defer srv.Close()
			var size int
			b.ResetTimer()
			for range b.N {
				req, _ := http.NewRequest(http.MethodGet, srv.URL+"/metrics", nil)
				req.Header.Set("Authorization", "Bearer "+key)
				resp, err := http.DefaultClient.Do(req)
				if err != nil {
					b.Fatal(err)
				}
				body, _ := io.ReadAll(resp.Body)
				resp.Body.Close()
				if resp.StatusCode != 200 {
					b.Fatalf("scrape: %d %s", resp.StatusCode, body)
				}
				size = len(body)
			}
			b.ReportMetric(float64(size), "bytes/scrape")
		})
	}
}

package api_test

import (
	"context"
	"fmt"
	"net/http"
	"net/http/httptest"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/spore-run/spore/internal/api"
	"github.com/spore-run/spore/internal/apikey"
	"github.com/spore-run/spore/internal/ids"
	"github.com/spore-run/spore/internal/store"
	"github.com/spore-run/spore/internal/store/postgres"
	"github.com/spore-run/spore/internal/testenv"
)

// BenchmarkTeamCheck is what confining a call to its team adds, on
// SQLite and PostgreSQL:
//
//	go test -run '^$' -bench TeamCheck -benchtime 2000x ./internal/api/
//
// auth-only is a route with the key check and no sandbox (E2B's metrics
// of many sandboxes naming none: a 400); sandbox-cold a sandbox route
// (E2B's refresh with a negative duration: a 400 once the team check
// passed) on a sandbox the replica
// has not seen (one store read for its team); sandbox-warm the same
// sandbox again (its team kept in memory). The differences are the team
// check's cost: p50 and p99 per call, over loopback HTTP.
func BenchmarkTeamCheck(b *testing.B) {
	for _, backend := range []string{"sqlite", "postgres"} {
		b.Run(backend, func(b *testing.B) {
			st := benchStore(b, backend)
			srv := httptest.NewServer(api.New(api.Config{Store: st}))
			b.Cleanup(srv.Close)
			sandboxes := make([]string, b.N)
			for i := range sandboxes {
				sandboxes[i] = ids.New('i')
				if err := st.CreateSandbox(context.Background(), store.Sandbox{ID: sandboxes[i], TeamID: store.DefaultTeam, State: store.StateRunning,
					TemplateID: "base", EndAt: time.Now().Add(time.Hour)}); err != nil {
					b.Fatal(err)
				}
			}
			// Each call is refused (400) right after the checks measured:
			// no work of the route's own is timed.
			get := func(path string) time.Duration {
				method, p, _ := strings.Cut(path, " ")
				req, _ := http.NewRequest(method, srv.URL+p, strings.NewReader(`{"duration":-1}`))
				req.Header.Set("X-API-KEY", key)
				t0 := time.Now()
				resp, err := http.DefaultClient.Do(req)
				d := time.Since(t0)
				if err != nil {
					b.Fatal(err)
				}
				resp.Body.Close()
				if resp.StatusCode != http.StatusBadRequest {
					b.Fatalf("%s = %d, want 400", path, resp.StatusCode)
				}
				return d
			}
			get("GET /sandboxes/metrics") // the keys loaded, a connection open
			for _, c := range []struct {
				name string
				path func(i int) string
			}{
				{"auth-only", func(int) string { return "GET /sandboxes/metrics" }},
				{"sandbox-cold", func(i int) string { return "POST /sandboxes/" + sandboxes[i] + "/refreshes" }},
				{"sandbox-warm", func(i int) string { return "POST /sandboxes/" + sandboxes[i] + "/refreshes" }},
			} {
				ds := make([]time.Duration, b.N)
				for i := range ds {
					ds[i] = get(c.path(i))
				}
				sort.Slice(ds, func(i, j int) bool { return ds[i] < ds[j] })
				b.ReportMetric(float64(ds[len(ds)/2].Microseconds()), c.name+"-p50-µs")
				b.ReportMetric(float64(ds[len(ds)*99/100].Microseconds()), c.name+"-p99-µs")
				fmt.Fprintf(testWriter{b}, "%s %s: p50 %v p99 %v\n", backend, c.name, ds[len(ds)/2], ds[len(ds)*99/100])
			}
		})
	}
}

// benchStore is a store of backend ("sqlite" or "postgres") holding the
// test's key.
func benchStore(b *testing.B, backend string) store.Store {
	if backend == "sqlite" {
		return openStore(b)
	}
	pg, err := postgres.Open(context.Background(), testenv.Postgres(b))
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { pg.Close() })
	if err := pg.AddAPIKey(context.Background(), store.APIKey{ID: "k", Hash: apikey.Hash(key), CreatedAt: time.Now()}); err != nil {
		b.Fatal(err)
	}
	return pg
}

type testWriter struct{ b *testing.B }

func (w testWriter) Write(p []byte) (int, error) {
	w.b.Log(string(p))
	return len(p), nil
}

// BenchmarkTemplateName is what per-team template names add to a call
// that names a template, on SQLite and PostgreSQL:
//
//	go test -run '^$' -bench TemplateName -benchtime 2000x ./internal/api/
//
// default-team reads GET /templates/app as the default team (the name is
// the key: no lookup added); other-team the same name as another team,
// whose own template "app" is found under its key first. The difference
// is the name lookup's cost: p50 and p99 per call, over loopback HTTP.
func BenchmarkTemplateName(b *testing.B) {
	for _, backend := range []string{"sqlite", "postgres"} {
		b.Run(backend, func(b *testing.B) {
			ctx := context.Background()
			st := benchStore(b, backend)
			team := store.Team{ID: ids.New('t'), Name: "bench-" + ids.New('x')[1:8], CreatedAt: time.Now()}
			if err := st.CreateTeam(ctx, team); err != nil {
				b.Fatal(err)
			}
			const teamKey = "spore_bench_team_key_of_the_other_team"
			if err := st.AddAPIKey(ctx, store.APIKey{ID: ids.New('k'), TeamID: team.ID, Role: store.RoleAdmin, Hash: apikey.Hash(teamKey), CreatedAt: time.Now()}); err != nil {
				b.Fatal(err)
			}
			for _, tp := range []store.Template{{Name: "app", SnapshotID: "s-default"}, {Name: store.TemplateKey(team.ID, "app"), TeamID: team.ID, SnapshotID: "s-team"}} {
				if _, err := st.PutTemplate(ctx, tp); err != nil {
					b.Fatal(err)
				}
			}
			srv := httptest.NewServer(api.New(api.Config{Store: st}))
			b.Cleanup(srv.Close)
			get := func(k string) time.Duration {
				req, _ := http.NewRequest("GET", srv.URL+"/templates/app", nil)
				req.Header.Set("X-API-KEY", k)
				t0 := time.Now()
				resp, err := http.DefaultClient.Do(req)
				d := time.Since(t0)
				if err != nil {
					b.Fatal(err)
				}
				resp.Body.Close()
				if resp.StatusCode != http.StatusOK {
					b.Fatalf("GET /templates/app = %d", resp.StatusCode)
				}
				return d
			}
			get(key)
			get(teamKey)
			for _, c := range []struct{ name, key string }{{"default-team", key}, {"other-team", teamKey}} {
				ds := make([]time.Duration, b.N)
				for i := range ds {
					ds[i] = get(c.key)
				}
				sort.Slice(ds, func(i, j int) bool { return ds[i] < ds[j] })
				b.ReportMetric(float64(ds[len(ds)/2].Microseconds()), c.name+"-p50-µs")
				b.ReportMetric(float64(ds[len(ds)*99/100].Microseconds()), c.name+"-p99-µs")
				fmt.Fprintf(testWriter{b}, "%s %s: p50 %v p99 %v\n", backend, c.name, ds[len(ds)/2], ds[len(ds)*99/100])
			}
		})
	}
}

package api_test

import (
	"bytes"
	"context"
	"encoding/json"
	"net/http/httptest"
	"os"
	"path/filepath"
	"regexp"
	"testing"
	"time"

	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"

	"github.com/spore-run/spore/internal/api"
	"github.com/spore-run/spore/internal/apikey"
	"github.com/spore-run/spore/internal/control/controltest"
	"github.com/spore-run/spore/internal/metrics"
	"github.com/spore-run/spore/internal/store"
	"github.com/spore-run/spore/internal/store/sqlite"
)

// scrape reads GET /metrics as the operator into metric families.
func (f *fnode) scrape() map[string]*dto.MetricFamily {
	f.t.Helper()
	b := f.want(200, "GET", "/metrics", "")
	p := expfmt.NewTextParser(model.UTF8Validation)
	fams, err := p.TextToMetricFamilies(bytes.NewReader(b))
	if err != nil {
		f.t.Fatalf("parse /metrics: %v\n%s", err, b)
	}
	return fams
}

// value is the metric of family name whose labels include want, or -1.
func value(fams map[string]*dto.MetricFamily, name string, want map[string]string) float64 {
	fam, ok := fams[name]
	if !ok {
		return -1
	}
next:
	for _, m := range fam.GetMetric() {
		got := map[string]string{}
		for _, l := range m.GetLabel() {
			got[l.GetName()] = l.GetValue()
		}
		for k, v := range want {
			if got[k] != v {
				continue next
			}
		}
		switch {
		case m.Gauge != nil:
			return m.GetGauge().GetValue()
		case m.Counter != nil:
			return m.GetCounter().GetValue()
		case m.Histogram != nil:
			return float64(m.GetHistogram().GetSampleCount())
		}
	}
	return -1
}

// GET /metrics: operator keys only; the fleet's sandboxes by node and
// state and each team's live ones, read from the store at the scrape; the
// replica's requests by route pattern and code, with their latency.
func TestMetrics(t *testing.T) { controltest.Each(t, testMetrics) }

func testMetrics(t *testing.T, _ controltest.Config) {
	f := newFnode(t)
	var member api.CreatedKey
	json.Unmarshal(f.want(201, "POST", "/api-keys", `{"name":"m","role":"member"}`), &member)
	f.want(401, "GET", "/metrics", "", "X-API-KEY", "")
	f.want(401, "GET", "/metrics", "", "X-API-KEY", "e2b_not-a-key")
	f.want(403, "GET", "/metrics", "", "X-API-KEY", member.Key)

	var a, b api.SandboxResponse
	json.Unmarshal(f.want(201, "POST", "/v2/sandboxes", `{"templateID":"base","timeout":300}`), &a)
	json.Unmarshal(f.want(201, "POST", "/v2/sandboxes", `{"templateID":"base","timeout":300}`), &b)
	f.want(204, "POST", "/sandboxes/"+b.SandboxID+"/pause", "")
	f.want(404, "GET", "/sandboxes/ino-such-sandbox", "")
	fams := f.scrape()
	for _, c := range []struct {
		name   string
		labels map[string]string
		want   float64
	}{
		{"spore_sandboxes", map[string]string{"node": controltest.NodeID, "state": store.StateRunning}, 1},
		{"spore_sandboxes", map[string]string{"node": controltest.NodeID, "state": store.StatePaused}, 1},
		{"spore_team_live_sandboxes", map[string]string{"team": store.DefaultTeam}, 2},
		{"spore_api_requests_total", map[string]string{"route": "POST /v2/sandboxes", "code": "201"}, 2},
		{"spore_api_requests_total", map[string]string{"route": "GET /sandboxes/{sandboxID}", "code": "404"}, 1},
		{"spore_api_requests_total", map[string]string{"route": "GET /metrics", "code": "403"}, 1},
		{"spore_api_request_duration_seconds", map[string]string{"route": "POST /v2/sandboxes", "code": "201"}, 2},
	} {
		if got := value(fams, c.name, c.labels); got != c.want {
			t.Errorf("%s%v = %v, want %v", c.name, c.labels, got, c.want)
		}
	}
	if value(fams, "spore_fleet_scrape_duration_seconds", nil) < 0 || value(fams, "go_goroutines", nil) <= 0 {
		t.Errorf("scrape duration or the Go collector missing")
	}
	// Killed: gone from the counts at the next scrape.
	f.want(204, "DELETE", "/sandboxes/"+a.SandboxID, "")
	fams = f.scrape()
	if got := value(fams, "spore_sandboxes", map[string]string{"state": store.StateRunning}); got != -1 {
		t.Errorf("running sandboxes after the kill: %v, want none listed", got)
	}
	if got := value(fams, "spore_team_live_sandboxes", map[string]string{"team": store.DefaultTeam}); got != 1 {
		t.Errorf("team's live sandboxes after the kill: %v, want 1", got)
	}
}

// Every metric the Grafana dashboard (deploy/grafana/spore-dashboard.json)
// queries is one a server serves, on a store holding a node, sandboxes and
// snapshots and with the engine's collector of spore up.
func TestDashboardNamesAreServed(t *testing.T) {
	ctx := context.Background()
	st, err := sqlite.Open(ctx, filepath.Join(t.TempDir(), "spore.db"))
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	if err := st.AddAPIKey(ctx, store.APIKey{ID: "k", Hash: apikey.Hash(key), CreatedAt: time.Now()}); err != nil {
		t.Fatal(err)
	}
	free := int64(1000)
	if _, err := st.UpsertNode(ctx, store.Node{ID: "n1", Addr: "10.0.0.1:7000", Capacity: store.Resources{MemoryMB: 4096, VCPUs: 2, Sandboxes: 100},
		MemoryFreeMB: &free, Heartbeat: time.Now(), State: store.NodeReady}); err != nil {
		t.Fatal(err)
	}
	if err := st.CreateSandbox(ctx, store.Sandbox{ID: "i1", TeamID: store.DefaultTeam, TemplateID: "base", State: store.StateRunning, NodeID: "n1"}); err != nil {
		t.Fatal(err)
	}
	if err := st.CreateSandbox(ctx, store.Sandbox{ID: "i2", TemplateID: "base", State: store.StatePooled, NodeID: "n1"}); err != nil {
		t.Fatal(err)
	}
	if err := st.PutSnapshot(ctx, store.Snapshot{ID: "s1", TeamID: store.DefaultTeam, NodeID: "n1", Kind: "snapshot", SizeBytes: 10}); err != nil {
		t.Fatal(err)
	}
	reg := metrics.NewRegistry()
	hostFree := int64(1 << 30)
	reg.MustRegister(metrics.NewHost(func(context.Context) metrics.HostFigures {
		return metrics.HostFigures{Launch: metrics.LaunchLoad{Slots: 4}, Sandboxes: map[string]int{"running": 1}, MemoryFree: &hostFree,
			Cache: &metrics.CacheFigures{}, Fetch: &metrics.FetchFigures{}, Egress: &metrics.EgressFigures{}}
	}))
	// The sandbox traffic proxy's figures (spore up and each replica;
	// a node agent's listener with side "node").
	reg.MustRegister(metrics.NewProxy("replica", func() metrics.ProxyFigures {
		return metrics.ProxyFigures{Requests: map[int]int64{200: 1}}
	}))
	srv := httptest.NewServer(api.New(api.Config{Store: st, Metrics: reg}))
	defer srv.Close()
	f := &fnode{t: t, url: srv.URL, st: st}
	f.want(401, "POST", "/v2/sandboxes", `{}`, "X-API-KEY", "")
	served := map[string]bool{}
	for name, fam := range f.scrape() {
		served[name] = true
		if fam.GetType() == dto.MetricType_HISTOGRAM {
			served[name+"_bucket"], served[name+"_sum"], served[name+"_count"] = true, true, true
		}
	}
	b, err := os.ReadFile("../../deploy/grafana/spore-dashboard.json")
	if err != nil {
		t.Fatal(err)
	}
	var dash struct {
		Panels []struct {
			Title   string `json:"title"`
			Targets []struct {
				Expr string `json:"expr"`
			} `json:"targets"`
		} `json:"panels"`
	}
	if err := json.Unmarshal(b, &dash); err != nil || len(dash.Panels) == 0 {
		t.Fatalf("dashboard: %d panels, %v", len(dash.Panels), err)
	}
	names := regexp.MustCompile(`\bspore_[a-z_]+\b`)
	seen := 0
	for _, p := range dash.Panels {
		for _, tg := range p.Targets {
			for _, n := range names.FindAllString(tg.Expr, -1) {
				seen++
				if !served[n] {
					t.Errorf("panel %q queries %s, which no server serves", p.Title, n)
				}
			}
		}
	}
	if seen < 10 {
		t.Fatalf("the dashboard names only %d metrics", seen)
	}
}

// The metrics token (--metrics-token-file) opens GET /metrics and
// nothing else; a wrong one is refused; operator keys still scrape and a
// team's key does not.
func TestMetricsToken(t *testing.T) {
	st := openStore(t) // holds the operator test key
	const token = "the-metrics-token-of-this-test"
	srv := httptest.NewServer(api.New(api.Config{Store: st, MetricsToken: token}))
	t.Cleanup(srv.Close)
	f := &fnode{t: t, url: srv.URL, st: st}
	var member api.CreatedKey
	json.Unmarshal(f.want(201, "POST", "/api-keys", `{"name":"member"}`), &member)
	for _, c := range []struct {
		path, bearer string
		code         int
	}{
		{"/metrics", token, 200},
		{"/metrics", key, 200},
		{"/metrics", "the-metrics-token-of-this-tesT", 401},
		{"/metrics", member.Key, 403},
		{"/v2/sandboxes", token, 401},
		{"/debug/stats", token, 401},
	} {
		code, b, _ := call(t, srv.URL, "GET", c.path, "", "X-API-KEY", "", "Authorization", "Bearer "+c.bearer)
		if code != c.code || (code == 200) != bytes.Contains(b, []byte("spore_api_requests_total")) {
			t.Errorf("GET %s with bearer %.12s...: %d %.120s, want %d", c.path, c.bearer, code, b, c.code)
		}
	}
}

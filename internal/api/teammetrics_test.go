package api_test

import (
	"context"
	"encoding/json"
	"fmt"
	"math"
	"testing"
	"time"

	"github.com/spore-run/spore/internal/api"
	"github.com/spore-run/spore/internal/audit"
	"github.com/spore-run/spore/internal/control"
	"github.com/spore-run/spore/internal/control/controltest"
	"github.com/spore-run/spore/internal/store"
	"github.com/spore-run/spore/internal/teammetrics"
)

// E2B's team metrics answer for the caller's team: its live sandboxes and
// the sandboxes it started (creates and fork children), sampled as every
// replica does; another team's ID is a 404; bad parameters are 400s.
func TestTeamMetricsRoutes(t *testing.T) { controltest.Each(t, testTeamMetricsRoutes) }

func testTeamMetricsRoutes(t *testing.T, _ controltest.Config) {
	var w *audit.Writer
	f := newFnode(t, func(c *control.Config) {
		w = audit.NewWriter(c.Store, nil)
		c.Audit = w
	})
	var tb api.TeamInfo
	json.Unmarshal(f.want(201, "POST", "/teams", `{"name":"metrics-b"}`), &tb)
	var aKey, bKey api.CreatedKey
	json.Unmarshal(f.want(201, "POST", "/api-keys", `{"name":"alice","role":"member"}`), &aKey)
	json.Unmarshal(f.want(201, "POST", "/api-keys", `{"name":"bob","role":"member","teamID":"`+tb.TeamID+`"}`), &bKey)
	asA := []string{"X-API-KEY", aKey.Key}
	asB := []string{"X-API-KEY", bKey.Key}

	var b1 api.SandboxResponse
	json.Unmarshal(f.want(201, "POST", "/v2/sandboxes", `{"templateID":"base","timeout":300}`, asB...), &b1)
	f.want(201, "POST", "/v2/sandboxes", `{"templateID":"base","timeout":300}`, asB...)
	f.want(201, "POST", "/sandboxes/"+b1.SandboxID+"/fork", `{"count":1}`, asB...)
	f.want(201, "POST", "/v2/sandboxes", `{"templateID":"base","timeout":300}`, asA...)
	ctx := context.Background()
	if err := w.Flush(ctx); err != nil {
		t.Fatal(err)
	}
	now := time.Now()
	// As a replica's sampler would: now, and once the steps have settled
	// (that sample's own step is after now: outside what the API shows).
	for _, at := range []time.Time{now, now.Add(teammetrics.Step + teammetrics.Settle + time.Second)} {
		if err := teammetrics.SampleOnce(ctx, f.st, at); err != nil {
			t.Fatal(err)
		}
	}
	q := fmt.Sprintf("?start=%d", now.Add(-time.Minute).Unix())
	series := func(team string, as []string) (peak int, starts float64) {
		t.Helper()
		var pts []teammetrics.Point
		if err := json.Unmarshal(f.want(200, "GET", "/teams/"+team+"/metrics"+q, "", as...), &pts); err != nil || len(pts) < 6 {
			t.Fatalf("team %s's series: %d points, %v", team, len(pts), err)
		}
		for i, p := range pts {
			if i > 0 && p.TimestampUnix-pts[i-1].TimestampUnix != 10 {
				t.Fatalf("points %d s apart", p.TimestampUnix-pts[i-1].TimestampUnix)
			}
			peak = max(peak, p.ConcurrentSandboxes)
			starts += p.SandboxStartRate * 10
		}
		return peak, math.Round(starts*1000) / 1000
	}
	if peak, starts := series(tb.TeamID, asB); peak != 3 || starts != 3 {
		t.Fatalf("team B: peak %d, starts %v; want 3 and 3 (two creates, a fork child)", peak, starts)
	}
	if peak, starts := series(store.DefaultTeam, asA); peak != 1 || starts != 1 {
		t.Fatalf("team A: peak %d, starts %v; want 1 and 1", peak, starts)
	}
	// An operator reads any team's.
	if peak, _ := series(tb.TeamID, nil); peak != 3 {
		t.Fatalf("team B as the operator: peak %d", peak)
	}
	var m teammetrics.Max
	json.Unmarshal(f.want(200, "GET", "/teams/"+tb.TeamID+"/metrics/max"+q+"&metric=concurrent_sandboxes", "", asB...), &m)
	if m.Value != 3 || m.TimestampUnix < now.Add(-20*time.Second).Unix() {
		t.Fatalf("team B's max concurrency %+v", m)
	}
	json.Unmarshal(f.want(200, "GET", "/teams/"+tb.TeamID+"/metrics/max"+q+"&metric=sandbox_start_rate", "", asB...), &m)
	if m.Value < 0.1 || m.Value > 0.3 {
		t.Fatalf("team B's max start rate %+v", m)
	}

	// Refusals: another team's ID (by ID or name), one that is none,
	// bad parameters.
	f.want(404, "GET", "/teams/"+tb.TeamID+"/metrics", "", asA...)
	f.want(404, "GET", "/teams/metrics-b/metrics/max?metric=concurrent_sandboxes", "", asA...)
	f.want(404, "GET", "/teams/"+store.DefaultTeam+"/metrics", "", asB...)
	f.want(404, "GET", "/teams/t-no-such-team/metrics", "")
	f.want(400, "GET", "/teams/"+tb.TeamID+"/metrics/max", "", asB...)
	f.want(400, "GET", "/teams/"+tb.TeamID+"/metrics/max?metric=cpu", "", asB...)
	f.want(400, "GET", "/teams/"+tb.TeamID+"/metrics?start=yesterday", "", asB...)
	f.want(400, "GET", "/teams/"+tb.TeamID+"/metrics?start=-5", "", asB...)
	f.want(400, "GET", fmt.Sprintf("/teams/%s/metrics?start=%d&end=%d", tb.TeamID, now.Unix(), now.Unix()-60), "", asB...)
	f.want(400, "GET", fmt.Sprintf("/teams/%s/metrics?start=%d", tb.TeamID, now.Add(-40*24*time.Hour).Unix()), "", asB...)
}

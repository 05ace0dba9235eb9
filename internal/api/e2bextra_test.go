package api_test

import (
	"context"
	"encoding/json"
	"net/http/httptest"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/spore-run/spore/internal/api"
	"github.com/spore-run/spore/internal/blob/local"
	"github.com/spore-run/spore/internal/build"
	"github.com/spore-run/spore/internal/control"
	"github.com/spore-run/spore/internal/control/controltest"
	"github.com/spore-run/spore/internal/store"
)

// E2B's refresh keeps a sandbox alive at least the duration asked (its
// end never moves earlier); its metrics of many sandboxes answer the
// caller's running ones only; the v2 template list pages through what
// GET /templates lists. Bad input is a 400, another team's sandbox a 404.
func TestE2BRefreshMetricsAndTemplatePages(t *testing.T) {
	controltest.Each(t, testE2BRefreshMetricsAndTemplatePages)
}

func testE2BRefreshMetricsAndTemplatePages(t *testing.T, _ controltest.Config) {
	f := newFnode(t)
	ctx := context.Background()
	var tb api.TeamInfo
	json.Unmarshal(f.want(201, "POST", "/teams", `{"name":"extra-b"}`), &tb)
	var bKey api.CreatedKey
	json.Unmarshal(f.want(201, "POST", "/api-keys", `{"name":"b","role":"admin","teamID":"`+tb.TeamID+`"}`), &bKey)
	asB := []string{"X-API-KEY", bKey.Key}

	a1, a2 := f.create(`{"templateID":"base","timeout":60}`), f.create(`{"templateID":"base","timeout":60}`)
	var b1 api.SandboxResponse
	json.Unmarshal(f.want(201, "POST", "/v2/sandboxes", `{"templateID":"base","timeout":60}`, asB...), &b1)
	end := func(id string) time.Time {
		t.Helper()
		sb, err := f.st.GetSandbox(ctx, id)
		if err != nil {
			t.Fatal(err)
		}
		return sb.EndAt
	}

	// Refresh.
	before := end(a1.SandboxID)
	f.want(204, "POST", "/sandboxes/"+a1.SandboxID+"/refreshes", `{"duration":600}`)
	if got := end(a1.SandboxID); got.Sub(before) < 500*time.Second {
		t.Fatalf("end after a 600 s refresh: %v, was %v", got, before)
	}
	longer := end(a1.SandboxID)
	f.want(204, "POST", "/sandboxes/"+a1.SandboxID+"/refreshes", `{"duration":10}`)
	f.want(204, "POST", "/sandboxes/"+a1.SandboxID+"/refreshes", "")
	if got := end(a1.SandboxID); !got.Equal(longer) {
		t.Fatalf("a shorter refresh moved the end from %v to %v", longer, got)
	}
	for _, body := range []string{`{"duration":-1}`, `{"duration":3601}`, `{"duration":"x"}`} {
		f.want(400, "POST", "/sandboxes/"+a1.SandboxID+"/refreshes", body)
	}
	bEnd := end(b1.SandboxID)
	f.want(404, "POST", "/sandboxes/"+b1.SandboxID+"/refreshes", `{"duration":600}`)
	if !end(b1.SandboxID).Equal(bEnd) {
		t.Fatal("another team's refresh moved B's sandbox's end")
	}

	// Metrics of many: A's two running ones; B's, a paused one and an
	// unknown one left out.
	f.want(204, "POST", "/sandboxes/"+a2.SandboxID+"/pause", "")
	a3 := f.create(`{"templateID":"base","timeout":60}`)
	var got api.SandboxesWithMetrics
	json.Unmarshal(f.want(200, "GET", "/sandboxes/metrics?sandbox_ids="+strings.Join([]string{a1.SandboxID, a2.SandboxID, a3.SandboxID,
		b1.SandboxID, "inosuchsandbox000000"}, ","), ""), &got)
	var keys []string
	for id, m := range got.Sandboxes {
		keys = append(keys, id)
		if m.MemUsed == 0 || m.Timestamp.IsZero() {
			t.Errorf("metrics of %s: %+v", id, m)
		}
	}
	slices.Sort(keys)
	want := []string{a1.SandboxID, a3.SandboxID}
	slices.Sort(want)
	if !slices.Equal(keys, want) {
		t.Fatalf("metrics for %v, want A's running %v", keys, want)
	}
	var asOther api.SandboxesWithMetrics
	json.Unmarshal(f.want(200, "GET", "/sandboxes/metrics?sandbox_ids="+a1.SandboxID, "", asB...), &asOther)
	if len(asOther.Sandboxes) != 0 {
		t.Fatalf("B got A's metrics: %+v", asOther)
	}
	many := make([]string, 101)
	for i := range many {
		many[i] = "i" + strconv.Itoa(100000000000000000+i)
	}
	for _, q := range []string{"", "?sandbox_ids=", "?sandbox_ids=" + strings.Join(many, ","), "?sandbox_ids=BAD..ID"} {
		f.want(400, "GET", "/sandboxes/metrics"+q, "")
	}

	// The v2 template list, a page at a time, is GET /templates.
	var all []api.TemplateInfo
	json.Unmarshal(f.want(200, "GET", "/templates", ""), &all)
	var paged []string
	tok := ""
	for range len(all) + 1 {
		code, b, h := f.do("GET", "/v2/templates?limit=1&nextToken="+tok, "")
		var page []api.TemplateInfo
		if json.Unmarshal(b, &page); code != 200 || len(page) > 1 {
			t.Fatalf("v2 templates page after %q: %d %s", tok, code, b)
		}
		for _, p := range page {
			paged = append(paged, p.TemplateID)
		}
		if tok = h.Get("X-Next-Token"); tok == "" {
			break
		}
	}
	var ids []string
	for _, tp := range all {
		ids = append(ids, tp.TemplateID)
	}
	slices.Sort(ids)
	if len(all) < 2 || !slices.Equal(paged, ids) {
		t.Fatalf("v2 pages %v, want %v", paged, ids)
	}
	f.want(400, "GET", "/v2/templates?limit=101", "")
}

// A build's logs (E2B's GET /templates/{t}/builds/{b}/logs): from a
// cursor on or before it, by level and limit; another team's build is a
// 404; bad selectors are 400s.
func TestBuildLogsRoute(t *testing.T) {
	st := openStore(t)
	blobs, err := local.Open(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { blobs.Close() })
	ctl := control.New(control.Config{Store: st, Nodes: control.Nodes{}})
	t.Cleanup(ctl.Close)
	srv := httptest.NewServer(api.New(api.Config{Store: st, Control: ctl, Builds: &build.Service{St: st, Blobs: blobs}}))
	t.Cleanup(srv.Close)
	f := &fnode{t: t, url: srv.URL, st: st}
	var req api.BuildRequestResponse
	json.Unmarshal(f.want(202, "POST", "/v3/templates", `{"name":"logged"}`), &req)
	t0 := time.Now().UTC().Truncate(time.Millisecond)
	var logs []store.BuildLog
	for i, lvl := range []string{"info", "debug", "warn", "info", "error"} {
		logs = append(logs, store.BuildLog{Time: t0.Add(time.Duration(i) * time.Second), Level: lvl, Message: "line " + strconv.Itoa(i), Step: "run"})
	}
	if err := st.AppendBuildLogs(context.Background(), req.BuildID, logs...); err != nil {
		t.Fatal(err)
	}
	path := "/templates/logged/builds/" + req.BuildID + "/logs"
	msgs := func(q string) []string {
		t.Helper()
		var out api.TemplateBuildLogs
		json.Unmarshal(f.want(200, "GET", path+q, ""), &out)
		var m []string
		for _, l := range out.Logs {
			m = append(m, l.Message)
		}
		return m
	}
	cursor := strconv.FormatInt(t0.Add(2*time.Second).UnixMilli(), 10)
	for q, want := range map[string][]string{
		"":                  {"line 0", "line 1", "line 2", "line 3", "line 4"},
		"?limit=2":          {"line 0", "line 1"},
		"?cursor=" + cursor: {"line 2", "line 3", "line 4"},
		"?cursor=" + cursor + "&direction=backward": {"line 1", "line 0"},
		"?level=warn":                    {"line 2", "line 4"},
		"?source=persistent&level=error": {"line 4"},
	} {
		if got := msgs(q); !slices.Equal(got, want) {
			t.Errorf("build logs%s: %v, want %v", q, got, want)
		}
	}
	for _, q := range []string{"?level=loud", "?direction=up", "?cursor=x", "?limit=1001", "?source=elsewhere"} {
		f.want(400, "GET", path+q, "")
	}
	f.want(404, "GET", "/templates/logged/builds/00000000-0000-0000-0000-000000000000/logs", "")
	var tb api.TeamInfo
	json.Unmarshal(f.want(201, "POST", "/teams", `{"name":"other"}`), &tb)
	var bKey api.CreatedKey
	json.Unmarshal(f.want(201, "POST", "/api-keys", `{"name":"b","teamID":"`+tb.TeamID+`"}`), &bKey)
	f.want(404, "GET", path, "", "X-API-KEY", bKey.Key)
}

package api_test

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/spore-run/spore/internal/api"
	"github.com/spore-run/spore/internal/control/controltest"
	"github.com/spore-run/spore/internal/errdefs"
	"github.com/spore-run/spore/internal/store"
)

// Team quotas through the API: an operator sets them (a team key may
// not); over one, a create, a fork, a resume or a snapshot is a JSON 403
// naming the quota (429 with Retry-After for the create rate) and
// changes nothing; a kill makes room again; GET /teams/{id} shows the
// quotas and the usage.
func TestTeamQuotas(t *testing.T) { controltest.Each(t, testTeamQuotas) }

func testTeamQuotas(t *testing.T, _ controltest.Config) {
	f := newFnode(t)
	var tq api.TeamInfo
	json.Unmarshal(f.want(201, "POST", "/teams", `{"name":"quota-team","quotas":{"sandboxes":2,"vcpus":3}}`), &tq)
	if tq.Quotas != (store.Quotas{Sandboxes: 2, VCPUs: 3}) {
		t.Fatalf("created with quotas %+v", tq.Quotas)
	}
	f.want(400, "POST", "/teams", `{"name":"bad-quota","quotas":{"sandboxes":-1}}`)
	f.want(404, "GET", "/teams/bad-quota", "")
	var admin api.CreatedKey
	json.Unmarshal(f.want(201, "POST", "/api-keys", `{"name":"q-admin","role":"admin","teamID":"`+tq.TeamID+`"}`), &admin)
	asQ := []string{"X-API-KEY", admin.Key}
	// Only an operator sets quotas.
	f.want(403, "PATCH", "/teams/"+tq.TeamID, `{"quotas":{"sandboxes":100}}`, asQ...)
	f.want(400, "PATCH", "/teams/"+tq.TeamID, `{"quotas":{"vcpus":-2}}`)
	f.want(400, "PATCH", "/teams/"+tq.TeamID, `{}`)
	f.want(404, "PATCH", "/teams/t-no-such-team", `{"quotas":{}}`)

	create := func(code int, body string) api.SandboxResponse {
		t.Helper()
		var r api.SandboxResponse
		json.Unmarshal(f.want(code, "POST", "/v2/sandboxes", body, asQ...), &r)
		return r
	}
	refusedBy := func(b []byte, quota string) {
		t.Helper()
		var e api.ErrorBody
		if json.Unmarshal(b, &e) != nil || !strings.Contains(e.Message, quota) || !strings.Contains(e.Message, tq.TeamID) {
			t.Fatalf("refusal %s: want it to name quota %s and the team", b, quota)
		}
	}
	listed := func() int {
		t.Helper()
		var l []api.SandboxDetail
		json.Unmarshal(f.want(200, "GET", "/v2/sandboxes", "", asQ...), &l)
		return len(l)
	}

	a := create(201, `{"templateID":"base","timeout":300,"cpuCount":1,"memoryMB":256}`)
	refusedBy(f.want(403, "POST", "/v2/sandboxes", `{"templateID":"base","timeout":300,"cpuCount":4,"memoryMB":256}`, asQ...), "vcpus")
	b := create(201, `{"templateID":"base","timeout":300,"cpuCount":2,"memoryMB":256}`)
	refusedBy(f.want(403, "POST", "/v2/sandboxes", `{"templateID":"base","timeout":300,"cpuCount":1,"memoryMB":256}`, asQ...), "sandboxes")
	if n := listed(); n != 2 {
		t.Fatalf("%d sandboxes listed after refused creates, want 2", n)
	}
	// A fork the quotas cannot hold is refused whole.
	refusedBy(f.want(403, "POST", "/sandboxes/"+a.SandboxID+"/fork", `{"count":1}`, asQ...), "sandboxes")
	if n := listed(); n != 2 {
		t.Fatalf("%d sandboxes listed after a refused fork, want 2", n)
	}
	// Hibernated, a sandbox frees its place; resumed over the quota, it
	// is refused and stays paused.
	f.want(204, "POST", "/sandboxes/"+b.SandboxID+"/hibernate", "", asQ...)
	c := create(201, `{"templateID":"base","timeout":300,"cpuCount":1,"memoryMB":256}`)
	refusedBy(f.want(403, "POST", "/sandboxes/"+b.SandboxID+"/connect", `{"timeout":60}`, asQ...), "sandboxes")
	var d api.SandboxDetail
	json.Unmarshal(f.want(200, "GET", "/sandboxes/"+b.SandboxID, "", asQ...), &d)
	if d.State != "paused" {
		t.Fatalf("a refused resume left it %s", d.State)
	}
	// The usage, as the team's key sees it.
	var info api.TeamInfo
	json.Unmarshal(f.want(200, "GET", "/teams/"+tq.TeamID, "", asQ...), &info)
	if u := info.Usage; u == nil || u.Sandboxes != 2 || u.VCPUs != 2 || u.MemoryMB != 512 || u.Hibernated != 1 || info.Quotas.Sandboxes != 2 {
		t.Fatalf("usage %+v, quotas %+v", info.Usage, info.Quotas)
	}
	// A kill makes room: the resume goes through.
	f.want(204, "DELETE", "/sandboxes/"+c.SandboxID, "", asQ...)
	f.want(201, "POST", "/sandboxes/"+b.SandboxID+"/connect", `{"timeout":60}`, asQ...)

	// Snapshot bytes: the first snapshot's size sets a quota one more
	// snapshot passes; that one is refused and not listed.
	f.want(200, "PATCH", "/teams/"+tq.TeamID, `{"quotas":{"sandboxes":2}}`)
	var sn api.SnapshotInfo
	json.Unmarshal(f.want(201, "POST", "/sandboxes/"+a.SandboxID+"/snapshots", `{"name":"first"}`, asQ...), &sn)
	json.Unmarshal(f.want(200, "GET", "/teams/"+tq.TeamID, "", asQ...), &info)
	size := info.Usage.SnapshotBytes
	if size == 0 {
		t.Fatalf("a snapshot of 0 bytes: %+v", info.Usage)
	}
	f.want(200, "PATCH", "/teams/"+tq.TeamID, fmt.Sprintf(`{"quotas":{"sandboxes":2,"snapshotBytes":%d}}`, size+size/2))
	refusedBy(f.want(403, "POST", "/sandboxes/"+a.SandboxID+"/snapshots", `{"name":"second"}`, asQ...), "snapshotBytes")
	f.want(404, "GET", "/snapshots/second", "", asQ...)
	var snaps []api.SnapshotInfo
	json.Unmarshal(f.want(200, "GET", "/snapshots", "", asQ...), &snaps)
	if len(snaps) != 1 {
		t.Fatalf("snapshots after a refused one: %+v", snaps)
	}
	// Full already: refused before the node takes anything.
	f.want(200, "PATCH", "/teams/"+tq.TeamID, fmt.Sprintf(`{"quotas":{"snapshotBytes":%d}}`, size))
	refusedBy(f.want(403, "POST", "/sandboxes/"+a.SandboxID+"/snapshots", `{"name":"third"}`, asQ...), "snapshotBytes")

	// Volume bytes.
	f.want(200, "PATCH", "/teams/"+tq.TeamID, `{"quotas":{"volumeBytes":1073741824}}`)
	f.want(201, "POST", "/volumes", `{"name":"small","sizeMB":512}`, asQ...)
	refusedBy(f.want(403, "POST", "/volumes", `{"name":"big","sizeMB":768}`, asQ...), "volumeBytes")
	f.want(404, "GET", "/volumes/big", "", asQ...)

	// The create rate: a 429 with Retry-After, naming it.
	f.want(200, "PATCH", "/teams/"+tq.TeamID, `{"quotas":{"createsPerMinute":1}}`)
	create(201, `{"templateID":"base","timeout":300}`)
	code, body, hdr := f.do("POST", "/v2/sandboxes", `{"templateID":"base","timeout":300}`, asQ...)
	if code != 429 || hdr.Get("Retry-After") == "" {
		t.Fatalf("a create over the rate = %d %s (Retry-After %q), want 429 with Retry-After", code, body, hdr.Get("Retry-After"))
	}
	refusedBy(body, "createsPerMinute")
	// Other teams are not held by it.
	f.create(`{"templateID":"base","timeout":300}`)
}

// A team made without quotas gets the deployment's defaults; quotas
// given (even none) are the team's; bad ones change nothing.
func TestDefaultTeamQuotas(t *testing.T) {
	st := openStore(t)
	def := store.Quotas{Sandboxes: 5, VCPUs: 10, CreatesPerMinute: 60}
	srv := httptest.NewServer(api.New(api.Config{Store: st, DefaultTeamQuotas: def}))
	t.Cleanup(srv.Close)
	for _, c := range []struct {
		body string
		want store.Quotas
	}{
		{`{"name":"gets-defaults"}`, def},
		{`{"name":"null-quotas","quotas":null}`, def},
		{`{"name":"no-limits","quotas":{}}`, store.Quotas{}},
		{`{"name":"its-own","quotas":{"sandboxes":1}}`, store.Quotas{Sandboxes: 1}},
	} {
		code, b, _ := call(t, srv.URL, "POST", "/teams", c.body)
		var ti api.TeamInfo
		if json.Unmarshal(b, &ti); code != 201 || ti.Quotas != c.want {
			t.Fatalf("POST /teams %s = %d %s, want quotas %+v", c.body, code, b, c.want)
		}
		got, err := st.GetTeam(context.Background(), ti.TeamID)
		if err != nil || got.Quotas != c.want {
			t.Fatalf("stored team %+v %v, want quotas %+v", got, err, c.want)
		}
	}
	if code, b, _ := call(t, srv.URL, "POST", "/teams", `{"name":"bad","quotas":{"vcpus":-1}}`); code != 400 || !strings.Contains(string(b), "vcpus") {
		t.Fatalf("negative quota: %d %s", code, b)
	}
	if _, err := st.GetTeam(context.Background(), "bad"); !errdefs.IsNotFound(err) {
		t.Fatalf("a refused team was made: %v", err)
	}
}

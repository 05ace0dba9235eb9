package api_test

import (
	"context"
	"encoding/json"
	"reflect"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/spore-run/spore/internal/api"
	"github.com/spore-run/spore/internal/audit"
	"github.com/spore-run/spore/internal/control"
	"github.com/spore-run/spore/internal/control/controltest"
)

// A sandbox's logs (E2B's v1 and v2 logs routes): its lifecycle events
// and the calls that changed it, oldest first, with E2B's shapes (v1's
// line a JSON object with level and logger, as the E2B CLI parses it);
// start/cursor, limit, direction, level and search select; they outlive
// the sandbox; another team's sandbox is a 404, before and after its
// kill; bad parameters are 400s.
func TestSandboxLogs(t *testing.T) { controltest.Each(t, testSandboxLogs) }

func testSandboxLogs(t *testing.T, _ controltest.Config) {
	var w *audit.Writer
	f := newFnode(t, func(c *control.Config) {
		w = audit.NewWriter(c.Store, nil)
		c.Audit = w
	})
	flush := func() {
		t.Helper()
		if err := w.Flush(context.Background()); err != nil {
			t.Fatal(err)
		}
	}
	var tb api.TeamInfo
	json.Unmarshal(f.want(201, "POST", "/teams", `{"name":"logs-b"}`), &tb)
	var bKey api.CreatedKey
	json.Unmarshal(f.want(201, "POST", "/api-keys", `{"name":"b","role":"admin","teamID":"`+tb.TeamID+`"}`), &bKey)
	asB := []string{"X-API-KEY", bKey.Key}

	sb := f.create(`{"templateID":"base","timeout":300}`)
	id := sb.SandboxID
	f.want(204, "POST", "/sandboxes/"+id+"/pause", "")
	f.want(201, "POST", "/sandboxes/"+id+"/connect", `{"timeout":60}`)
	flush()
	v1 := func(query string, hdr ...string) api.SandboxLogs {
		t.Helper()
		var out api.SandboxLogs
		if err := json.Unmarshal(f.want(200, "GET", "/sandboxes/"+id+"/logs"+query, "", hdr...), &out); err != nil {
			t.Fatal(err)
		}
		return out
	}
	// The API records a call once its answer is sent: the connect's
	// record may come a moment after the client has the answer (a CI run
	// read the logs before it and saw a newer entry after). Read until it
	// is there.
	// (A later CI-like run under load also read the connect's record before
	// the resume's: the test reads until both are there and two reads
	// agree.)
	has := func(l api.SandboxLogs, msg string) bool {
		return slices.ContainsFunc(l.LogEntries, func(e api.SandboxLogEntry) bool { return strings.Contains(e.Message, msg) })
	}
	got := v1("")
	for deadline := time.Now().Add(30 * time.Second); time.Now().Before(deadline); time.Sleep(20 * time.Millisecond) {
		flush()
		again := v1("")
		if has(got, "/connect 201") && has(got, "resumed") && reflect.DeepEqual(again, got) {
			break
		}
		got = again
	}
	var msgs []string
	for i, e := range got.LogEntries {
		msgs = append(msgs, e.Fields["logger"]+": "+e.Message)
		var line map[string]string
		if err := json.Unmarshal([]byte(got.Logs[i].Line), &line); err != nil || line["level"] != e.Level || line["logger"] != e.Fields["logger"] ||
			line["message"] != e.Message || got.Logs[i].Timestamp != e.Timestamp {
			t.Fatalf("v1 line %d %q for entry %+v", i, got.Logs[i].Line, e)
		}
	}
	joined := strings.Join(msgs, "\n")
	for _, want := range []string{"lifecycle: created", "api: POST /sandboxes/{sandboxID}/pause 204", "lifecycle: paused", "lifecycle: resumed"} {
		if !strings.Contains(joined, want) {
			t.Fatalf("logs:\n%s\nwant %q", joined, want)
		}
	}
	if strings.Index(joined, "lifecycle: created") > strings.Index(joined, "lifecycle: paused") {
		t.Fatalf("logs not oldest first:\n%s", joined)
	}

	// Selection: from a time on, a limit, newest first, a level, a search.
	at, _ := time.Parse(time.RFC3339Nano, got.LogEntries[len(got.LogEntries)-1].Timestamp)
	if late := v1("?start=" + strconv.FormatInt(at.UnixMilli(), 10)); len(late.Logs) == 0 || len(late.Logs) >= len(got.Logs) {
		t.Fatalf("from the last entry's millisecond on: %d entries of %d", len(late.Logs), len(got.Logs))
	}
	if one := v1("?limit=1"); len(one.Logs) != 1 || !reflect.DeepEqual(one.LogEntries[0], got.LogEntries[0]) {
		t.Fatalf("limit 1: %+v, want the oldest", one.LogEntries)
	}
	var v2 api.SandboxLogsV2
	json.Unmarshal(f.want(200, "GET", "/v2/sandboxes/"+id+"/logs?direction=backward&limit=2", ""), &v2)
	if len(v2.Logs) != 2 || v2.Logs[0].Timestamp < v2.Logs[1].Timestamp || !reflect.DeepEqual(v2.Logs[0], got.LogEntries[len(got.LogEntries)-1]) {
		t.Fatalf("v2 backward, limit 2: %+v", v2.Logs)
	}
	json.Unmarshal(f.want(200, "GET", "/v2/sandboxes/"+id+"/logs?search=paused", ""), &v2)
	if len(v2.Logs) != 1 || v2.Logs[0].Fields["event"] != "sandbox.paused" {
		t.Fatalf("v2 search paused: %+v", v2.Logs)
	}
	json.Unmarshal(f.want(200, "GET", "/v2/sandboxes/"+id+"/logs?level=warn", ""), &v2)
	if len(v2.Logs) != 0 {
		t.Fatalf("v2 level warn: %+v, want none (all info)", v2.Logs)
	}

	// Another team: 404, as for a sandbox that does not exist; bad
	// parameters: 400.
	for _, p := range []string{"/sandboxes/" + id + "/logs", "/v2/sandboxes/" + id + "/logs"} {
		f.want(404, "GET", p, "", asB...)
	}
	f.want(404, "GET", "/sandboxes/inosuchsandbox0000000/logs", "")
	for _, q := range []string{"?start=x", "?start=-1", "?limit=1001", "?limit=x"} {
		f.want(400, "GET", "/sandboxes/"+id+"/logs"+q, "")
	}
	for _, q := range []string{"?direction=sideways", "?level=loud", "?cursor=1.5", "?search=" + strings.Repeat("x", 257)} {
		f.want(400, "GET", "/v2/sandboxes/"+id+"/logs"+q, "")
	}
	f.want(400, "GET", "/sandboxes/NOT_AN_ID/logs", "")

	// After the kill: still there for its team (with the kill), still 404
	// for the other.
	f.want(204, "DELETE", "/sandboxes/"+id, "")
	flush()
	after := v1("")
	if n := len(after.LogEntries); n <= len(got.LogEntries) || !strings.Contains(after.LogEntries[n-1].Message+after.LogEntries[n-2].Message, "killed") {
		t.Fatalf("logs after the kill: %+v", after.LogEntries)
	}
	f.want(404, "GET", "/sandboxes/"+id+"/logs", "", asB...)
}

package api_test

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"net/http/httptest"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/spore-run/spore/internal/api"
	"github.com/spore-run/spore/internal/audit"
	"github.com/spore-run/spore/internal/control"
	"github.com/spore-run/spore/internal/control/controltest"
	"github.com/spore-run/spore/internal/store"
)

// The audit trail records a scripted session exactly: each call that
// changes something (refused ones too, with their status) and each
// sandbox event, in order, with the key and the resource; reads are not
// recorded; another team's trail holds only its own; the records outlive
// the sandbox and the replica (a new server on the same store reads
// them, JSON and JSON lines alike).
func TestAuditTrail(t *testing.T) { controltest.Each(t, testAuditTrail) }

func testAuditTrail(t *testing.T, _ controltest.Config) {
	var w *audit.Writer
	f := newFnode(t, func(c *control.Config) {
		w = audit.NewWriter(c.Store, nil)
		c.Audit = w
	})
	var tb api.TeamInfo
	json.Unmarshal(f.want(201, "POST", "/teams", `{"name":"audit-b"}`), &tb)
	var aKey, bKey api.CreatedKey
	json.Unmarshal(f.want(201, "POST", "/api-keys", `{"name":"alice","role":"admin"}`), &aKey)
	json.Unmarshal(f.want(201, "POST", "/api-keys", `{"name":"bob","role":"admin","teamID":"`+tb.TeamID+`"}`), &bKey)
	asA := []string{"X-API-KEY", aKey.Key}
	asB := []string{"X-API-KEY", bKey.Key}
	time.Sleep(5 * time.Millisecond)
	start := time.Now()

	// The session.
	var sb api.SandboxResponse
	json.Unmarshal(f.want(201, "POST", "/v2/sandboxes", `{"templateID":"base","timeout":300}`, asA...), &sb)
	id := sb.SandboxID
	f.want(200, "GET", "/sandboxes/"+id, "", asA...) // a read: not recorded
	f.want(204, "POST", "/sandboxes/"+id+"/pause", "", asA...)
	f.want(201, "POST", "/sandboxes/"+id+"/connect", `{"timeout":60}`, asA...)
	var sn api.SnapshotInfo
	json.Unmarshal(f.want(201, "POST", "/sandboxes/"+id+"/snapshots", `{"name":"s1"}`, asA...), &sn)
	f.want(400, "POST", "/secrets", `{"name":""}`, asA...)
	f.want(404, "DELETE", "/sandboxes/"+id, "", asB...) // B's call: B's trail
	f.want(204, "DELETE", "/sandboxes/"+id, "", asA...)
	if err := w.Flush(context.Background()); err != nil {
		t.Fatal(err)
	}
	window := "since=" + url.QueryEscape(start.UTC().Format(time.RFC3339Nano)) + "&until=" + url.QueryEscape(time.Now().Add(time.Millisecond).UTC().Format(time.RFC3339Nano))
	time.Sleep(5 * time.Millisecond)

	type rec struct{ kind, action, resource, key, detail string }
	want := []rec{
		{"sandbox", "sandbox.created", id, "", "from base"},
		{"api", "POST /v2/sandboxes", id, "alice", "from base"},
		{"sandbox", "sandbox.paused", id, "", "in memory"},
		{"api", "POST /sandboxes/{sandboxID}/pause", id, "alice", ""},
		{"sandbox", "sandbox.resumed", id, "", ""},
		{"api", "POST /sandboxes/{sandboxID}/connect", id, "alice", ""},
		{"api", "POST /sandboxes/{sandboxID}/snapshots", id, "alice", "snapshot " + sn.SnapshotID},
		{"api", "POST /secrets", "", "alice", ""},
		{"sandbox", "sandbox.killed", id, "", ""},
		{"api", "DELETE /sandboxes/{sandboxID}", id, "alice", ""},
	}
	wantStatus := map[string]int{"POST /v2/sandboxes": 201, "POST /sandboxes/{sandboxID}/pause": 204, "POST /sandboxes/{sandboxID}/connect": 201,
		"POST /sandboxes/{sandboxID}/snapshots": 201, "POST /secrets": 400, "DELETE /sandboxes/{sandboxID}": 204}
	check := func(base string, hdr []string) {
		t.Helper()
		var got []store.AuditRecord
		json.Unmarshal(callWant(t, base, 200, "GET", "/audit?"+window, hdr...), &got)
		// Newest first; the API record of a call follows the events it
		// caused (it is written when the call ends): compare oldest first
		// in that order.
		if len(got) != len(want) {
			t.Fatalf("%d records, want %d: %+v", len(got), len(want), got)
		}
		for i, w := range want {
			g := got[len(got)-1-i]
			if g.Kind != w.kind || g.Action != w.action || g.Resource != w.resource || g.KeyName != w.key || g.TeamID != store.DefaultTeam || g.Detail != w.detail {
				t.Fatalf("record %d = %+v, want %+v", i, g, w)
			}
			if g.Kind == store.AuditAPI && (g.Status != wantStatus[g.Action] || g.Remote != "127.0.0.1" || g.KeyID != aKey.ID) {
				t.Fatalf("record %d = %+v: want status %d from 127.0.0.1 by %s", i, g, wantStatus[g.Action], aKey.ID)
			}
		}
		// The export: the same records, as JSON lines.
		b := callWant(t, base, 200, "GET", "/audit?format=jsonl&"+window, hdr...)
		lines := 0
		sc := bufio.NewScanner(bytes.NewReader(b))
		for sc.Scan() {
			var r store.AuditRecord
			if err := json.Unmarshal(sc.Bytes(), &r); err != nil || r.Seq != got[lines].Seq {
				t.Fatalf("export line %d: %s %v", lines, sc.Bytes(), err)
			}
			lines++
		}
		if lines != len(got) {
			t.Fatalf("export: %d lines, want %d", lines, len(got))
		}
		// By resource: the sandbox's own records.
		var mine []store.AuditRecord
		json.Unmarshal(callWant(t, base, 200, "GET", "/audit?resource="+id, hdr...), &mine)
		if len(mine) != len(want)-1 {
			t.Fatalf("records of %s: %d, want %d", id, len(mine), len(want)-1)
		}
	}
	check(f.url, asA)

	// B's trail: its refused call only.
	var bs []store.AuditRecord
	json.Unmarshal(f.want(200, "GET", "/audit", "", asB...), &bs)
	if len(bs) != 1 || bs[0].Action != "DELETE /sandboxes/{sandboxID}" || bs[0].Status != 404 || bs[0].TeamID != tb.TeamID || bs[0].KeyName != "bob" {
		t.Fatalf("team B's trail: %+v", bs)
	}
	// A member key may not read the trail; bad queries are 400s.
	var member api.CreatedKey
	json.Unmarshal(f.want(201, "POST", "/api-keys", `{"name":"carol"}`, asA...), &member)
	f.want(403, "GET", "/audit", "", "X-API-KEY", member.Key)
	f.want(403, "GET", "/audit?all=true", "", asA...)
	for _, q := range []string{"since=yesterday", "until=3", "limit=0", "limit=5000", "next=nope", "format=xml", "resource=a%20b"} {
		f.want(400, "GET", "/audit?"+q, "", asA...)
	}
	// An operator reads every team's with all=true.
	if err := w.Flush(context.Background()); err != nil {
		t.Fatal(err)
	}
	var every []store.AuditRecord
	json.Unmarshal(f.want(200, "GET", "/audit?all=true&since="+url.QueryEscape(start.UTC().Format(time.RFC3339Nano)), ""), &every)
	if len(every) != len(want)+2 { // A's, B's, and the member key's creation
		t.Fatalf("every team's records: %d", len(every))
	}

	// The replica stops (its writer closes); a new one on the same store
	// reads the same trail.
	w.Close()
	srv := httptest.NewServer(api.New(api.Config{Control: f.ctl, Store: f.st, Audit: audit.NewWriter(f.st, nil)}))
	defer srv.Close()
	check(srv.URL, asA)
}

// callWant is fnode.want against another server.
func callWant(t *testing.T, base string, code int, method, path string, hdr ...string) []byte {
	t.Helper()
	got, b, _ := call(t, base, method, path, "", hdr...)
	if got != code {
		t.Fatalf("%s %s = %d %s, want %d", method, path, got, strings.TrimSpace(string(b)), code)
	}
	return b
}

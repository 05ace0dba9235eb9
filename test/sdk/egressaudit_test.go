package sdk

import (
	"encoding/json"
	"strings"
	"testing"
	"time"

	"github.com/spore-run/spore/internal/api"
)

// The egress audit through the API and the CLI, the sandbox driven by the
// stock SDK (egressaudit.mjs): with denyOut one of two outside hosts,
// the sandbox reaches the other and is refused the first; once killed,
// `spore logs --egress` and GET /sandboxes/{id}/egress still list both
// attempts (the allowed one with its bytes, the denied one with its rule).
// Bad input is a 4xx with a JSON {code,message}, and the CLI exits
// non-zero.
func TestEgressAuditThroughTheAPI(t *testing.T) {
	s := newServer(t)
	peerHosts(t, "sporetest-audit-peer", "sptaud", []string{"198.18.0.2", "198.18.0.3"}, 18782)
	out := s.node("egressaudit.mjs", "PEER_A=http://198.18.0.2:18782", "PEER_B=http://198.18.0.3:18782")
	t.Log(out)
	i := strings.LastIndex(out, "SANDBOX:")
	if i < 0 || !strings.Contains(out, "2 passed, 0 failed") {
		t.Fatal("the SDK part did not pass")
	}
	id := strings.TrimSpace(out[i+len("SANDBOX:"):])
	if j := strings.IndexByte(id, '\n'); j >= 0 {
		id = id[:j]
	}

	var a api.EgressAudit
	for deadline := time.Now().Add(15 * time.Second); ; time.Sleep(200 * time.Millisecond) {
		code, b := s.rest("GET", "/sandboxes/"+id+"/egress", "")
		if code == 200 {
			a = api.EgressAudit{}
			json.Unmarshal(b, &a)
			if audited(a, "198.18.0.2:18782", true) && audited(a, "198.18.0.3:18782", false) {
				break
			}
		}
		if time.Now().After(deadline) {
			t.Fatalf("GET /sandboxes/%s/egress after the kill: %d %s", id, code, b)
		}
	}
	if !a.Complete || a.SandboxID != id {
		t.Errorf("audit header: %+v", a)
	}
	for _, e := range a.Entries {
		if e.Dst == "198.18.0.2:18782" && e.Allowed && (e.BytesIn <= 0 || e.BytesOut <= 0 || e.End == "") {
			t.Errorf("allowed entry without its bytes or end: %+v", e)
		}
		if e.Dst == "198.18.0.3:18782" && (e.Allowed || e.Rule != "deny") {
			t.Errorf("denied entry: %+v", e)
		}
	}
	if code, b := s.rest("GET", "/sandboxes/"+id+"/egress?limit=1", ""); code != 200 || strings.Count(string(b), `"dst"`) != 1 {
		t.Errorf("limit=1: %d %s", code, b)
	}
	if code, b := s.rest("GET", "/sandboxes/"+id+"/egress?since="+time.Now().Add(time.Hour).UTC().Format(time.RFC3339), ""); code != 200 || strings.Contains(string(b), `"dst"`) {
		t.Errorf("since an hour ahead: %d %s", code, b)
	}

	// The CLI: a table, and JSON.
	table := s.ok("logs", "--egress", id)
	if !strings.Contains(table, "198.18.0.3:18782") || !strings.Contains(table, "denied") || !strings.Contains(table, " deny ") ||
		!strings.Contains(table, "198.18.0.2:18782") || !strings.Contains(table, "allowed") {
		t.Errorf("spore logs --egress:\n%s", table)
	}
	var viaCLI api.EgressAudit
	if err := json.Unmarshal([]byte(s.ok("logs", "--egress", "--json", "--since", "1h", id)), &viaCLI); err != nil || len(viaCLI.Entries) != len(a.Entries) {
		t.Errorf("spore logs --egress --json: %v, %d entries, want %d", err, len(viaCLI.Entries), len(a.Entries))
	}

	// Its logs (the audit trail's records of it): `spore logs` and the
	// stock E2B CLI's `sandbox logs` (GET /sandboxes/{id}/logs) show its
	// creation, with its egress summary once it is gone.
	deadline := time.Now().Add(15 * time.Second)
	for out := ""; !strings.Contains(out, "lifecycle  created"); out = s.ok("logs", id) {
		if time.Now().After(deadline) {
			t.Fatalf("spore logs %s never showed its creation:\n%s", id, out)
		}
		time.Sleep(200 * time.Millisecond)
	}
	if out := s.e2bOK("sandbox", "logs", "--format", "json", id); !strings.Contains(out, `"message":"created`) || !strings.Contains(out, `"logger":"lifecycle"`) {
		t.Errorf("e2b sandbox logs %s:\n%s", id, out)
	}

	// Bad input.
	for _, c := range []struct {
		path string
		code int
	}{
		{"/sandboxes/" + id + "/egress?since=yesterday", 400},
		{"/sandboxes/" + id + "/egress?limit=0", 400},
		{"/sandboxes/" + id + "/egress?limit=10001", 400},
		{"/sandboxes/" + id + "/egress?limit=x", 400},
		{"/sandboxes/bad..id/egress", 400},
		{"/sandboxes/inever0000000000001/egress", 404},
	} {
		code, b := s.rest("GET", c.path, "")
		var e struct {
			Code    int    `json:"code"`
			Message string `json:"message"`
		}
		if code != c.code || json.Unmarshal(b, &e) != nil || e.Code != c.code || e.Message == "" {
			t.Errorf("GET %s: %d %s, want %d with {code,message}", c.path, code, b, c.code)
		}
	}
	for _, args := range [][]string{{"logs", "--level", "loud", id}, {"logs", "--egress", "--follow", id}, {"logs", "--limit", "-1", id},
		{"logs", "--egress", "--limit", "-1", id}, {"logs", "--egress", "inever0000000000001"}, {"logs", "inever0000000000001"}, {"logs", "--egress"}} {
		if out, errs, code := s.cli("", args...); code == 0 {
			t.Errorf("spore %v: exit 0: %s%s", args, out, errs)
		}
	}
}

func audited(a api.EgressAudit, dst string, allowed bool) bool {
	for _, e := range a.Entries {
		if e.Dst == dst && e.Allowed == allowed && !e.Open {
			return true
		}
	}
	return false
}

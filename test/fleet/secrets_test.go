package fleet

import (
	"encoding/json"
	"fmt"
	"strings"
	"testing"
	"time"
)

// TestSecretsAcrossReplicas: the secrets API and network rules in a fleet
// (two API replicas on PostgreSQL, a node agent over RPC). A secret
// created through replica 1 is read, and its value used, through replica
// 2 (one secrets key for the fleet: replica 2 opens what replica 1
// sealed); the node installs the sandbox's egress CA in its trust store
// and points clients at it; a rotation through replica 1 is taken; a
// rule naming a deleted secret is refused through either replica.
func TestSecretsAcrossReplicas(t *testing.T) {
	h := upFleet(t, 1, "sc", "--replicas=2")
	api1, api2 := h.st.APIURLs[0], h.st.APIURLs[1]
	node := h.st.Nodes[0].ID
	if !waitFor(time.Minute, func() bool {
		code, b := h.rest(api2, "POST", "/sandboxes", fmt.Sprintf(`{"templateID":"base","sporeNodeID":%q}`, node))
		var sb sandbox
		json.Unmarshal(b, &sb)
		if code == 201 {
			h.rest(api2, "DELETE", "/sandboxes/"+sb.SandboxID, "")
		}
		return code == 201
	}) {
		t.Fatalf("replica 2 never reached the node")
	}
	if code, b := h.rest(api1, "POST", "/secrets", `{"name":"fleet-key","value":"sk-fleet-1"}`); code != 201 {
		t.Fatalf("create the secret through replica 1: %d %s", code, b)
	}
	if code, b := h.rest(api2, "GET", "/secrets/fleet-key", ""); code != 200 || !strings.Contains(string(b), `"currentVersion":1`) {
		t.Fatalf("read it through replica 2: %d %s", code, b)
	}
	rules := `{"api.fleet.test":[{"transform":{"headers":{"Authorization":"Bearer ${e2b.secrets.fleet-key}"}}}]}`
	code, b := h.rest(api2, "POST", "/sandboxes", fmt.Sprintf(`{"templateID":"base","sporeNodeID":%q,"network":{"rules":%s}}`, node, rules))
	if code != 201 {
		t.Fatalf("create with rules through replica 2 (it opens the secret replica 1 sealed): %d %s", code, b)
	}
	var sb sandbox
	json.Unmarshal(b, &sb)
	defer h.rest(api1, "DELETE", "/sandboxes/"+sb.SandboxID, "")
	got := h.run(api1, sb.SandboxID, "grep -c 'BEGIN CERTIFICATE' /usr/local/share/ca-certificates/spore-egress.crt; echo $SSL_CERT_FILE; "+
		"openssl x509 -noout -subject -in /usr/local/share/ca-certificates/spore-egress.crt")
	if !strings.HasPrefix(got, "1\n/etc/ssl/certs/ca-certificates.crt\n") || !strings.Contains(got, "Spore egress CA") {
		t.Fatalf("the sandbox's trust store: %q", got)
	}
	if code, b := h.rest(api1, "POST", "/secrets/fleet-key", `{"value":"sk-fleet-2"}`); code != 200 || !strings.Contains(string(b), `"currentVersion":2`) {
		t.Fatalf("rotate through replica 1: %d %s", code, b)
	}
	if code, b := h.rest(api2, "GET", "/sandboxes/"+sb.SandboxID, ""); code != 200 || !strings.Contains(string(b), "${e2b.secrets.fleet-key}") || strings.Contains(string(b), "sk-fleet") {
		t.Fatalf("getInfo through replica 2: %d %s", code, b)
	}
	if code, _ := h.rest(api2, "DELETE", "/secrets/fleet-key", ""); code != 204 {
		t.Fatalf("delete through replica 2: %d", code)
	}
	for _, api := range []string{api1, api2} {
		if code, b := h.rest(api, "PUT", "/sandboxes/"+sb.SandboxID+"/network", `{"rules":`+rules+`}`); code != 400 || !strings.Contains(string(b), "does not exist") {
			t.Fatalf("a rule naming the deleted secret via %s: %d %s", api, code, b)
		}
	}
}

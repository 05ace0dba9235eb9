package sdk

import (
	"encoding/json"
	"io"
	"net/http"
	"strings"
	"testing"

	"github.com/spore-run/spore/internal/api"
)

// Two teams through the stock SDK against `spore up` (teams.mjs): the
// operator key makes team B and a key of each team; each team sees only
// its own sandboxes and secrets, the other's sandbox is "not found" to
// every SDK call and keeps running, secret names are per team; team B's
// quota (one sandbox) refuses, then admits again after a kill; each team
// saves a template of one name and creates from its own.
func TestTwoTeamsThroughTheSDK(t *testing.T) {
	s := newServer(t)
	post := func(path, body string) []byte {
		t.Helper()
		req, _ := http.NewRequest("POST", "http://"+s.addr+path, strings.NewReader(body))
		req.Header.Set("X-API-KEY", apiKey)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		if resp.StatusCode != http.StatusCreated {
			t.Fatalf("POST %s %s = %d %s", path, body, resp.StatusCode, b)
		}
		return b
	}
	var team api.TeamInfo
	json.Unmarshal(post("/teams", `{"name":"sdk-team-b","quotas":{"sandboxes":1}}`), &team)
	var a, b api.CreatedKey
	json.Unmarshal(post("/api-keys", `{"name":"team-a"}`), &a)
	json.Unmarshal(post("/api-keys", `{"name":"team-b","teamID":"`+team.TeamID+`"}`), &b)
	out := s.node("teams.mjs", "KEY_A="+a.Key, "KEY_B="+b.Key)
	t.Log(out)
	if !strings.Contains(out, "10 passed, 0 failed") {
		t.Fatal("the SDK part did not pass")
	}
}

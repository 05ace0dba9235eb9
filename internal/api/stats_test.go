package api_test

import (
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"testing"

	"github.com/spore-run/spore/internal/api"
	"github.com/spore-run/spore/internal/control"
)

// The node's quarantined records and pending cleanups are visible to the
// operator in GET /debug/stats (key required), not only in the log.
func TestStatsShowNodeHousekeeping(t *testing.T) {
	st := openStore(t)
	ctl := control.New(control.Config{Store: st, Nodes: control.Nodes{"local": &scriptedEngine{}}})
	report := api.NodeReport{Quarantined: []string{"i123: record version 99 is newer than this engine"}, PendingCleanups: 2}
	srv := httptest.NewServer(api.New(api.Config{Control: ctl, Store: st, Node: func() api.NodeReport { return report }}))
	t.Cleanup(srv.Close)

	req, _ := http.NewRequest("GET", srv.URL+"/debug/stats", nil)
	if resp, err := http.DefaultClient.Do(req); err != nil {
		t.Fatal(err)
	} else if resp.Body.Close(); resp.StatusCode != http.StatusUnauthorized {
		t.Fatalf("without a key: %d, want 401", resp.StatusCode)
	}
	req.Header.Set("X-API-KEY", key)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var got api.Stats
	if err := json.NewDecoder(resp.Body).Decode(&got); err != nil {
		t.Fatal(err)
	}
	if got.Node == nil || len(got.Node.Quarantined) != 1 || got.Node.Quarantined[0] != report.Quarantined[0] || got.Node.PendingCleanups != 2 {
		t.Fatalf("stats node = %+v, want %+v", got.Node, report)
	}
}

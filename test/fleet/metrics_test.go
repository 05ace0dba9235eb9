package fleet

import (
	"io"
	"net/http"
	"os"
	"strings"
)

// checkMetrics scrapes every node's and replica's /metrics: refused
// without the metrics token (and with a wrong one), served with it,
// naming the host's and the fleet's figures; the token is refused on the
// API's other routes.
func (h *harness) checkMetrics() {
	t := h.t
	t.Helper()
	tb, err := os.ReadFile(h.st.MetricsTokenFile)
	if err != nil {
		t.Fatal(err)
	}
	token := strings.TrimSpace(string(tb))
	scrape := func(url, bearer string) (int, string) {
		t.Helper()
		req, _ := http.NewRequest("GET", url, nil)
		if bearer != "" {
			req.Header.Set("Authorization", "Bearer "+bearer)
		}
		resp, err := h.http.Do(req)
		if err != nil {
			t.Fatalf("GET %s: %v", url, err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(b)
	}
	for _, n := range h.st.Nodes {
		url := "http://" + n.Metrics + "/metrics"
		for _, bearer := range []string{"", "not-the-metrics-token", h.key} {
			if code, b := scrape(url, bearer); code != http.StatusUnauthorized || strings.Contains(b, "spore_") {
				t.Fatalf("node %d's metrics with bearer %q: %d %.200s, want 401", n.Index, bearer, code, b)
			}
		}
		code, b := scrape(url, token)
		for _, want := range []string{"spore_engine_launch_slots ", `spore_host_sandboxes{state="running"}`, "spore_host_memory_free_bytes ",
			`spore_host_snapshot_fetches_total{outcome="fetched"}`, `spore_host_admission_refusals_total{reason="memory"}`, "spore_host_chunk_cache_capacity_bytes "} {
			if code != http.StatusOK || !strings.Contains(b, want) {
				t.Fatalf("node %d's metrics: %d, want %q in the spore_ lines:\n%s", n.Index, code, want, sporeLines(b))
			}
		}
	}
	for _, base := range h.st.APIURLs {
		code, b := scrape(base+"/metrics", token)
		if code != http.StatusOK || !strings.Contains(b, "spore_api_requests_total") {
			t.Fatalf("%s/metrics with the metrics token: %d %.300s", base, code, b)
		}
		for _, n := range h.st.Nodes {
			if !strings.Contains(b, `spore_node_info{draining="false",node="`+n.ID+`",state="ready"} 1`) {
				t.Fatalf("%s/metrics does not show node %s ready:\n%s", base, n.ID, sporeLines(b))
			}
		}
		if code, _ := scrape(base+"/metrics", "not-the-metrics-token"); code != http.StatusUnauthorized {
			t.Fatalf("%s/metrics with a wrong token: %d, want 401", base, code)
		}
		if code, _ := scrape(base+"/v2/sandboxes", token); code != http.StatusUnauthorized {
			t.Fatalf("%s/v2/sandboxes with the metrics token: %d, want 401 (it opens /metrics only)", base, code)
		}
	}
}

// sporeLines are the spore_ samples of a scrape (what a failure shows).
func sporeLines(b string) string {
	var out []string
	for _, l := range strings.Split(b, "\n") {
		if strings.HasPrefix(l, "spore_") {
			out = append(out, l)
		}
	}
	return strings.Join(out, "\n")
}

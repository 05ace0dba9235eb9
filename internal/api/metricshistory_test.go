package api_test

import (
	"context"
	"encoding/json"
	"fmt"
	"strconv"
	"testing"
	"time"

	"github.com/spore-run/spore/internal/control"
)

// GET /sandboxes/{id}/metrics (E2B's getMetrics(start, end)) lists the
// samples the sandbox's node keeps, in the window asked (Unix seconds,
// both bounds optional): a window that ends before the first sample is
// empty; one that reaches now with no sample in it gets a sample read
// now; a bad bound is a 400 that names it; a hibernated sandbox has
// none. Before, every call read one sample now and ignored the window.
func TestMetricsHistory(t *testing.T) {
	f := newFnode(t)
	sb := f.create(`{"templateID":"base","timeout":600}`)
	ctx := context.Background()
	before := time.Now().Add(-2 * time.Second)
	f.n.Engine.SampleActivity(ctx) // the first sample of an instance reads its CPU time only
	time.Sleep(20 * time.Millisecond)
	f.n.Engine.SampleActivity(ctx)
	metrics := func(q string) []control.Metric {
		t.Helper()
		var ms []control.Metric
		if err := json.Unmarshal(f.want(200, "GET", "/sandboxes/"+sb.SandboxID+"/metrics"+q, ""), &ms); err != nil {
			t.Fatal(err)
		}
		return ms
	}
	all := metrics("")
	if len(all) != 1 || all[0].MemUsed <= 0 || all[0].TimestampUnix != all[0].Timestamp.Unix() || all[0].Timestamp.Before(before) {
		t.Fatalf("the history after two samples: %+v", all)
	}
	at := all[0].TimestampUnix
	if got := metrics(fmt.Sprintf("?start=%d&end=%d", at, at)); len(got) != 1 || got[0] != all[0] {
		t.Fatalf("the window of the sample's second: %+v, want %+v", got, all[0])
	}
	if got := metrics("?end=" + strconv.FormatInt(before.Unix()-60, 10)); len(got) != 0 {
		t.Fatalf("a window before the sandbox: %+v", got)
	}
	now := metrics("?start=" + strconv.FormatInt(at+1, 10))
	if len(now) != 1 || now[0].TimestampUnix <= at-1 {
		t.Fatalf("a window after the last sample, reaching now: %+v (want one read now)", now)
	}
	for _, q := range []string{"?start=x", "?end=-5", "?start=" + strconv.FormatInt(at, 10) + "&end=" + strconv.FormatInt(at-10, 10)} {
		f.want(400, "GET", "/sandboxes/"+sb.SandboxID+"/metrics"+q, "")
	}
	f.want(204, "POST", "/sandboxes/"+sb.SandboxID+"/hibernate", "")
	if got := metrics(""); len(got) != 0 {
		t.Fatalf("metrics of a hibernated sandbox: %+v", got)
	}
}

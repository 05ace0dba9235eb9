package bench

import (
	"context"
	"encoding/json"
	"errors"
	"net/http/httptest"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"connectrpc.com/connect"

	"github.com/spore-run/spore/internal/api"
	processpb "github.com/spore-run/spore/proto/gen/process"
	"github.com/spore-run/spore/proto/gen/process/processpbconnect"
)

// The density field holding the lowest MemAvailable is written under its
// honest name, and a report written under the old one still reads.
func TestDensityMinMemAvailable(t *testing.T) {
	b, err := json.Marshal(Density{Held: 3, MemAvailableStart: 10, MinMemAvailable: 7})
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(b), `"minMemAvailable":7`) || strings.Contains(string(b), "Peak") {
		t.Fatalf("written as %s", b)
	}
	var back Density
	if err := json.Unmarshal(b, &back); err != nil || back.MinMemAvailable != 7 || back.Held != 3 || back.MemAvailableStart != 10 {
		t.Fatalf("round trip: %+v, %v", back, err)
	}
	// A report.json from before the rename (docs/benchmarks/2026-11-29).
	var old Report
	if err := json.Unmarshal([]byte(`{"schema":1,"density":{"held":957,"memAvailableStart":24000,"memAvailablePeak":2100,"idleRSSBytes":23}}`), &old); err != nil {
		t.Fatal(err)
	}
	if old.Density == nil || old.Density.MinMemAvailable != 2100 || old.Density.Held != 957 || old.Density.IdleRSSBytes != 23 {
		t.Fatalf("old report read as %+v", old.Density)
	}
	if err := json.Unmarshal([]byte(`{"held":1,"memAvailablePeak":`), &back); err == nil {
		t.Fatal("a broken density section was accepted")
	}
}

func TestSummarizeP90(t *testing.T) {
	var s []float64
	for i := 1; i <= 20; i++ {
		s = append(s, float64(i))
	}
	if got := Summarize(s); got.P50 != 10 || got.P90 != 18 || got.P95 != 19 {
		t.Fatalf("%+v", got)
	}
	bad := Summarize(s)
	bad.P90 = 19.5
	if err := validateStats(bad, true); err == nil {
		t.Fatal("p90 above p95 passed validation")
	}
	old := Summarize(s)
	old.P90 = 0 // a report written before p90 existed
	if err := validateStats(old, true); err != nil {
		t.Fatal(err)
	}
}

// A cold create names the template's own shape, which the warm pool never
// serves, and so restores with the template's limits.
func TestColdShape(t *testing.T) {
	req, err := coldShape("base", api.TemplateInfo{TemplateID: "snap1", MemoryMB: 1024, CPUCount: 2})
	if err != nil || req.TemplateID != "base" || req.MemoryMB != 1024 || req.CPUCount != 2 {
		t.Fatalf("%+v, %v", req, err)
	}
	if _, err := coldShape("base", api.TemplateInfo{MemoryMB: 1024}); err == nil {
		t.Fatal("a template without a vCPU count gave a request")
	}
}

func TestPoolServed(t *testing.T) {
	for _, c := range []struct {
		n, restored int
		want        string
	}{{20, 0, "20 of 20"}, {20, 18, "2 of 20"}, {20, 20, "0 of 20"}} {
		if got := poolServed(c.n, c.restored); !strings.HasPrefix(got, c.want+" served by the warm pool") {
			t.Errorf("poolServed(%d, %d) = %q", c.n, c.restored, got)
		}
	}
}

// The bench reads a sandbox's instance and address from the engine's
// record, as the engine writes it.
func TestBareRecord(t *testing.T) {
	dir := t.TempDir()
	recs := filepath.Join(dir, "engine", "sandboxes")
	if err := os.MkdirAll(recs, 0o700); err != nil {
		t.Fatal(err)
	}
	write := func(id, body string) {
		if err := os.WriteFile(filepath.Join(recs, id+".json"), []byte(body), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	write("isbx1", `{"id":"isbx1","instance":"isbx1-3","addr":"10.11.0.6","gen":3}`)
	write("isbx2", `{"id":"isbx2","state":"hibernated"}`)
	b := &Bare{DataDir: dir}
	if inst, err := b.Instance("isbx1"); err != nil || inst != "isbx1-3" {
		t.Fatalf("instance %q, %v", inst, err)
	}
	if addr, err := b.Addr("isbx1"); err != nil || addr != netip.MustParseAddr("10.11.0.6") {
		t.Fatalf("addr %v, %v", addr, err)
	}
	if _, err := b.Addr("isbx2"); err == nil {
		t.Fatal("a record without an address gave one")
	}
	if _, err := b.Instance("isbx2"); err == nil {
		t.Fatal("a record without an instance gave one")
	}
	if _, err := b.Addr("../x"); err == nil {
		t.Fatal("an invalid ID was read")
	}
}

// fakeEnvd answers Process.Start like envd: it checks the access token
// and records the command it was asked to run.
type fakeEnvd struct {
	processpbconnect.UnimplementedProcessHandler
	token string
	got   [][]string
}

func (f *fakeEnvd) Start(_ context.Context, req *connect.Request[processpb.StartRequest], st *connect.ServerStream[processpb.StartResponse]) error {
	if req.Header().Get("X-Access-Token") != f.token {
		return connect.NewError(connect.CodeUnauthenticated, errors.New("bad token"))
	}
	p := req.Msg.GetProcess()
	f.got = append(f.got, append([]string{p.GetCmd()}, p.GetArgs()...))
	return st.Send(&processpb.StartResponse{Event: &processpb.ProcessEvent{Event: &processpb.ProcessEvent_End{
		End: &processpb.ProcessEvent_EndEvent{ExitCode: 0, Exited: true}}}})
}

// The commands.run baseline sends envd the very request the SDK path
// does (bash -l -c, the access token), only not through the API server.
func TestEnvdDirectSendsTheSDKRequest(t *testing.T) {
	f := &fakeEnvd{token: "tok"}
	_, h := processpbconnect.NewProcessHandler(f)
	srv := httptest.NewServer(h)
	defer srv.Close()
	if _, err := runProc(t.Context(), envdAt(srv.URL, "tok"), "true"); err != nil {
		t.Fatal(err)
	}
	if len(f.got) != 1 || !slices.Equal(f.got[0], []string{"/bin/bash", "-l", "-c", "true"}) {
		t.Fatalf("envd was asked to run %q", f.got)
	}
	if _, err := runProc(t.Context(), envdAt(srv.URL, "wrong"), "true"); err == nil {
		t.Fatal("a wrong token was accepted")
	}
}

package sdk

import (
	"encoding/json"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/spore-run/spore/internal/bench"
	"github.com/spore-run/spore/internal/testenv"
)

// TestBenchSmoke runs the whole `spore bench` suite with tiny counts
// against a real server, bare runsc comparisons included, and checks that
// it completes, writes a valid report with every operation and curve, and
// leaves nothing behind. It asserts no timing: the numbers come from
// `spore bench` itself (docs/benchmarks.md).
func TestBenchSmoke(t *testing.T) {
	s := newServer(t)
	out := filepath.Join(t.TempDir(), "report")
	stdout := s.ok("bench", "--quick", "--out", out, "--data-dir", s.data, "--runsc", testenv.Runsc(t), "--cgroup-parent", s.cgroup)
	rep := checkReport(t, out)
	if !strings.Contains(stdout, "| operation |") {
		t.Errorf("bench printed no table:\n%s", stdout)
	}
	for _, name := range []string{"snapshot", "restore", "create from snapshot", "pause", "resume", `commands.run("true")`} {
		op := findOp(t, rep, name)
		if op.Bare == nil || op.Ratio <= 0 || op.BareName == "" {
			t.Errorf("%s has no bare runsc comparison: %+v", name, op)
		}
	}
	if rep.Machine.Runsc == "" || rep.Machine.CPUs == 0 || rep.Machine.MemoryBytes == 0 {
		t.Errorf("machine info incomplete: %+v", rep.Machine)
	}
	// The run cleaned up after itself: no sandboxes, no snapshots but the
	// templates.
	if code, body := s.rest("GET", "/sandboxes", ""); code != 200 || strings.TrimSpace(string(body)) != "[]" {
		t.Errorf("sandboxes left after the bench: %d %s", code, body)
	}
	code, body := s.rest("GET", "/snapshots", "")
	var snaps []struct{ Names []string }
	if code != 200 || json.Unmarshal(body, &snaps) != nil {
		t.Fatalf("list snapshots: %d %s", code, body)
	}
	for _, sn := range snaps {
		if !slices.Contains(sn.Names, "base") && !slices.Contains(sn.Names, "code-interpreter-v1") {
			t.Errorf("snapshot left after the bench: %+v", sn)
		}
	}

	// Bad input: a clear message, a non-zero exit, no report.
	bad := filepath.Join(t.TempDir(), "bad")
	for _, args := range [][]string{
		{"bench", "--sections", "nope", "--out", bad},
		{"bench", "--count", "-1", "--out", bad},
		{"bench", "--density-max", "-5", "--out", bad},
		{"bench", "--local", "--local-restore-targets-burst", "-1", "--out", bad},
		{"up", "--restore-targets-burst", "-1", "--data-dir", bad},
	} {
		o, e, code := s.cli("", args...)
		if code == 0 || e == "" {
			t.Errorf("spore %v: exit %d, stderr %q, stdout %q; want an error", args, code, e, o)
		}
		if _, err := os.Stat(bad); !os.IsNotExist(err) {
			t.Errorf("spore %v wrote %s", args, bad)
		}
	}
}

// TestBenchLocalSmoke runs `spore bench --local`, which starts its own
// server, and checks its report and that it removed everything it made.
func TestBenchLocalSmoke(t *testing.T) {
	testenv.RequireRoot(t)
	bin := buildBinaries(t)
	data := t.TempDir()
	out := filepath.Join(t.TempDir(), "report")
	s := &server{t: t, bin: bin}
	stdout := s.ok("bench", "--local", "--quick", "--sections", "ops,fork,density", "--out", out,
		"--data-dir", data, "--rootfs-dir", testenv.RootFSDir(t), "--runsc", testenv.Runsc(t))
	rep := checkReport(t, out)
	if !rep.Settings.Local || !strings.Contains(stdout, "| operation |") {
		t.Errorf("local run: settings %+v, stdout:\n%s", rep.Settings, stdout)
	}
	if _, err := os.Stat(filepath.Join(data, "bench-local")); !os.IsNotExist(err) {
		t.Errorf("the local bench left its data directory: %v", err)
	}
	if m, _ := filepath.Glob("/run/netns/sbn*"); len(m) > 0 {
		t.Errorf("the local bench left network namespaces: %v", m)
	}
}

// checkReport reads and validates the report in dir and checks that every
// operation the suite measures is in it, with its plots.
func checkReport(t *testing.T, dir string) *bench.Report {
	t.Helper()
	rep, err := bench.ReadReport(filepath.Join(dir, "report.json"))
	if err != nil {
		t.Fatal(err)
	}
	if err := bench.Validate(rep); err != nil {
		t.Fatalf("invalid report: %v", err)
	}
	if rep.Git == "" || rep.Command == "" || !strings.Contains(rep.Command, "bench") {
		t.Errorf("report lacks provenance: git %q command %q", rep.Git, rep.Command)
	}
	md, err := os.ReadFile(filepath.Join(dir, "report.md"))
	if err != nil || !strings.Contains(string(md), "| operation |") {
		t.Errorf("report.md: %v", err)
	}
	if hasOp(rep, "create from template") { // the ops section ran
		for _, name := range []string{"create from template", "create from snapshot", "snapshot", "snapshot: source paused",
			"restore", "rollback", "pause", "resume", "hibernate", "resume from hibernation", "kill",
			`commands.run("true")`, "upload 1 MB", "download 1 MB", `runCode("1+1")`} {
			findOp(t, rep, name)
		}
	}
	for _, c := range rep.Curves {
		if _, err := os.Stat(filepath.Join(dir, c.Name+".png")); err != nil {
			t.Errorf("plot of %s: %v", c.Name, err)
		}
	}
	if rep.Density == nil || rep.Density.Held < 1 {
		t.Errorf("density: %+v", rep.Density)
	}
	return rep
}

func hasOp(rep *bench.Report, op string) bool {
	for _, o := range rep.Ops {
		if o.Name == op {
			return true
		}
	}
	return false
}

func findOp(t *testing.T, rep *bench.Report, name string) bench.Op {
	t.Helper()
	for _, o := range rep.Ops {
		if o.Name == name {
			if o.Stats.N == 0 {
				t.Errorf("op %s has no samples", name)
			}
			return o
		}
	}
	t.Errorf("op %s missing from the report", name)
	return bench.Op{}
}

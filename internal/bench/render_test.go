package bench

import (
	"bytes"
	"image/png"
	"math"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
	"time"
)

// sampleReport builds a small but complete report.
func sampleReport() *Report {
	met, missed := true, false
	snap := []float64{55.1, 57.6, 58.0, 61.2, 70.3}
	bare := Summarize([]float64{58.0, 59.1, 60.4, 62.0, 66.6})
	snapStats := Summarize(snap)
	create := []float64{980, 1040, 1100, 1210}
	upload := []float64{450.2, 471.4, 480.9}
	return &Report{
		Schema:    SchemaVersion,
		StartedAt: time.Date(2025, 6, 1, 12, 30, 0, 0, time.UTC),
		TookSec:   312.4,
		Command:   "spore bench --local --count 5 --out /tmp/bench",
		Git:       "0123abcd-dirty",
		Machine: Machine{
			Hostname: "bench1", Kernel: "6.8.0-45-generic", CPUModel: "AMD EPYC 7B13",
			CPUs: 8, MemoryBytes: 32 << 30, GoVersion: "go1.26.8",
			Runsc: "release-20250512.0", Platform: "systrap", Cgroups: "v2",
		},
		Settings: Settings{Target: "http://127.0.0.1:7070", Local: true, Count: 5},
		Ops: []Op{
			{
				Name: "snapshot", Group: "lifecycle", Unit: "ms",
				Samples: snap, Stats: snapStats,
				BareName: "checkpoint --leave-running", Bare: &bare, Ratio: snapStats.P50 / bare.P50,
				Parts: map[string]Stats{
					"pause":  Summarize([]float64{20, 21, 25}),
					"write":  Summarize([]float64{30, 31, 35}),
					"resume": Summarize([]float64{2, 3, 4}),
				},
				Goal: 50, Met: &missed,
				Note: "includes the API round trip",
			},
			{
				Name: "create", Group: "lifecycle", Unit: "ms",
				Samples: create, Stats: Summarize(create),
			},
			{
				Name: "upload 64 MiB", Group: "data", Unit: "MB/s",
				Samples: upload, Stats: Summarize(upload),
				Goal: 200, Met: &met,
			},
		},
		Curves: []Curve{
			sampleCurve("snapshot-vs-memory", "Snapshot vs memory", "memory (MiB)"),
			sampleCurve("fork-vs-n", "Fork vs n", "n"),
		},
		Density: &Density{
			IdleRSSBytes: 38 << 20, CgroupBytes: 30 << 20,
			Held: 200, Max: 200,
			MemAvailableStart: 30 << 30, MinMemAvailable: 22 << 30,
			TookSec: 95, Projected: 780,
		},
		Notes: []string{"fork skipped: pool disabled", "numbers from a shared VM"},
	}
}

func sampleCurve(name, title, xLabel string) Curve {
	series := func(s string, scale float64) Series {
		var pts []Point
		for _, x := range []float64{64, 256, 1024} {
			pts = append(pts, Point{X: x, Stats: Summarize([]float64{scale * x / 10, scale * x / 8, scale * x / 6})})
		}
		return Series{Name: s, Points: pts}
	}
	return Curve{Name: name, Title: title, XLabel: xLabel, YLabel: "ms",
		Series: []Series{series("spore", 1), series("bare runsc", 1.2)}}
}

func TestRenderWriteAll(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "out")
	r := sampleReport()
	if err := Validate(r); err != nil {
		t.Fatalf("Validate(sample): %v", err)
	}
	if err := WriteAll(dir, r); err != nil {
		t.Fatalf("WriteAll: %v", err)
	}

	got, err := ReadReport(filepath.Join(dir, "report.json"))
	if err != nil {
		t.Fatalf("ReadReport: %v", err)
	}
	if err := Validate(got); err != nil {
		t.Errorf("Validate(read back): %v", err)
	}
	if !reflect.DeepEqual(got, r) {
		t.Errorf("report.json does not round-trip:\n got %+v\nwant %+v", got, r)
	}
	raw, err := os.ReadFile(filepath.Join(dir, "report.json"))
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.HasSuffix(raw, []byte("}\n")) || !bytes.Contains(raw, []byte("\n  \"schema\": 1")) {
		t.Errorf("report.json is not indented JSON with a trailing newline:\n%.200s", raw)
	}

	entries, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range entries {
		if strings.HasSuffix(e.Name(), ".tmp") {
			t.Errorf("temporary file left behind: %s", e.Name())
		}
	}

	checkPNGs(t, dir, r)
}

func checkPNGs(t *testing.T, dir string, r *Report) {
	t.Helper()
	for _, c := range r.Curves {
		f, err := os.Open(filepath.Join(dir, c.Name+".png"))
		if err != nil {
			t.Errorf("plot of %s: %v", c.Name, err)
			continue
		}
		img, err := png.Decode(f)
		f.Close()
		if err != nil {
			t.Errorf("decode %s.png: %v", c.Name, err)
			continue
		}
		b := img.Bounds()
		if b.Dx() <= 0 || b.Dy() <= 0 || b.Dx() <= b.Dy() {
			t.Errorf("%s.png is %dx%d, want a non-empty landscape image", c.Name, b.Dx(), b.Dy())
		}
	}
}

func TestRenderMarkdown(t *testing.T) {
	r := sampleReport()
	var buf bytes.Buffer
	if err := WriteMarkdown(&buf, r); err != nil {
		t.Fatalf("WriteMarkdown: %v", err)
	}
	md := buf.String()
	want := []string{
		"2025-06-01 12:30 UTC", "`0123abcd-dirty`",
		"```\nspore bench --local --count 5 --out /tmp/bench\n```",
		"AMD EPYC 7B13", "8 CPUs", "32.0 GiB", "kernel 6.8.0-45-generic",
		"runsc release-20250512.0", "platform systrap", "cgroups v2",
		"| operation | p50 | p95 | max | n | bare runsc (p50) | spore/bare | goal |  |",
		"| snapshot [^1] | 58.0 ms | 70.3 ms | 70.3 ms | 5 | 60.4 ms (`checkpoint --leave-running`) | 0.96x | < 50 ms | missed |",
		"| create | 1.04 s | 1.21 s | 1.21 s | 4 | – | – | – |  |",
		"| upload 64 MiB | 471 MB/s | 481 MB/s | 481 MB/s | 3 | – | – | > 200 MB/s | met |",
		"[^1]: includes the API round trip",
		"## Where the time goes",
		"- **snapshot** (p50/p95): write 31.0/35.0 ms, pause 21.0/25.0 ms, resume 3.0/4.0 ms",
		"## Snapshot vs memory", "## Fork vs n",
		"| memory (MiB) | spore p50 (ms) | spore p95 (ms) | bare runsc p50 (ms) | bare runsc p95 (ms) |",
		"| 256 | 32.0 | 42.7 | 38.4 | 51.2 |",
		"![Snapshot vs memory](snapshot-vs-memory.png)", "![Fork vs n](fork-vs-n.png)",
		"## Density", "38.0 MiB", "Held 200", "stopped at --density-max", "780",
		"30.0 GiB at start, 22.0 GiB at its lowest",
		"## Notes", "- fork skipped: pool disabled",
	}
	for _, s := range want {
		if !strings.Contains(md, s) {
			t.Errorf("report.md lacks %q", s)
		}
	}
	if t.Failed() {
		t.Logf("report.md:\n%s", md)
	}
}

func TestRenderMarkdownRefused(t *testing.T) {
	r := sampleReport()
	r.Density.Refused = "create: out of memory"
	var buf bytes.Buffer
	if err := WriteMarkdown(&buf, r); err != nil {
		t.Fatal(err)
	}
	if md := buf.String(); !strings.Contains(md, "create: out of memory") || strings.Contains(md, "--density-max") {
		t.Errorf("refusal not rendered:\n%s", md)
	}
}

func TestPlotRejectsEmptyCurve(t *testing.T) {
	r := sampleReport()
	r.Curves[1].Series[0].Points = nil
	_, err := WritePlots(t.TempDir(), r)
	if err == nil || !strings.Contains(err.Error(), "fork-vs-n") {
		t.Errorf("WritePlots with an empty series: err = %v, want one naming the curve", err)
	}
}

func TestValidate(t *testing.T) {
	tests := []struct {
		name   string
		mutate func(r *Report)
		want   string // substring of the error
	}{
		{"wrong schema", func(r *Report) { r.Schema = 99 }, "schema"},
		{"nothing measured", func(r *Report) { r.Ops, r.Curves, r.Density = nil, nil, nil }, "no ops, curves or density"},
		{"unnamed op", func(r *Report) { r.Ops[1].Name = "" }, "no name"},
		{"bad unit", func(r *Report) { r.Ops[1].Unit = "s" }, `op 1 "create": unit`},
		{"mismatched n", func(r *Report) { r.Ops[1].Stats.N = 7 }, `op 1 "create": stats.n is 7`},
		{"no samples", func(r *Report) { r.Ops[1].Samples, r.Ops[1].Stats.N = nil, 0 }, "no samples"},
		{"p95 below p50", func(r *Report) { r.Ops[0].Stats.P95 = 1 }, `op 0 "snapshot": stats: want p50 <= p95 <= max`},
		{"max below p95", func(r *Report) { r.Ops[0].Stats.Max = 60 }, "p50 <= p95 <= max"},
		{"NaN sample", func(r *Report) { r.Ops[2].Samples[1] = math.NaN() }, `op 2 "upload 64 MiB": sample 1 is NaN`},
		{"Inf stat", func(r *Report) { r.Ops[2].Stats.Mean = math.Inf(1) }, "mean is +Inf"},
		{"NaN point", func(r *Report) { r.Curves[0].Series[1].Points[0].Stats.P50 = math.NaN() }, "p50 is NaN"},
		{"zero ratio", func(r *Report) { r.Ops[0].Ratio = 0 }, "ratio"},
		{"bad curve name", func(r *Report) { r.Curves[0].Name = "Snapshot vs memory" }, `curve 0 "Snapshot vs memory": name`},
		{"duplicate curve", func(r *Report) { r.Curves[1].Name = r.Curves[0].Name }, "duplicate"},
		{"no series", func(r *Report) { r.Curves[1].Series = nil }, `curve 1 "fork-vs-n": no series`},
		{"empty series", func(r *Report) { r.Curves[1].Series[1].Points = nil }, `series 1 "bare runsc" has no points`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			r := sampleReport()
			tt.mutate(r)
			err := Validate(r)
			if err == nil {
				t.Fatalf("Validate accepted a report with %s", tt.name)
			}
			if !strings.Contains(err.Error(), tt.want) {
				t.Errorf("Validate: %v\nwant an error containing %q", err, tt.want)
			}
		})
	}
}

func TestRenderKeepsOldReportOnFailure(t *testing.T) {
	dir := t.TempDir()
	if err := WriteAll(dir, sampleReport()); err != nil {
		t.Fatal(err)
	}
	before, err := os.ReadFile(filepath.Join(dir, "report.json"))
	if err != nil {
		t.Fatal(err)
	}
	bad := sampleReport()
	bad.Ops[0].Stats.P50 = math.NaN() // JSON cannot encode NaN
	if err := WriteAll(dir, bad); err == nil {
		t.Fatal("WriteAll of a report with NaN succeeded")
	}
	after, err := os.ReadFile(filepath.Join(dir, "report.json"))
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(before, after) {
		t.Error("a failed WriteAll changed report.json")
	}
	matches, _ := filepath.Glob(filepath.Join(dir, ".*.tmp"))
	if len(matches) > 0 {
		t.Errorf("temporary files left behind: %v", matches)
	}
}

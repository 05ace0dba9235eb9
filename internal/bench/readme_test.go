package bench

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/spore-run/spore/internal/errdefs"
)

// README.md's speed table is what the reports docs/benchmarks/LATEST names
// render; when it is not, the failure shows the difference and the command
// that fixes it.
func TestREADMESpeedTable(t *testing.T) {
	diff, err := ReadmeDiff(filepath.Join("..", ".."))
	if err != nil {
		t.Fatal(err)
	}
	if diff != "" {
		t.Error(diff)
	}
}

// speedOp is an operation with three samples whose p50 is p50.
func speedOp(name string, p50 float64) Op {
	s := []float64{p50 - 1, p50, p50 + 2}
	return Op{Name: name, Unit: unitMs, Samples: s, Stats: Summarize(s)}
}

// withBare gives op a bare measurement whose p50 is p50.
func withBare(op Op, bareName string, p50 float64) Op {
	b := Summarize([]float64{p50, p50 + 1})
	b.P50 = p50
	op.BareName, op.Bare, op.Ratio = bareName, &b, op.Stats.P50/p50
	return op
}

// speedReports are an ops report with every operation the table shows and
// a density report, each number distinct, so a cell taken from the wrong
// field shows.
func speedReports() (ops, density *Report) {
	restore := withBare(speedOp("restore", 39.2), "runsc restore", 85.021)
	create := withBare(speedOp("create from snapshot", 50.104), "runsc restore", 85.021) // the same bare measurement
	ops = &Report{Schema: SchemaVersion, StartedAt: time.Date(2026, 12, 2, 0, 30, 0, 0, time.UTC), Ops: []Op{
		speedOp("create from template", 4.363),
		speedOp("kill", 31.66),
		create, restore,
		withBare(speedOp("snapshot", 29.439), "runsc checkpoint --leave-running", 27.914),
		speedOp("rollback", 54.82),
		withBare(speedOp("pause", 7.668), "runsc pause", 6.681),
		withBare(speedOp("resume", 7.419), "runsc resume", 7.297),
		withBare(speedOp(`commands.run("true")`, 13.108), "envd direct: the same request, no API server", 12.033),
		withBare(speedOp(`commands.run("true"), 100ms apart`, 5.522), "envd direct: the same request, no API server", 5.075),
		speedOp("fork n=10", 486.967),
		speedOp("fork n=100", 5778.981),
	}}
	density = &Report{Schema: SchemaVersion, StartedAt: time.Date(2026, 11, 29, 13, 13, 0, 0, time.UTC),
		Machine: Machine{MemoryBytes: 25276514304},
		Density: &Density{IdleRSSBytes: 23880574, Held: 957, Max: 4000, Refused: "host memory low (HTTP 429)"}}
	return ops, density
}

// Every cell comes from the reports: p50s, bare p50s after the bare
// command's short name, the density fill; the line under the table links
// both reports.
func TestSpeedTable(t *testing.T) {
	ops, density := speedReports()
	got, err := SpeedTable(Latest{Ops: "d/full-2", Density: "old"}, ops, density)
	if err != nil {
		t.Fatal(err)
	}
	want := "\n" + `| operation (p50) | Spore | bare runsc |
|---|---|---|
| ` + "`Sandbox.create()`" + ` from a template (warm pool) | 4.4 ms | |
| create from a snapshot / its restore phase | 50.1 / 39.2 ms | restore 85.0 ms |
| live snapshot | 29.4 ms | checkpoint 27.9 ms |
| rollback in place | 54.8 ms | |
| pause / resume | 7.7 / 7.4 ms | 6.7 / 7.3 ms |
| fork of 10 / of 100 | 487.0 ms / 5.78 s | |
| ` + "`commands.run(\"true\")`" + `, 100 ms apart / back to back | 5.5 / 13.1 ms | envd direct 5.1 / 12.0 ms |
| idle sandboxes on a 23.5 GiB host | 957 (22.8 MiB each), then a create refused | |

Numbers from [d/full-2](docs/benchmarks/d/full-2/report.md) (run 2026-12-02), idle sandboxes from [old](docs/benchmarks/old/report.md) (run 2026-11-29): the reports [docs/benchmarks/LATEST](docs/benchmarks/LATEST) names. ` + "`make readme-table`" + ` writes this table from them, and ` + "`TestREADMESpeedTable`" + ` fails when it differs.

`
	if got != want {
		t.Errorf("table differs (- got, + want):\n%s", lineDiff(got, want))
	}

	// One report for both parts is linked once; a fill stopped at its
	// cap says so and gives the projection as one.
	density.Density.Refused, density.Density.Projected, density.Density.Held = "", 979, 200
	got, err = SpeedTable(Latest{Ops: "d/full-2", Density: "d/full-2"}, ops, density)
	if err != nil {
		t.Fatal(err)
	}
	for _, w := range []string{"| 200 held (22.8 MiB each; the fill stopped at --density-max), 979 projected |",
		"Numbers from [d/full-2](docs/benchmarks/d/full-2/report.md) (run 2026-12-02): the reports"} {
		if !strings.Contains(got, w) {
			t.Errorf("table lacks %q:\n%s", w, got)
		}
	}
}

// A report without an operation or the density section a row needs is an
// error naming what is missing, never a table with an empty cell.
func TestSpeedTableNeedsEveryRow(t *testing.T) {
	ops, density := speedReports()
	l := Latest{Ops: "a", Density: "b"}
	short := *ops
	short.Ops = short.Ops[:len(short.Ops)-1] // no fork n=100
	if _, err := SpeedTable(l, &short, density); !errors.Is(err, errdefs.ErrNotFound) || !strings.Contains(err.Error(), `"fork n=100"`) {
		t.Errorf("no fork of 100: %v", err)
	}
	noDensity := *density
	noDensity.Density = nil
	if _, err := SpeedTable(l, ops, &noDensity); !errors.Is(err, errdefs.ErrNotFound) || !strings.Contains(err.Error(), "docs/benchmarks/b has no density") {
		t.Errorf("no density: %v", err)
	}
}

func TestParseLatest(t *testing.T) {
	l, err := ParseLatest([]byte("# comment\n\nops  2026-12-02-kill-cpu/full-2 # the full run\ndensity 2026-11-29\n"))
	if err != nil || l != (Latest{Ops: "2026-12-02-kill-cpu/full-2", Density: "2026-11-29"}) {
		t.Fatalf("%+v, %v", l, err)
	}
	for _, bad := range []string{
		"",
		"ops a\n",                      // no density
		"ops a\ndensity b\nops c\n",    // twice
		"ops a\ndensity b\ncurves c\n", // unknown part
		"ops a b\ndensity c\n",         // three fields
		"ops /etc\ndensity b\n",        // absolute
		"ops ../x\ndensity b\n",        // outside docs/benchmarks
		"ops a/../../x\ndensity b\n",   // outside, after cleaning
		"ops a/./b\ndensity b\n",       // not clean
		"ops a/\ndensity b\n",          // not clean
		"ops a\\..\\x\ndensity b\n",    // a backslash
		"ops .\ndensity b\n",           // docs/benchmarks itself
	} {
		if _, err := ParseLatest([]byte(bad)); !errors.Is(err, errdefs.ErrInvalidArgument) {
			t.Errorf("%q: %v, want an invalid-argument error", bad, err)
		}
	}
}

func TestReplaceSpeedTable(t *testing.T) {
	doc := "# X\n\nprose\n" + SpeedTableBegin + "\nold\ntable\n" + SpeedTableEnd + "\nafter\n"
	got, err := ReplaceSpeedTable([]byte(doc), "\nnew\n\n")
	if want := "# X\n\nprose\n" + SpeedTableBegin + "\n\nnew\n\n" + SpeedTableEnd + "\nafter\n"; err != nil || string(got) != want {
		t.Fatalf("%q, %v; want %q", got, err, want)
	}
	for _, bad := range []string{
		"no markers\n",
		SpeedTableBegin + "\nonly the beginning\n",
		SpeedTableEnd + "\n" + SpeedTableBegin + "\n",
		SpeedTableBegin + "\n" + SpeedTableBegin + "\n" + SpeedTableEnd + "\n",
		"text " + SpeedTableBegin + "\n" + SpeedTableEnd + "\n", // a marker inside a line
	} {
		if _, err := ReplaceSpeedTable([]byte(bad), "x\n"); !errors.Is(err, errdefs.ErrInvalidArgument) {
			t.Errorf("%q: %v, want an invalid-argument error", bad, err)
		}
	}
}

// writeSpeedRoot lays out a repository root: README.md with a stale speed
// table, docs/benchmarks/LATEST and the two reports it names (written by
// WriteAll, as `spore bench` writes them).
func writeSpeedRoot(t *testing.T) string {
	t.Helper()
	root := t.TempDir()
	ops, density := speedReports()
	for dir, r := range map[string]*Report{"run/full": ops, "fill": density} {
		if err := WriteAll(filepath.Join(root, BenchmarksDir, dir), r); err != nil {
			t.Fatal(err)
		}
	}
	write(t, filepath.Join(root, BenchmarksDir, LatestFile), "ops run/full\ndensity fill\n")
	readme := "# Spore\n\n## Speed\n\nprose kept\n\n" + SpeedTableBegin + "\n| stale | 187 ms |\n" + SpeedTableEnd + "\n\n## Next\n"
	write(t, filepath.Join(root, ReadmeFile), readme)
	return root
}

func write(t *testing.T, path, s string) {
	t.Helper()
	if err := os.WriteFile(path, []byte(s), 0o644); err != nil {
		t.Fatal(err)
	}
}

func read(t *testing.T, path string) string {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

// A stale table is found, with its diff and the fixing command; the update
// rewrites only the lines between the markers, and then finds nothing to do.
func TestUpdateReadme(t *testing.T) {
	root := writeSpeedRoot(t)
	diff, err := ReadmeDiff(root)
	if err != nil {
		t.Fatal(err)
	}
	for _, w := range []string{"run `make readme-table`", "- | stale | 187 ms |", "+ | rollback in place | 54.8 ms | |"} {
		if !strings.Contains(diff, w) {
			t.Errorf("diff lacks %q:\n%s", w, diff)
		}
	}
	changed, err := UpdateReadme(root)
	if err != nil || !changed {
		t.Fatalf("update: changed %v, %v", changed, err)
	}
	got := read(t, filepath.Join(root, ReadmeFile))
	if !strings.HasPrefix(got, "# Spore\n\n## Speed\n\nprose kept\n\n"+SpeedTableBegin+"\n\n| operation (p50) |") ||
		!strings.HasSuffix(got, "fails when it differs.\n\n"+SpeedTableEnd+"\n\n## Next\n") || strings.Contains(got, "stale") {
		t.Errorf("README.md after the update:\n%s", got)
	}
	if diff, err := ReadmeDiff(root); err != nil || diff != "" {
		t.Errorf("after the update: %q, %v", diff, err)
	}
	if changed, err := UpdateReadme(root); err != nil || changed {
		t.Errorf("second update: changed %v, %v", changed, err)
	}
	if info, err := os.Stat(filepath.Join(root, ReadmeFile)); err != nil || info.Mode().Perm() != 0o644 {
		t.Errorf("README.md mode %v, %v", info.Mode(), err)
	}
}

// Bad input (a LATEST naming a missing report, a report lacking a row, a
// README without markers) is an error and leaves README.md as it was.
func TestUpdateReadmeBadInput(t *testing.T) {
	for name, spoil := range map[string]func(t *testing.T, root string){
		"a missing report": func(t *testing.T, root string) {
			write(t, filepath.Join(root, BenchmarksDir, LatestFile), "ops run/none\ndensity fill\n")
		},
		"a report lacking a row": func(t *testing.T, root string) {
			write(t, filepath.Join(root, BenchmarksDir, LatestFile), "ops fill\ndensity fill\n")
		},
		"a LATEST outside docs/benchmarks": func(t *testing.T, root string) {
			write(t, filepath.Join(root, BenchmarksDir, LatestFile), "ops ../run/full\ndensity fill\n")
		},
		"no LATEST": func(t *testing.T, root string) {
			if err := os.Remove(filepath.Join(root, BenchmarksDir, LatestFile)); err != nil {
				t.Fatal(err)
			}
		},
		"a README without markers": func(t *testing.T, root string) {
			write(t, filepath.Join(root, ReadmeFile), "# Spore\n\n| stale |\n")
		},
	} {
		t.Run(name, func(t *testing.T) {
			root := writeSpeedRoot(t)
			spoil(t, root)
			before := read(t, filepath.Join(root, ReadmeFile))
			if changed, err := UpdateReadme(root); err == nil || changed {
				t.Fatalf("changed %v, %v", changed, err)
			}
			if _, err := ReadmeDiff(root); err == nil {
				t.Error("ReadmeDiff: no error")
			}
			if after := read(t, filepath.Join(root, ReadmeFile)); after != before {
				t.Errorf("README.md changed:\n%s", after)
			}
			if m, _ := filepath.Glob(filepath.Join(root, ".README.md.*")); len(m) > 0 {
				t.Errorf("temporary files left: %v", m)
			}
		})
	}
}

func TestLineDiff(t *testing.T) {
	got := lineDiff("a\nb\nc", "a\nx\nc\nd")
	if want := "  a\n- b\n+ x\n  c\n+ d\n"; got != want {
		t.Errorf("%q, want %q", got, want)
	}
}

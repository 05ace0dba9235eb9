package bench

import (
	"bytes"
	"cmp"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"time"

	"gonum.org/v1/plot"
	"gonum.org/v1/plot/plotter"
	"gonum.org/v1/plot/plotutil"
	"gonum.org/v1/plot/vg"
	"gonum.org/v1/plot/vg/draw"
	"gonum.org/v1/plot/vg/vgimg"
)

// Units an Op may be measured in.
const (
	unitMs   = "ms"
	unitMBps = "MB/s"
)

// File names WriteAll writes into its directory (plus one PNG per curve).
const (
	reportJSONName = "report.json"
	reportMDName   = "report.md"
)

// Size and resolution of each curve's PNG.
const (
	plotWidth  = 16 * vg.Centimeter
	plotHeight = 10 * vg.Centimeter
	plotDPI    = 144
)

const (
	bytesPerGiB = 1 << 30
	bytesPerMiB = 1 << 20
	cellNone    = "–" // an empty table cell
)

// curveNameRE is what a curve's name, which becomes a file name, may be.
var curveNameRE = regexp.MustCompile(`^[a-z0-9-]+$`)

// WriteAll creates dir and writes r into it as report.json, report.md and
// one PNG per curve. Every file is written to a temporary file in dir and
// renamed into place, so a failed run never leaves a half-written file.
// report.json is written first so the data survives a failed rendering.
func WriteAll(dir string, r *Report) error {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return fmt.Errorf("create report dir: %w", err)
	}
	err := writeReportFile(filepath.Join(dir, reportJSONName), func(w io.Writer) error {
		return writeReportJSON(w, r)
	})
	if err != nil {
		return err
	}
	err = writeReportFile(filepath.Join(dir, reportMDName), func(w io.Writer) error {
		return WriteMarkdown(w, r)
	})
	if err != nil {
		return err
	}
	if _, err := WritePlots(dir, r); err != nil {
		return err
	}
	return nil
}

// ReadReport reads a report.json written by WriteAll.
func ReadReport(path string) (*Report, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("read report: %w", err)
	}
	var r Report
	if err := json.Unmarshal(b, &r); err != nil {
		return nil, fmt.Errorf("parse report %s: %w", path, err)
	}
	return &r, nil
}

func writeReportJSON(w io.Writer, r *Report) error {
	b, err := json.MarshalIndent(r, "", "  ")
	if err != nil {
		return fmt.Errorf("encode report: %w", err)
	}
	b = append(b, '\n')
	_, err = w.Write(b)
	return err
}

// writeReportFile writes path through a temporary file in the same
// directory that is renamed over path only once write succeeded.
func writeReportFile(path string, write func(io.Writer) error) (err error) {
	f, err := os.CreateTemp(filepath.Dir(path), "."+filepath.Base(path)+".*.tmp")
	if err != nil {
		return fmt.Errorf("write %s: %w", path, err)
	}
	defer func() {
		if err != nil {
			f.Close()
			os.Remove(f.Name())
		}
	}()
	if err := write(f); err != nil {
		return fmt.Errorf("write %s: %w", path, err)
	}
	if err := f.Chmod(0o644); err != nil {
		return fmt.Errorf("write %s: %w", path, err)
	}
	if err := f.Close(); err != nil {
		return fmt.Errorf("write %s: %w", path, err)
	}
	if err := os.Rename(f.Name(), path); err != nil {
		return fmt.Errorf("write %s: %w", path, err)
	}
	return nil
}

// ---- Validate ----

// Validate checks that r is a well-formed report: the current schema, at
// least one op, and ops and curves whose numbers make sense. It returns
// every problem found, each naming its op or curve.
func Validate(r *Report) error {
	if r == nil {
		return errors.New("report is nil")
	}
	var errs []error
	if r.Schema != SchemaVersion {
		errs = append(errs, fmt.Errorf("schema is %d, want %d", r.Schema, SchemaVersion))
	}
	if len(r.Ops) == 0 && len(r.Curves) == 0 && r.Density == nil {
		errs = append(errs, errors.New("report has no ops, curves or density"))
	}
	for i, op := range r.Ops {
		if err := validateOp(op); err != nil {
			errs = append(errs, fmt.Errorf("op %d %q: %w", i, op.Name, err))
		}
	}
	seen := map[string]bool{}
	for i, c := range r.Curves {
		if err := validateCurve(c); err != nil {
			errs = append(errs, fmt.Errorf("curve %d %q: %w", i, c.Name, err))
		}
		if seen[c.Name] {
			errs = append(errs, fmt.Errorf("curve %d %q: duplicate name", i, c.Name))
		}
		seen[c.Name] = true
	}
	return errors.Join(errs...)
}

func validateOp(op Op) error {
	var errs []error
	add := func(format string, a ...any) { errs = append(errs, fmt.Errorf(format, a...)) }
	if op.Name == "" {
		add("no name")
	}
	if op.Unit != unitMs && op.Unit != unitMBps {
		add("unit %q is neither %q nor %q", op.Unit, unitMs, unitMBps)
	}
	if len(op.Samples) == 0 {
		add("no samples")
	}
	if op.Stats.N != len(op.Samples) {
		add("stats.n is %d but there are %d samples", op.Stats.N, len(op.Samples))
	}
	for i, v := range op.Samples {
		if !statFinite(v) {
			add("sample %d is %v", i, v)
		}
	}
	if err := validateStats(op.Stats, true); err != nil {
		add("stats: %w", err)
	}
	if op.Bare != nil {
		if err := validateStats(*op.Bare, true); err != nil {
			add("bare: %w", err)
		}
		if !statFinite(op.Ratio) || op.Ratio <= 0 {
			add("ratio is %v with a bare measurement, want > 0", op.Ratio)
		}
	}
	if !statFinite(op.Goal) || op.Goal < 0 {
		add("goal is %v", op.Goal)
	}
	for _, name := range partNames(op.Parts) {
		if err := validateStats(op.Parts[name], false); err != nil {
			add("part %q: %w", name, err)
		}
	}
	return errors.Join(errs...)
}

func validateCurve(c Curve) error {
	var errs []error
	if !curveNameRE.MatchString(c.Name) {
		errs = append(errs, fmt.Errorf("name does not match %s", curveNameRE))
	}
	if len(c.Series) == 0 {
		errs = append(errs, errors.New("no series"))
	}
	for i, s := range c.Series {
		if len(s.Points) == 0 {
			errs = append(errs, fmt.Errorf("series %d %q has no points", i, s.Name))
		}
		for j, p := range s.Points {
			if !statFinite(p.X) {
				errs = append(errs, fmt.Errorf("series %d %q: point %d: x is %v", i, s.Name, j, p.X))
			}
			if err := validateStats(p.Stats, false); err != nil {
				errs = append(errs, fmt.Errorf("series %d %q: point %d: %w", i, s.Name, j, err))
			}
		}
	}
	return errors.Join(errs...)
}

// validateStats reports a non-statFinite statistic and, when ordered is set,
// percentiles out of order.
func validateStats(s Stats, ordered bool) error {
	fields := []struct {
		name string
		v    float64
	}{{"p50", s.P50}, {"p90", s.P90}, {"p95", s.P95}, {"max", s.Max}, {"min", s.Min}, {"mean", s.Mean}}
	for _, f := range fields {
		if !statFinite(f.v) {
			return fmt.Errorf("%s is %v", f.name, f.v)
		}
	}
	if ordered && !(s.P50 <= s.P95 && s.P95 <= s.Max) {
		return fmt.Errorf("want p50 <= p95 <= max, got %v, %v, %v", s.P50, s.P95, s.Max)
	}
	// P90 is 0 in reports written before it existed.
	if ordered && s.P90 != 0 && !(s.P50 <= s.P90 && s.P90 <= s.P95) {
		return fmt.Errorf("want p50 <= p90 <= p95, got %v, %v, %v", s.P50, s.P90, s.P95)
	}
	return nil
}

func statFinite(v float64) bool { return !math.IsNaN(v) && !math.IsInf(v, 0) }

// ---- Markdown ----

// WriteMarkdown writes r as a Markdown document: the run's header, the
// table of operations, where their time goes, one table and plot link per
// curve, the density result and the notes.
func WriteMarkdown(w io.Writer, r *Report) error {
	m := &mdWriter{w: w}
	writeHeader(m, r)
	writeOps(m, r.Ops)
	writeParts(m, r.Ops)
	for _, c := range r.Curves {
		writeCurve(m, c)
	}
	if r.Density != nil {
		writeDensity(m, r.Density)
	}
	writeNotes(m, r.Notes)
	if m.err != nil {
		return fmt.Errorf("write markdown: %w", m.err)
	}
	return nil
}

// mdWriter keeps the first write error so the rendering code can ignore it.
type mdWriter struct {
	w   io.Writer
	err error
}

func (m *mdWriter) printf(format string, a ...any) {
	if m.err == nil {
		_, m.err = fmt.Fprintf(m.w, format, a...)
	}
}

// row writes one table row.
func (m *mdWriter) row(cells ...string) {
	m.printf("| %s |\n", strings.Join(cells, " | "))
}

// headerRow writes a table's header and its delimiter row; right-aligns
// every column but the first.
func (m *mdWriter) headerRow(cells ...string) {
	m.row(cells...)
	delims := make([]string, len(cells))
	for i := range delims {
		delims[i] = "---:"
	}
	delims[0] = "---"
	m.row(delims...)
}

func writeHeader(m *mdWriter, r *Report) {
	m.printf("# spore bench — %s, git `%s`\n\n", mdTime(r.StartedAt), cmp.Or(r.Git, "unknown"))
	if r.TookSec > 0 {
		m.printf("Took %s.\n\n", mdDuration(r.TookSec))
	}
	if r.Command != "" {
		fence := mdFence(r.Command)
		m.printf("%s\n%s\n%s\n\n", fence, r.Command, fence)
	}
	m.printf("**Machine:** %s\n\n", machineLine(r.Machine))
	if s := settingsLine(r.Settings); s != "" {
		m.printf("**Settings:** %s\n\n", s)
	}
}

func mdTime(t time.Time) string {
	if t.IsZero() {
		return "unknown date"
	}
	return t.Format("2006-01-02 15:04 MST")
}

func mdDuration(sec float64) string {
	return time.Duration(sec * float64(time.Second)).Round(100 * time.Millisecond).String()
}

// mdFence returns a backtick fence longer than any run of backticks in s.
func mdFence(s string) string {
	longest, run := 0, 0
	for _, c := range s {
		if c == '`' {
			run++
			longest = max(longest, run)
		} else {
			run = 0
		}
	}
	return strings.Repeat("`", max(3, longest+1))
}

func machineLine(mc Machine) string {
	var parts []string
	addf := func(ok bool, format string, a ...any) {
		if ok {
			parts = append(parts, fmt.Sprintf(format, a...))
		}
	}
	addf(true, "%s", cmp.Or(mc.CPUModel, "unknown CPU"))
	addf(mc.CPUs > 0, "%d CPUs", mc.CPUs)
	addf(mc.MemoryBytes > 0, "%.1f GiB memory", float64(mc.MemoryBytes)/bytesPerGiB)
	addf(mc.Kernel != "", "kernel %s", mc.Kernel)
	addf(mc.Runsc != "", "runsc %s", mc.Runsc)
	addf(mc.Platform != "", "platform %s", mc.Platform)
	addf(mc.Cgroups != "", "cgroups %s", mc.Cgroups)
	addf(mc.Hostname != "", "host %s", mc.Hostname)
	addf(mc.GoVersion != "", "%s", mc.GoVersion)
	return strings.Join(parts, ", ")
}

func settingsLine(s Settings) string {
	var parts []string
	if s.Target != "" {
		where := "target " + s.Target
		if s.Local {
			where += " (local server)"
		}
		parts = append(parts, where)
	}
	if s.Count > 0 {
		parts = append(parts, fmt.Sprintf("%d repetitions per op", s.Count))
	}
	if s.PoolSize > 0 {
		parts = append(parts, fmt.Sprintf("pool size %d", s.PoolSize))
	}
	if s.Local {
		parts = append(parts, fmt.Sprintf("restore targets per shape %d", s.RestoreTargets))
		if s.RestoreTargetsBurst > s.RestoreTargets {
			parts = append(parts, fmt.Sprintf("up to %d after a burst", s.RestoreTargetsBurst))
		}
		parts = append(parts, fmt.Sprintf("reserved networks %d", s.ReservedNetworks))
	}
	if s.ForkGapMs > 0 {
		parts = append(parts, fmt.Sprintf("%s before each fork", time.Duration(s.ForkGapMs)*time.Millisecond))
	}
	if s.ForkReps > 0 {
		parts = append(parts, fmt.Sprintf("%d forks of each n > 1", s.ForkReps))
	}
	if s.Quick {
		parts = append(parts, "quick")
	}
	return strings.Join(parts, ", ")
}

func writeOps(m *mdWriter, ops []Op) {
	if len(ops) == 0 {
		return
	}
	m.printf("## Operations\n\n")
	m.headerRow("operation", "p50", "p95", "max", "n", "bare runsc (p50)", "spore/bare", "goal", "")
	var footnotes []string
	for _, op := range ops {
		name := mdCell(op.Name)
		if op.Note != "" {
			footnotes = append(footnotes, op.Note)
			name += fmt.Sprintf(" [^%d]", len(footnotes))
		}
		m.row(name,
			mdValue(op.Unit, op.Stats.P50),
			mdValue(op.Unit, op.Stats.P95),
			mdValue(op.Unit, op.Stats.Max),
			strconv.Itoa(op.Stats.N),
			bareCell(op),
			ratioCell(op),
			goalCell(op),
			metCell(op.Met))
	}
	m.printf("\n")
	for i, note := range footnotes {
		m.printf("[^%d]: %s\n", i+1, mdOneLine(note))
	}
	if len(footnotes) > 0 {
		m.printf("\n")
	}
}

// mdValue formats v in unit: "57.6 ms", "1.04 s", "471 MB/s".
func mdValue(unit string, v float64) string {
	switch unit {
	case unitMs:
		if math.Abs(v) >= 1000 {
			return fmt.Sprintf("%.2f s", v/1000)
		}
		return fmt.Sprintf("%.1f ms", v)
	case unitMBps:
		return fmt.Sprintf("%.0f MB/s", v)
	default:
		return strings.TrimSpace(fmt.Sprintf("%.1f %s", v, unit))
	}
}

func bareCell(op Op) string {
	if op.Bare == nil {
		return cellNone
	}
	s := mdValue(op.Unit, op.Bare.P50)
	if op.BareName != "" {
		s += fmt.Sprintf(" (`%s`)", op.BareName)
	}
	return mdCell(s)
}

func ratioCell(op Op) string {
	if op.Bare == nil || op.Ratio <= 0 {
		return cellNone
	}
	return fmt.Sprintf("%.2fx", op.Ratio)
}

func goalCell(op Op) string {
	if op.Goal <= 0 {
		return cellNone
	}
	if op.Unit == unitMBps {
		return "> " + mdFloat(op.Goal) + " MB/s"
	}
	if op.Unit == unitMs && op.Goal >= 1000 {
		return "< " + mdFloat(op.Goal/1000) + " s"
	}
	return "< " + mdFloat(op.Goal) + " " + op.Unit
}

func metCell(met *bool) string {
	switch {
	case met == nil:
		return ""
	case *met:
		return "met"
	default:
		return "missed"
	}
}

// mdFloat formats v with as few digits as needed: 50, 0.5, 1.25.
func mdFloat(v float64) string { return strconv.FormatFloat(v, 'f', -1, 64) }

// mdCell makes s safe inside a table cell.
func mdCell(s string) string {
	return strings.ReplaceAll(mdOneLine(s), "|", `\|`)
}

func mdOneLine(s string) string {
	return strings.Join(strings.Fields(s), " ")
}

// writeParts lists, for each op broken down into parts, its parts by
// descending p50.
func writeParts(m *mdWriter, ops []Op) {
	if !slices.ContainsFunc(ops, func(op Op) bool { return len(op.Parts) > 0 }) {
		return
	}
	m.printf("## Where the time goes\n\n")
	for _, op := range ops {
		if len(op.Parts) == 0 {
			continue
		}
		var items []string
		for _, name := range partsByP50(op.Parts) {
			s := op.Parts[name]
			items = append(items, fmt.Sprintf("%s %s", name, mdPair(op.Unit, s.P50, s.P95)))
		}
		m.printf("- **%s** (p50/p95): %s\n", mdOneLine(op.Name), strings.Join(items, ", "))
	}
	m.printf("\n")
}

// partsByP50 returns the names of parts by descending p50, then by name.
func partsByP50(parts map[string]Stats) []string {
	names := partNames(parts)
	slices.SortStableFunc(names, func(a, b string) int {
		return cmp.Compare(parts[b].P50, parts[a].P50)
	})
	return names
}

// mdPair formats two values of unit sharing one unit suffix:
// "20.1/25.3 ms", "0.98/1.20 s".
func mdPair(unit string, a, b float64) string {
	if unit == unitMs && math.Max(math.Abs(a), math.Abs(b)) >= 1000 {
		return fmt.Sprintf("%.2f/%.2f s", a/1000, b/1000)
	}
	if unit == unitMs || unit == "" {
		return strings.TrimSpace(fmt.Sprintf("%.1f/%.1f %s", a, b, unit))
	}
	return fmt.Sprintf("%.0f/%.0f %s", a, b, unit)
}

// partNames returns the names of parts, sorted.
func partNames(m map[string]Stats) []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	return keys
}

// writeCurve writes a curve's heading, a table with one row per x and a
// p50 and p95 column per series, and the link to its plot.
func writeCurve(m *mdWriter, c Curve) {
	m.printf("## %s\n\n", mdOneLine(cmp.Or(c.Title, c.Name)))
	header := []string{mdCell(cmp.Or(c.XLabel, "x"))}
	for _, s := range c.Series {
		header = append(header,
			mdCell(seriesColumn(s.Name, "p50", c.YLabel)),
			mdCell(seriesColumn(s.Name, "p95", c.YLabel)))
	}
	m.headerRow(header...)
	for _, x := range curveXs(c) {
		cells := []string{mdFloat(x)}
		for _, s := range c.Series {
			p, ok := pointAt(s, x)
			if !ok {
				cells = append(cells, cellNone, cellNone)
				continue
			}
			cells = append(cells, mdNumber(p.Stats.P50), mdNumber(p.Stats.P95))
		}
		m.row(cells...)
	}
	m.printf("\n![%s](%s.png)\n\n", mdLinkText(cmp.Or(c.Title, c.Name)), c.Name)
}

func seriesColumn(series, stat, yLabel string) string {
	s := strings.TrimSpace(series + " " + stat)
	if yLabel != "" {
		s += " (" + yLabel + ")"
	}
	return s
}

// curveXs returns every x of the curve's series, sorted and deduplicated.
func curveXs(c Curve) []float64 {
	var xs []float64
	for _, s := range c.Series {
		for _, p := range s.Points {
			xs = append(xs, p.X)
		}
	}
	slices.Sort(xs)
	return slices.Compact(xs)
}

func pointAt(s Series, x float64) (Point, bool) {
	i := slices.IndexFunc(s.Points, func(p Point) bool { return p.X == x })
	if i < 0 {
		return Point{}, false
	}
	return s.Points[i], true
}

// mdNumber formats a value of unknown unit with one decimal, or cellNone
// from 1000 on.
func mdNumber(v float64) string {
	if math.Abs(v) >= 1000 {
		return fmt.Sprintf("%.0f", v)
	}
	return fmt.Sprintf("%.1f", v)
}

func mdLinkText(s string) string {
	return strings.NewReplacer("[", `\[`, "]", `\]`).Replace(mdOneLine(s))
}

func writeDensity(m *mdWriter, d *Density) {
	m.printf("## Density\n\n")
	rss := fmt.Sprintf("%.1f MiB", float64(d.IdleRSSBytes)/bytesPerMiB)
	if d.CgroupBytes > 0 {
		rss += fmt.Sprintf(" (memory cgroup charged %.1f MiB, %d bytes)", float64(d.CgroupBytes)/bytesPerMiB, d.CgroupBytes)
	}
	m.printf("- Idle RSS per sandbox: %s\n", rss)
	m.printf("- Held %d idle sandboxes at once (max %d)\n", d.Held, d.Max)
	if d.Refused != "" {
		m.printf("- Refused: %s\n", mdOneLine(d.Refused))
	} else {
		m.printf("- Not refused: stopped at --density-max\n")
	}
	if d.Projected > 0 {
		m.printf("- Projected to fit in memory: %d\n", d.Projected)
	}
	m.printf("- MemAvailable: %.1f GiB at start, %.1f GiB at its lowest (every sandbox of the fill running)\n",
		float64(d.MemAvailableStart)/bytesPerGiB, float64(d.MinMemAvailable)/bytesPerGiB)
	if d.TookSec > 0 {
		m.printf("- Took %s\n", mdDuration(d.TookSec))
	}
	m.printf("\n")
}

func writeNotes(m *mdWriter, notes []string) {
	if len(notes) == 0 {
		return
	}
	m.printf("## Notes\n\n")
	for _, n := range notes {
		m.printf("- %s\n", mdOneLine(n))
	}
	m.printf("\n")
}

// ---- Plots ----

// WritePlots writes one PNG per curve of r into dir, named after the
// curve (<name>.png), and returns their paths. Each series is drawn as a
// solid line of its p50s and a dashed line of its p95s.
func WritePlots(dir string, r *Report) ([]string, error) {
	var paths []string
	for _, c := range r.Curves {
		if !curveNameRE.MatchString(c.Name) {
			return paths, fmt.Errorf("plot curve %q: name does not match %s", c.Name, curveNameRE)
		}
		path := filepath.Join(dir, c.Name+".png")
		png, err := renderCurve(c)
		if err != nil {
			return paths, fmt.Errorf("plot curve %q: %w", c.Name, err)
		}
		err = writeReportFile(path, func(w io.Writer) error {
			_, err := w.Write(png)
			return err
		})
		if err != nil {
			return paths, fmt.Errorf("plot curve %q: %w", c.Name, err)
		}
		paths = append(paths, path)
	}
	return paths, nil
}

// renderCurve draws c and returns it encoded as PNG.
func renderCurve(c Curve) ([]byte, error) {
	if len(c.Series) == 0 {
		return nil, errors.New("no series")
	}
	p := plot.New()
	p.Title.Text = cmp.Or(c.Title, c.Name)
	p.Title.Padding = vg.Points(6)
	p.X.Label.Text = c.XLabel
	p.Y.Label.Text = c.YLabel
	p.Legend.Top = true
	p.Legend.Left = true
	p.Add(plotter.NewGrid())
	for i, s := range c.Series {
		if err := addSeries(p, i, s); err != nil {
			return nil, err
		}
	}
	if p.Y.Min > 0 {
		p.Y.Min = 0 // latencies and rates read best from zero
	}
	canvas := vgimg.NewWith(vgimg.UseWH(plotWidth, plotHeight), vgimg.UseDPI(plotDPI))
	p.Draw(draw.New(canvas))
	var buf bytes.Buffer
	if _, err := (vgimg.PngCanvas{Canvas: canvas}).WriteTo(&buf); err != nil {
		return nil, fmt.Errorf("encode png: %w", err)
	}
	return buf.Bytes(), nil
}

// addSeries adds series number i of a curve to p: p50 as a solid line with
// points, p95 as a dashed line in the same colour.
func addSeries(p *plot.Plot, i int, s Series) error {
	name := cmp.Or(s.Name, fmt.Sprintf("series %d", i+1))
	if len(s.Points) == 0 {
		return fmt.Errorf("series %q has no points", name)
	}
	pts := slices.SortedFunc(slices.Values(s.Points), func(a, b Point) int { return cmp.Compare(a.X, b.X) })
	p50 := make(plotter.XYs, len(pts))
	p95 := make(plotter.XYs, len(pts))
	for j, pt := range pts {
		p50[j] = plotter.XY{X: pt.X, Y: pt.Stats.P50}
		p95[j] = plotter.XY{X: pt.X, Y: pt.Stats.P95}
	}
	line, points, err := plotter.NewLinePoints(p50)
	if err != nil {
		return fmt.Errorf("series %q p50: %w", name, err)
	}
	color := plotutil.Color(i)
	line.Color = color
	line.Width = vg.Points(1.5)
	points.Color = color
	points.Shape = plotutil.Shape(i)
	tail, err := plotter.NewLine(p95)
	if err != nil {
		return fmt.Errorf("series %q p95: %w", name, err)
	}
	tail.Color = color
	tail.Dashes = []vg.Length{vg.Points(4), vg.Points(3)}
	p.Add(line, points, tail)
	p.Legend.Add(name+" p50", line, points)
	p.Legend.Add(name+" p95", tail)
	return nil
}

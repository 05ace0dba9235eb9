package bench

import (
	"bufio"
	"bytes"
	"fmt"
	"io"
	"os"
	"path"
	"path/filepath"
	"strings"

	"github.com/spore-run/spore/internal/errdefs"
)

// README.md's speed table is rendered from committed reports, never typed:
// a number users read first cannot drift from the report behind it. Which
// reports it shows is a decision recorded in docs/benchmarks/LATEST, not a
// guess from directory dates (a directory's newest report may be a
// one-section A/B run).

const (
	// LatestFile, in BenchmarksDir, names the reports the table shows.
	LatestFile = "LATEST"
	// BenchmarksDir holds the committed reports, relative to the repository root.
	BenchmarksDir = "docs/benchmarks"
	// ReadmeFile is the file whose speed table UpdateReadme rewrites.
	ReadmeFile = "README.md"
	// The table sits between these two lines of README.md.
	SpeedTableBegin = "<!-- speed-table:begin -->"
	SpeedTableEnd   = "<!-- speed-table:end -->"
	// ReadmeFixCommand rewrites the table (the error a stale one gets says so).
	ReadmeFixCommand = "make readme-table"
)

// Latest is the content of docs/benchmarks/LATEST: for each part of the
// speed table, the report directory its numbers come from, relative to
// docs/benchmarks. Two parts because a full run caps or skips the density
// fill (it takes minutes and starves a shared host), so the idle-sandbox
// count comes from the last run that filled the host.
type Latest struct {
	Ops     string // operations, forks and commands: a full `spore bench` run
	Density string // the idle-sandbox fill
}

// ParseLatest reads LATEST's lines, "<part> <dir>" ('#' starts a comment):
// each part once, each dir local to docs/benchmarks (no "..", not absolute).
func ParseLatest(b []byte) (Latest, error) {
	var l Latest
	fields := map[string]*string{"ops": &l.Ops, "density": &l.Density}
	sc := bufio.NewScanner(bytes.NewReader(b))
	for n := 1; sc.Scan(); n++ {
		line, _, _ := strings.Cut(sc.Text(), "#")
		f := strings.Fields(line)
		if len(f) == 0 {
			continue
		}
		if len(f) != 2 {
			return Latest{}, fmt.Errorf("%w: %s line %d: want \"<part> <dir>\", got %q", errdefs.ErrInvalidArgument, LatestFile, n, line)
		}
		dst, ok := fields[f[0]]
		if !ok {
			return Latest{}, fmt.Errorf("%w: %s line %d: unknown part %q (known: ops, density)", errdefs.ErrInvalidArgument, LatestFile, n, f[0])
		}
		if *dst != "" {
			return Latest{}, fmt.Errorf("%w: %s line %d: part %q named twice", errdefs.ErrInvalidArgument, LatestFile, n, f[0])
		}
		if !filepath.IsLocal(f[1]) || path.Clean(f[1]) != f[1] || f[1] == "." || strings.Contains(f[1], `\`) {
			return Latest{}, fmt.Errorf("%w: %s line %d: %q is not a clean directory under %s", errdefs.ErrInvalidArgument, LatestFile, n, f[1], BenchmarksDir)
		}
		*dst = f[1]
	}
	if err := sc.Err(); err != nil {
		return Latest{}, fmt.Errorf("read %s: %w", LatestFile, err)
	}
	for _, part := range []string{"ops", "density"} {
		if *fields[part] == "" {
			return Latest{}, fmt.Errorf("%w: %s names no %q report", errdefs.ErrInvalidArgument, LatestFile, part)
		}
	}
	return l, nil
}

// RenderSpeedTable reads docs/benchmarks/LATEST under the repository root
// and the reports it names, and renders the speed table.
func RenderSpeedTable(root string) (string, error) {
	dir := filepath.Join(root, filepath.FromSlash(BenchmarksDir))
	b, err := os.ReadFile(filepath.Join(dir, LatestFile))
	if err != nil {
		return "", fmt.Errorf("read the speed table's reports: %w", err)
	}
	l, err := ParseLatest(b)
	if err != nil {
		return "", err
	}
	ops, err := readMarkedReport(dir, l.Ops)
	if err != nil {
		return "", err
	}
	density, err := readMarkedReport(dir, l.Density)
	if err != nil {
		return "", err
	}
	return SpeedTable(l, ops, density)
}

// readMarkedReport reads and validates the report in dir/rel, and checks
// that its report.md, which the table links to, is there.
func readMarkedReport(dir, rel string) (*Report, error) {
	d := filepath.Join(dir, filepath.FromSlash(rel))
	if _, err := os.Stat(filepath.Join(d, reportMDName)); err != nil {
		return nil, fmt.Errorf("%s names %s: %w", LatestFile, rel, err)
	}
	r, err := ReadReport(filepath.Join(d, reportJSONName))
	if err != nil {
		return nil, fmt.Errorf("%s names %s: %w", LatestFile, rel, err)
	}
	if err := Validate(r); err != nil {
		return nil, fmt.Errorf("%w: %s names %s, not a valid report: %w", errdefs.ErrInvalidArgument, LatestFile, rel, err)
	}
	return r, nil
}

// ReplaceSpeedTable returns doc with the lines between its one
// SpeedTableBegin line and its one SpeedTableEnd line replaced by table.
func ReplaceSpeedTable(doc []byte, table string) ([]byte, error) {
	start, end, err := speedTableSpan(doc)
	if err != nil {
		return nil, err
	}
	out := make([]byte, 0, len(doc)+len(table))
	out = append(out, doc[:start]...)
	out = append(out, table...)
	return append(out, doc[end:]...), nil
}

// speedTableSpan finds the bytes between the begin marker's line and the
// end marker's line.
func speedTableSpan(doc []byte) (start, end int, err error) {
	b := markerLine(doc, SpeedTableBegin)
	e := markerLine(doc, SpeedTableEnd)
	switch {
	case len(b) != 1 || len(e) != 1:
		return 0, 0, fmt.Errorf("%w: %s has %d %q lines and %d %q lines, want one of each",
			errdefs.ErrInvalidArgument, ReadmeFile, len(b), SpeedTableBegin, len(e), SpeedTableEnd)
	case e[0] < b[0]:
		return 0, 0, fmt.Errorf("%w: %s has %q before %q", errdefs.ErrInvalidArgument, ReadmeFile, SpeedTableEnd, SpeedTableBegin)
	}
	start = b[0] + len(SpeedTableBegin)
	if start < len(doc) && doc[start] == '\n' {
		start++
	}
	return start, e[0], nil
}

// markerLine returns the offsets of the lines that are exactly marker.
func markerLine(doc []byte, marker string) []int {
	var at []int
	for off := 0; off < len(doc); {
		line, _, _ := bytes.Cut(doc[off:], []byte("\n"))
		if string(bytes.TrimRight(line, "\r")) == marker {
			at = append(at, off)
		}
		off += len(line) + 1
	}
	return at
}

// UpdateReadme rewrites README.md's speed table under root from the
// reports LATEST names, and says whether it changed. On any error README.md
// is left as it was.
func UpdateReadme(root string) (changed bool, err error) {
	readme := filepath.Join(root, ReadmeFile)
	doc, err := os.ReadFile(readme)
	if err != nil {
		return false, fmt.Errorf("read %s: %w", ReadmeFile, err)
	}
	table, err := RenderSpeedTable(root)
	if err != nil {
		return false, err
	}
	out, err := ReplaceSpeedTable(doc, table)
	if err != nil || bytes.Equal(out, doc) {
		return false, err
	}
	if err := writeReportFile(readme, func(w io.Writer) error { _, err := w.Write(out); return err }); err != nil {
		return false, err
	}
	return true, nil
}

// ReadmeDiff compares README.md's speed table under root with the one the
// reports LATEST names render: "" when they match, else a line diff
// (- README.md, + rendered) and the command that fixes it.
func ReadmeDiff(root string) (string, error) {
	doc, err := os.ReadFile(filepath.Join(root, ReadmeFile))
	if err != nil {
		return "", fmt.Errorf("read %s: %w", ReadmeFile, err)
	}
	want, err := RenderSpeedTable(root)
	if err != nil {
		return "", err
	}
	start, end, err := speedTableSpan(doc)
	if err != nil {
		return "", err
	}
	if got := string(doc[start:end]); got != want {
		return fmt.Sprintf("%s's speed table differs from the reports %s/%s names (- %s, + rendered); run `%s`:\n%s",
			ReadmeFile, BenchmarksDir, LatestFile, ReadmeFile, ReadmeFixCommand, lineDiff(got, want)), nil
	}
	return "", nil
}

// lineDiff is a minimal line diff (longest common subsequence): "- " for a
// line only in a, "+ " for one only in b, "  " for a shared one. The
// tables it compares are tens of lines.
func lineDiff(a, b string) string {
	x, y := strings.Split(a, "\n"), strings.Split(b, "\n")
	// lcs[i][j]: the common subsequence's length of x[i:] and y[j:].
	lcs := make([][]int, len(x)+1)
	for i := range lcs {
		lcs[i] = make([]int, len(y)+1)
	}
	for i := len(x) - 1; i >= 0; i-- {
		for j := len(y) - 1; j >= 0; j-- {
			if x[i] == y[j] {
				lcs[i][j] = lcs[i+1][j+1] + 1
			} else {
				lcs[i][j] = max(lcs[i+1][j], lcs[i][j+1])
			}
		}
	}
	var sb strings.Builder
	i, j := 0, 0
	for i < len(x) || j < len(y) {
		switch {
		case i < len(x) && j < len(y) && x[i] == y[j]:
			sb.WriteString("  " + x[i] + "\n")
			i, j = i+1, j+1
		case j == len(y) || (i < len(x) && lcs[i+1][j] >= lcs[i][j+1]):
			sb.WriteString("- " + x[i] + "\n")
			i++
		default:
			sb.WriteString("+ " + y[j] + "\n")
			j++
		}
	}
	return sb.String()
}

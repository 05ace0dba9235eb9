package bench

import (
	"fmt"
	"strings"

	"github.com/spore-run/spore/internal/errdefs"
)

// speedRow is one row of README.md's speed table: its label and the
// operations of the ops report it shows, one or two ("a / b").
type speedRow struct {
	label string
	ops   []string
}

// speedRows are the table's rows, in order; the idle-sandbox row, from the
// density report, comes last.
var speedRows = []speedRow{
	{"`Sandbox.create()` from a template (warm pool)", []string{"create from template"}},
	{"create from a snapshot / its restore phase", []string{"create from snapshot", "restore"}},
	{"live snapshot", []string{"snapshot"}},
	{"rollback in place", []string{"rollback"}},
	{"pause / resume", []string{"pause", "resume"}},
	{"fork of 10 / of 100", []string{"fork n=10", "fork n=100"}},
	{"`commands.run(\"true\")`, 100 ms apart / back to back", []string{`commands.run("true"), 100ms apart`, `commands.run("true")`}},
}

// SpeedTable renders README.md's speed table (Markdown, starting and ending
// with a blank line) from the ops and density reports l names: every
// number is a p50 or a density figure of those reports, and the line under
// the table links them. A report lacking an operation or the density
// section a row needs is an error, never an empty cell.
func SpeedTable(l Latest, ops, density *Report) (string, error) {
	var sb strings.Builder
	sb.WriteString("\n| operation (p50) | Spore | bare runsc |\n|---|---|---|\n")
	for _, r := range speedRows {
		found, err := findOps(ops, l.Ops, r.ops)
		if err != nil {
			return "", err
		}
		speedTableRow(&sb, r.label, mdCell(spanCell(found)), mdCell(bareSpanCell(found)))
	}
	label, cell, err := densityCells(density, l.Density)
	if err != nil {
		return "", err
	}
	speedTableRow(&sb, label, mdCell(cell), "")
	fmt.Fprintf(&sb, "\n%s\n\n", sourcesLine(l, ops, density))
	return sb.String(), nil
}

// speedTableRow writes one row in the README's own style: an empty cell
// is "| |", not mdWriter's "|  |".
func speedTableRow(sb *strings.Builder, cells ...string) {
	sb.WriteString("|")
	for _, c := range cells {
		if c != "" {
			sb.WriteString(" " + c)
		}
		sb.WriteString(" |")
	}
	sb.WriteString("\n")
}

// findOps returns the operations of r (the report in dir) named names.
func findOps(r *Report, dir string, names []string) ([]Op, error) {
	out := make([]Op, 0, len(names))
	for _, name := range names {
		i := -1
		for j, op := range r.Ops {
			if op.Name == name {
				i = j
				break
			}
		}
		if i < 0 {
			return nil, fmt.Errorf("%w: %s/%s has no operation %q for the speed table (name a full run in %s)",
				errdefs.ErrNotFound, BenchmarksDir, dir, name, LatestFile)
		}
		out = append(out, r.Ops[i])
	}
	return out, nil
}

// spanCell is the ops' p50s: "50.1 / 39.2 ms", "487.0 ms / 5.78 s".
func spanCell(ops []Op) string {
	vals := make([]string, len(ops))
	for i, op := range ops {
		vals[i] = mdValue(op.Unit, op.Stats.P50)
	}
	return joinSharedUnit(vals)
}

// bareSpanCell is the ops' bare p50s, each after the command's short name
// when they share one ("envd direct 5.1 / 12.0 ms"; "6.7 / 7.3 ms" for
// pause / resume, which the row's label names). One bare measurement
// behind two ops (a create from a snapshot and its restore phase share a
// `runsc restore`) is shown once.
func bareSpanCell(ops []Op) string {
	if len(ops) == 2 && ops[0].Bare != nil && ops[1].Bare != nil &&
		ops[0].BareName == ops[1].BareName && *ops[0].Bare == *ops[1].Bare {
		ops = ops[:1]
	}
	vals := make([]string, len(ops))
	label, shared, some := "", true, false
	for i, op := range ops {
		if op.Bare == nil {
			vals[i], shared = cellNone, false
			continue
		}
		vals[i], some = mdValue(op.Unit, op.Bare.P50), true
		switch l := bareLabel(op.BareName); {
		case i == 0:
			label = l
		case l != label:
			shared = false
		}
	}
	if !some {
		return ""
	}
	s := joinSharedUnit(vals)
	if shared && label != "" {
		s = label + " " + s
	}
	return s
}

// bareLabel shortens a bare command's name: "runsc checkpoint
// --leave-running" to "checkpoint", "envd direct: the same request, ..."
// to "envd direct".
func bareLabel(name string) string {
	if rest, ok := strings.CutPrefix(name, "runsc "); ok {
		if f := strings.Fields(rest); len(f) > 0 {
			return f[0]
		}
	}
	head, _, _ := strings.Cut(name, ":")
	return strings.TrimSpace(head)
}

// joinSharedUnit joins formatted values with " / ", writing a unit they
// all end with once: "5.5 / 13.1 ms".
func joinSharedUnit(vals []string) string {
	unit := ""
	for i, v := range vals {
		_, u, ok := strings.Cut(v, " ")
		if !ok || (i > 0 && u != unit) {
			return strings.Join(vals, " / ")
		}
		unit = u
	}
	nums := make([]string, len(vals))
	for i, v := range vals {
		nums[i], _, _ = strings.Cut(v, " ")
	}
	return strings.Join(nums, " / ") + " " + unit
}

// densityCells is the idle-sandbox row: the host's memory in the label;
// how many idle sandboxes it held, at what cost each, and how the fill
// ended in the cell.
func densityCells(r *Report, dir string) (label, cell string, err error) {
	d := r.Density
	if d == nil {
		return "", "", fmt.Errorf("%w: %s/%s has no density section for the speed table (name a run that filled the host in %s)",
			errdefs.ErrNotFound, BenchmarksDir, dir, LatestFile)
	}
	label = "idle sandboxes on one host"
	if r.Machine.MemoryBytes > 0 {
		label = fmt.Sprintf("idle sandboxes on a %.1f GiB host", float64(r.Machine.MemoryBytes)/bytesPerGiB)
	}
	each := fmt.Sprintf("%.1f MiB each", float64(d.IdleRSSBytes)/bytesPerMiB)
	switch {
	case d.Refused != "":
		cell = fmt.Sprintf("%d (%s), then a create refused", d.Held, each)
	case d.Projected > 0:
		cell = fmt.Sprintf("%d held (%s; the fill stopped at --density-max), %d projected", d.Held, each, d.Projected)
	default:
		cell = fmt.Sprintf("%d held (%s; the fill stopped at --density-max)", d.Held, each)
	}
	return label, cell, nil
}

// sourcesLine names, under the table, the reports its numbers come from,
// when each ran, and how the table is made and checked.
func sourcesLine(l Latest, ops, density *Report) string {
	src := "Numbers from " + reportLink(l.Ops, ops)
	if l.Density != l.Ops {
		src += ", idle sandboxes from " + reportLink(l.Density, density)
	}
	return fmt.Sprintf("%s: the reports [%s/%s](%s/%s) names. `%s` writes this table from them, and `TestREADMESpeedTable` fails when it differs.",
		src, BenchmarksDir, LatestFile, BenchmarksDir, LatestFile, ReadmeFixCommand)
}

func reportLink(dir string, r *Report) string {
	s := fmt.Sprintf("[%s](%s/%s/%s)", mdLinkText(dir), BenchmarksDir, dir, reportMDName)
	if !r.StartedAt.IsZero() {
		s += " (run " + r.StartedAt.UTC().Format("2006-01-02") + ")"
	}
	return s
}

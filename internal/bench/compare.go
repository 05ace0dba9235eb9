package bench

import (
	"fmt"
	"io"
	"math"
	"strings"
)

// Delta is one operation measured by two runs: what the second (B, e.g.
// through an API replica and a remote node) adds to the first (A, e.g.
// `spore up` in process).
type Delta struct {
	Name   string  `json:"name"`
	Unit   string  `json:"unit"`
	A      Stats   `json:"a"`
	B      Stats   `json:"b"`
	P50    float64 `json:"p50Delta"`    // B.P50 − A.P50
	Mean   float64 `json:"meanDelta"`   // B.Mean − A.Mean
	P50Pct float64 `json:"p50DeltaPct"` // of A.P50
}

// PointDelta is one point of a curve both runs drew (e.g. creates per
// second at 16 clients), and B's p50 over A's.
type PointDelta struct {
	Curve, Series string
	X             float64
	A, B          float64 // p50
	Ratio         float64
}

// Comparison is Compare's result.
type Comparison struct {
	Ops    []Delta      `json:"ops"`
	Points []PointDelta `json:"points,omitempty"`
}

// Compare lines up the operations and curve points two reports share, in
// a's order.
func Compare(a, b *Report) Comparison {
	var c Comparison
	byName := map[string]Op{}
	for _, o := range b.Ops {
		byName[o.Name] = o
	}
	for _, oa := range a.Ops {
		ob, ok := byName[oa.Name]
		if !ok || oa.Unit != ob.Unit || oa.Stats.N == 0 || ob.Stats.N == 0 {
			continue
		}
		d := Delta{Name: oa.Name, Unit: oa.Unit, A: oa.Stats, B: ob.Stats,
			P50: round(ob.Stats.P50-oa.Stats.P50, 3), Mean: round(ob.Stats.Mean-oa.Stats.Mean, 3)}
		if oa.Stats.P50 != 0 {
			d.P50Pct = round(100*d.P50/oa.Stats.P50, 1)
		}
		c.Ops = append(c.Ops, d)
		// What differs between the runs without the runtime's spread.
		if pa, pb := oa.Parts[PartOutsideNode], ob.Parts[PartOutsideNode]; pa.N > 0 && pb.N > 0 {
			c.Ops = append(c.Ops, Delta{Name: oa.Name + ": " + PartOutsideNode, Unit: unitMs, A: pa, B: pb,
				P50: round(pb.P50-pa.P50, 3), Mean: round(pb.Mean-pa.Mean, 3), P50Pct: pct(pb.P50-pa.P50, pa.P50)})
		}
		// The hop itself: none in process (A's stats stay empty, n 0).
		if pa, pb := oa.Parts[PartHop], ob.Parts[PartHop]; pb.N > 0 {
			c.Ops = append(c.Ops, Delta{Name: oa.Name + ": " + PartHop, Unit: unitMs, A: pa, B: pb,
				P50: round(pb.P50-pa.P50, 3), Mean: round(pb.Mean-pa.Mean, 3), P50Pct: pct(pb.P50-pa.P50, pa.P50)})
		}
	}
	curves := map[string]Curve{}
	for _, cv := range b.Curves {
		curves[cv.Name] = cv
	}
	for _, ca := range a.Curves {
		cb, ok := curves[ca.Name]
		if !ok {
			continue
		}
		for _, sa := range ca.Series {
			for _, sb := range cb.Series {
				if sa.Name != sb.Name {
					continue
				}
				for _, pa := range sa.Points {
					for _, pb := range sb.Points {
						if pa.X == pb.X {
							pd := PointDelta{Curve: ca.Name, Series: sa.Name, X: pa.X, A: pa.Stats.P50, B: pb.Stats.P50}
							if pa.Stats.P50 != 0 {
								pd.Ratio = round(pb.Stats.P50/pa.Stats.P50, 3)
							}
							c.Points = append(c.Points, pd)
						}
					}
				}
			}
		}
	}
	return c
}

func pct(d, base float64) float64 {
	if base == 0 {
		return 0
	}
	return round(100*d/base, 1)
}

// WriteComparison writes c as Markdown tables, naming the runs.
func WriteComparison(w io.Writer, aName, bName string, c Comparison) error {
	m := &mdWriter{w: w}
	if len(c.Ops) > 0 {
		m.headerRow("operation", aName+" p50", bName+" p50", "Δ p50", "Δ p50 %", aName+" p95", bName+" p95", "Δ mean", "n")
		for _, d := range c.Ops {
			m.row(mdCell(d.Name), mdValue(d.Unit, d.A.P50), mdValue(d.Unit, d.B.P50), signed(d.Unit, d.P50),
				fmt.Sprintf("%+.1f %%", d.P50Pct), mdValue(d.Unit, d.A.P95), mdValue(d.Unit, d.B.P95), signed(d.Unit, d.Mean),
				fmt.Sprintf("%d / %d", d.A.N, d.B.N))
		}
		m.printf("\n")
	}
	if len(c.Points) > 0 {
		m.headerRow("curve", "series", "x", aName, bName, bName+" / "+aName)
		for _, p := range c.Points {
			m.row(p.Curve, mdCell(p.Series), mdFloat(p.X), mdFloat(round(p.A, 2)), mdFloat(round(p.B, 2)), mdFloat(p.Ratio))
		}
		m.printf("\n")
	}
	return m.err
}

// signed formats a difference with its sign (ms to a hundredth: a hop's
// cost is a fraction of a millisecond to a few).
func signed(unit string, v float64) string {
	if unit == unitMs && math.Abs(v) < 1000 {
		return fmt.Sprintf("%+.2f ms", v)
	}
	s := mdValue(unit, v)
	if v >= 0 && !strings.HasPrefix(s, "+") {
		s = "+" + s
	}
	return s
}

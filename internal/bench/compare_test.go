package bench

import (
	"bytes"
	"strings"
	"testing"
)

// Compare lines up the operations and curve points two runs share and
// says what the second adds; operations in one run only are left out.
func TestCompare(t *testing.T) {
	a := &Report{
		Ops: []Op{
			{Name: "snapshot", Unit: "ms", Stats: Summarize([]float64{70, 74, 80})},
			{Name: "kill", Unit: "ms", Stats: Summarize([]float64{80, 90})},
			{Name: "only in a", Unit: "ms", Stats: Summarize([]float64{1})},
		},
		Curves: []Curve{{Name: "create-throughput", Series: []Series{{Name: "creates per second", Points: []Point{
			{X: 1, Stats: Summarize([]float64{4})}, {X: 16, Stats: Summarize([]float64{5})}}}}}},
	}
	b := &Report{
		Ops: []Op{
			{Name: "kill", Unit: "ms", Stats: Summarize([]float64{81, 92})},
			{Name: "snapshot", Unit: "ms", Stats: Summarize([]float64{71.5, 76, 82})},
		},
		Curves: []Curve{{Name: "create-throughput", Series: []Series{{Name: "creates per second", Points: []Point{
			{X: 16, Stats: Summarize([]float64{6})}}}}}},
	}
	c := Compare(a, b)
	if len(c.Ops) != 2 || c.Ops[0].Name != "snapshot" || c.Ops[0].P50 != 2 || c.Ops[1].Name != "kill" || c.Ops[1].P50 != 1 {
		t.Fatalf("ops %+v", c.Ops)
	}
	if c.Ops[1].P50Pct != 1.3 {
		t.Errorf("kill delta %v %%, want 1.3", c.Ops[1].P50Pct)
	}
	if len(c.Points) != 1 || c.Points[0].X != 16 || c.Points[0].Ratio != 1.2 {
		t.Fatalf("points %+v", c.Points)
	}
	var buf bytes.Buffer
	if err := WriteComparison(&buf, "up", "fleet", c); err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"| snapshot | 74.0 ms | 76.0 ms | +2.00 ms | +2.7 % |", "| create-throughput | creates per second | 16 | 5 | 6 | 1.2 |"} {
		if !strings.Contains(buf.String(), want) {
			t.Errorf("markdown lacks %q:\n%s", want, buf.String())
		}
	}
}

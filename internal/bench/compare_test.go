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

// An operation whose runs both have the server's time outside the node
// gets a second row comparing that (the runtime's spread left out).
func TestCompareOutsideTheNode(t *testing.T) {
	r := &runner{}
	r.addParts("rollback", map[string]float64{"total": 250, "node": 246, "restore": 220})
	r.addParts("rollback", map[string]float64{"total": 300, "node": 295.5, "restore": 270})
	r.addParts("rollback", map[string]float64{"restore": 100}) // no node phase: no sample
	ps := r.parts["rollback"][PartOutsideNode]
	if len(ps) != 2 || ps[0] != 4 || ps[1] != 4.5 {
		t.Fatalf("outside-the-node samples %v, want [4 4.5]", ps)
	}
	a := &Report{Ops: []Op{{Name: "rollback", Unit: "ms", Stats: Summarize([]float64{250, 300}),
		Parts: map[string]Stats{PartOutsideNode: Summarize([]float64{4, 4.5}), "node": Summarize([]float64{246, 295.5})}}}}
	b := &Report{Ops: []Op{{Name: "rollback", Unit: "ms", Stats: Summarize([]float64{240, 330}),
		Parts: map[string]Stats{PartOutsideNode: Summarize([]float64{6, 7})}}}}
	c := Compare(a, b)
	if len(c.Ops) != 2 || c.Ops[1].Name != "rollback: outside the node" || c.Ops[1].P50 != Summarize([]float64{6, 7}).P50-Summarize([]float64{4, 4.5}).P50 {
		t.Fatalf("ops %+v", c.Ops)
	}
	// A remote node's hop (node-rpc − node) is a row of its own, against
	// none in process.
	r.addParts("fork", map[string]float64{"total": 260, "node-rpc": 252.5, "node": 250})
	if hs := r.parts["fork"][PartHop]; len(hs) != 1 || hs[0] != 2.5 {
		t.Fatalf("hop samples %v, want [2.5]", hs)
	}
	b.Ops[0].Parts[PartHop] = Summarize([]float64{1.5, 2.5})
	if c := Compare(a, b); len(c.Ops) != 3 || c.Ops[2].Name != "rollback: the RPC hop" || c.Ops[2].P50 != Summarize([]float64{1.5, 2.5}).P50 || c.Ops[2].A.N != 0 {
		t.Fatalf("ops with a hop %+v", c.Ops)
	}
	// Without the part on one side there is no second row.
	b.Ops[0].Parts = nil
	if c := Compare(a, b); len(c.Ops) != 1 {
		t.Fatalf("ops %+v", c.Ops)
	}
}

package bench

import (
	"context"
	"fmt"
	"strings"
	"testing"
)

func TestSummarize(t *testing.T) {
	s := Summarize([]float64{5, 1, 4, 2, 3, 10, 9, 8, 7, 6})
	if s.N != 10 || s.Min != 1 || s.Max != 10 || s.P50 != 5 || s.P95 != 10 || s.Mean != 5.5 {
		t.Fatalf("%+v", s)
	}
	if one := Summarize([]float64{42}); one.P50 != 42 || one.P95 != 42 || one.Max != 42 || one.N != 1 {
		t.Fatalf("%+v", one)
	}
	if zero := Summarize(nil); zero.N != 0 {
		t.Fatalf("%+v", zero)
	}
	in := []float64{3, 1, 2}
	Summarize(in)
	if in[0] != 3 {
		t.Fatal("Summarize reordered its input")
	}
}

func TestParallelJoinsErrors(t *testing.T) {
	err := parallel(t.Context(), 10, 3, func(_ context.Context, i int) error {
		if i%4 == 0 {
			return fmt.Errorf("item %d", i)
		}
		return nil
	})
	if err == nil || !strings.Contains(err.Error(), "item 0") || !strings.Contains(err.Error(), "item 8") {
		t.Fatalf("err = %v", err)
	}
}

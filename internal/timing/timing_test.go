package timing

import (
	"context"
	"strings"
	"testing"
	"time"
)

func TestRecorderHeaderRoundTrip(t *testing.T) {
	ctx, r := With(context.Background())
	r.Add("restore", 150*time.Millisecond)
	r.Add("envd", 3*time.Millisecond)
	r.Add("restore", 50*time.Millisecond)
	done := Track(ctx, "commit")
	done()
	h := r.Header()
	if !strings.HasPrefix(h, `restore;dur=200.0;desc="x2", envd;dur=3.0, commit;dur=`) {
		t.Fatalf("header %q", h)
	}
	got := Parse(h)
	if got["restore"] != 200 || got["envd"] != 3 {
		t.Fatalf("parsed %v from %q", got, h)
	}
	if _, ok := got["commit"]; !ok {
		t.Fatalf("commit missing from %v", got)
	}
	if n := ParseCounts(h); n["restore"] != 2 || n["envd"] != 1 || n["commit"] != 1 {
		t.Fatalf("counts %v from %q", n, h)
	}
}

func TestTrackWithoutRecorder(t *testing.T) {
	Track(context.Background(), "x")() // must not panic
}

func TestParseIgnoresJunk(t *testing.T) {
	got := Parse(`, a;desc="no dur", b;dur=x, c;dur=1.5`)
	if len(got) != 1 || got["c"] != 1.5 {
		t.Fatalf("parsed %v", got)
	}
}

func TestParseCountsIgnoresJunk(t *testing.T) {
	got := ParseCounts(`, a;desc="no count", b;dur=1;desc="x0", c;dur=2;desc="x12"`)
	if len(got) != 3 || got["a"] != 1 || got["b"] != 1 || got["c"] != 12 {
		t.Fatalf("parsed %v", got)
	}
}

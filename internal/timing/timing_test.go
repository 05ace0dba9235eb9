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

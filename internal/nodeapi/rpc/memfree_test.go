package rpc

import (
	"testing"

	"google.golang.org/protobuf/proto"

	"github.com/spore-run/spore/internal/nodeapi"
	nodev1 "github.com/spore-run/spore/proto/gen/node/v1"
)

// A node's free memory crosses the wire as it was (negative under its
// floor included), and a node that reports none stays without: unset is
// not 0 MB free.
func TestMemoryFreeRoundTrip(t *testing.T) {
	for _, mb := range []*int64{nil, ptr(0), ptr(-300), ptr(12345)} {
		b, err := proto.Marshal(infoPB(nodeapi.NodeInfo{ID: "n", MemoryFreeMB: mb}))
		if err != nil {
			t.Fatal(err)
		}
		var pb nodev1.InfoResponse
		if err := proto.Unmarshal(b, &pb); err != nil {
			t.Fatal(err)
		}
		got := info(&pb).MemoryFreeMB
		if (got == nil) != (mb == nil) || got != nil && *got != *mb {
			t.Fatalf("MemoryFreeMB %v came back as %v", show(mb), show(got))
		}
	}
}

func ptr(v int64) *int64 { return &v }

func show(p *int64) any {
	if p == nil {
		return "unset"
	}
	return *p
}

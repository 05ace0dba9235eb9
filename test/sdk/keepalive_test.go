package sdk

import (
	"bufio"
	"strings"
	"testing"
)

// The stock SDK's reused (keep-alive) connections through the proxy carry
// unary calls, command streams and uploads/downloads small and large, in a
// row, four at a time and across idle gaps around undici's keep-alive
// timeout, without one failure (keepalive.mjs; KEEPALIVE_SEED replays a
// run's gaps and order).
func TestKeepAliveStockSDK(t *testing.T) {
	s := newServer(t)
	out := s.node("keepalive.mjs")
	sc := bufio.NewScanner(strings.NewReader(out))
	for sc.Scan() {
		t.Log(sc.Text())
	}
	if !strings.Contains(out, " ok, 0 failed") {
		t.Fatal("keep-alive exchanges failed")
	}
	if code, body := s.rest("GET", "/v2/sandboxes", ""); code != 200 || string(body) != "[]\n" {
		t.Fatalf("sandboxes left: %d %s", code, body)
	}
}

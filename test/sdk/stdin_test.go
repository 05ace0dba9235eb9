package sdk

import (
	"bufio"
	"strings"
	"testing"
)

// The stock SDK sends 8 MiB through `cat` in 1 MiB sendStdin calls and gets
// it back complete and in order, and kill answers while a sendStdin is
// blocked on a process that never reads (stdin.mjs).
func TestStdinThroughCat(t *testing.T) {
	s := newServer(t)
	out := s.node("stdin.mjs")
	sc := bufio.NewScanner(strings.NewReader(out))
	for sc.Scan() {
		t.Log(sc.Text())
	}
	if !strings.Contains(out, "2 passed, 0 failed") {
		t.Fatal("stdin checks did not pass")
	}
	if code, body := s.rest("GET", "/v2/sandboxes", ""); code != 200 || string(body) != "[]\n" {
		t.Fatalf("sandboxes left: %d %s", code, body)
	}
}

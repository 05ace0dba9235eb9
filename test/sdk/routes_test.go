package sdk

import (
	"os"
	"regexp"
	"strings"
	"testing"

	"github.com/spore-run/spore/internal/api"
	"github.com/spore-run/spore/internal/testenv"
)

// TestEveryE2BRouteIsAnswered reads the E2B API's paths and methods from
// the stock SDK's own type declarations (node_modules/e2b, the version
// package.json pins) and checks that Spore routes each one: served, or
// answered with a JSON 501 (api.E2BUnimplemented). A route of a newer SDK
// that Spore does not know would otherwise get the 404 the SDK reads as
// "does not exist" (Template.exists answering false was that bug).
func TestEveryE2BRouteIsAnswered(t *testing.T) {
	testenv.RealTier(t)
	b, err := os.ReadFile("node_modules/e2b/dist/index.d.ts")
	if err != nil {
		t.Fatalf("the stock SDK's declarations (`make sdk-deps`): %v", err)
	}
	s := string(b)
	start := strings.Index(s, "interface paths {")
	end := strings.Index(s, "interface paths$1 {")
	if start < 0 || end < start {
		t.Fatal("no `interface paths` block in the SDK's declarations: their layout changed; update this test")
	}
	block := s[start:end]
	pathRE := regexp.MustCompile(`\n  "(/[^"]*)": \{`)
	methodRE := regexp.MustCompile(`\n    (get|put|post|delete|patch)\??: (?:never;)?`)
	norm := regexp.MustCompile(`\{[^}]*\}`)
	served := map[string]bool{}
	for r := range api.Routes() {
		served[norm.ReplaceAllString(r, "{}")] = true
	}
	for _, r := range api.E2BUnimplemented() {
		served[norm.ReplaceAllString(r, "{}")] = true
	}
	locs := pathRE.FindAllStringSubmatchIndex(block, -1)
	n := 0
	for i, l := range locs {
		path := block[l[2]:l[3]]
		body := block[l[1]:]
		if i+1 < len(locs) {
			body = block[l[1]:locs[i+1][0]]
		}
		for _, m := range methodRE.FindAllStringSubmatch(body, -1) {
			if strings.HasSuffix(m[0], "never;") {
				continue
			}
			n++
			route := strings.ToUpper(m[1]) + " " + path
			if !served[norm.ReplaceAllString(route, "{}")] {
				t.Errorf("E2B route %s is neither served nor answered 501 (add it to api's e2bUnimplemented or serve it)", route)
			}
		}
	}
	if n < 40 {
		t.Fatalf("read only %d routes from the SDK's declarations: their layout changed; update this test", n)
	}
	t.Logf("%d E2B routes, each served or answered 501", n)
}

package main

import (
	"fmt"
	"os"
	"regexp"
	"strings"
	"time"
)

// flake is one entry of the flake list: a top-level test that may be
// rerun once, with where docs/reliability.md explains it.
type flake struct {
	Test    string
	Package string // full import path
	Anchor  string // a heading (or id="...") in the docs file
	Expires time.Time
	Reason  string
}

// MaxFlakeLife bounds how far ahead an entry may expire: a rerun hides
// any regression inside its test, so an entry is a debt with a due date.
const MaxFlakeLife = 30 * 24 * time.Hour

// now is the clock entries expire by (tests move it).
var now = time.Now

const modulePrefix = "github.com/spore-run/spore/"

// loadFlakes reads the flake list: one entry a line,
//
//	TestName package docs-anchor expires=YYYY-MM-DD reason...
//
// (package as ./internal/x or the full import path; # starts a comment).
// Every entry must point at an anchor docs has: a flake nobody documented
// is not allowed to be rerun. Every entry expires, at most MaxFlakeLife
// ahead: on its date the list, and so the run, fails until the flake is
// fixed (or explained again with a new date).
func loadFlakes(path, docsPath string) ([]flake, error) {
	b, err := os.ReadFile(path)
	if os.IsNotExist(err) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	docs, err := os.ReadFile(docsPath)
	if err != nil {
		return nil, fmt.Errorf("flake list: %w", err)
	}
	anchors := docAnchors(string(docs))
	var out []flake
	for i, l := range strings.Split(string(b), "\n") {
		if j := strings.IndexByte(l, '#'); j >= 0 {
			l = l[:j]
		}
		f := strings.Fields(l)
		if len(f) == 0 {
			continue
		}
		if len(f) < 5 || !strings.HasPrefix(f[0], "Test") || strings.Contains(f[0], "/") {
			return nil, fmt.Errorf("%s:%d: want `TestName package docs-anchor expires=YYYY-MM-DD reason...` (a top-level test)", path, i+1)
		}
		date, ok := strings.CutPrefix(f[3], "expires=")
		exp, err := time.Parse(time.DateOnly, date)
		if !ok || err != nil {
			return nil, fmt.Errorf("%s:%d: %s: want expires=YYYY-MM-DD as the fourth field, got %q", path, i+1, f[0], f[3])
		}
		switch today := now(); {
		case !today.Before(exp):
			return nil, fmt.Errorf("%s:%d: %s: the flake's entry expired on %s: fix the flake, or document what was learned and give a new date", path, i+1, f[0], date)
		case exp.Sub(today) > MaxFlakeLife:
			return nil, fmt.Errorf("%s:%d: %s: expires=%s is more than %d days away", path, i+1, f[0], date, int(MaxFlakeLife.Hours()/24))
		}
		pkg := f[1]
		if strings.HasPrefix(pkg, "./") {
			pkg = modulePrefix + strings.TrimPrefix(pkg, "./")
		}
		if !anchors[f[2]] {
			return nil, fmt.Errorf("%s:%d: %s: no anchor %q in %s (document the flake there first)", path, i+1, f[0], f[2], docsPath)
		}
		out = append(out, flake{Test: f[0], Package: pkg, Anchor: f[2], Expires: exp, Reason: strings.Join(f[4:], " ")})
	}
	return out, nil
}

var idAttr = regexp.MustCompile(`id="([^"]+)"`)

// docAnchors returns the anchors of a Markdown document: its headings as
// GitHub slugs them, and explicit id="..." attributes.
func docAnchors(doc string) map[string]bool {
	out := map[string]bool{}
	for _, l := range strings.Split(doc, "\n") {
		if strings.HasPrefix(l, "#") {
			out[slug(strings.TrimLeft(l, "# "))] = true
		}
		for _, m := range idAttr.FindAllStringSubmatch(l, -1) {
			out[m[1]] = true
		}
	}
	return out
}

// slug is GitHub's heading anchor: lower case, spaces to '-', punctuation
// other than '-' and '_' dropped.
func slug(h string) string {
	var b strings.Builder
	for _, r := range strings.ToLower(strings.TrimSpace(h)) {
		switch {
		case r == ' ':
			b.WriteRune('-')
		case r == '-' || r == '_' || r >= 'a' && r <= 'z' || r >= '0' && r <= '9' || r > 127:
			b.WriteRune(r)
		}
	}
	return b.String()
}

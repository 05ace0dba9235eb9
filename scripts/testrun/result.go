package main

import (
	"bufio"
	"encoding/json"
	"fmt"
	"io"
	"sort"
	"strings"
)

// event is one line of `go test -json` (see `go doc test2json`).
type event struct {
	Action     string
	Package    string
	Test       string
	Elapsed    float64
	Output     string
	ImportPath string // build-output, build-fail
}

type testKey struct{ pkg, name string }

type line struct {
	test, text string
}

// result is what one go test run reported.
type result struct {
	status    map[testKey]string // run, pass, fail, skip (every test and subtest)
	order     []testKey          // top-level tests, in the order they started
	pkgStatus map[string]string  // pass, fail, skip (no test files)
	pkgTime   map[string]float64 // seconds, as go test reported them
	pkgOrder  []string
	output    map[string][]line   // per package, tagged with the test ("" for the package)
	build     map[string][]string // build output per import path
	reruns    []string
	fixed     map[testKey]bool // failed, then passed its one rerun
}

func newResult() *result {
	return &result{status: map[testKey]string{}, pkgStatus: map[string]string{}, pkgTime: map[string]float64{}, output: map[string][]line{},
		build: map[string][]string{}, fixed: map[testKey]bool{}}
}

func topLevel(name string) bool { return name != "" && !strings.Contains(name, "/") }

// parse reads the event stream; progress goes to out: one line per
// package, every failure with its output, and slow tests.
func (r *result) parse(in io.Reader, out io.Writer) {
	sc := bufio.NewScanner(in)
	sc.Buffer(make([]byte, 1<<20), 64<<20)
	for sc.Scan() {
		var e event
		if err := json.Unmarshal(sc.Bytes(), &e); err != nil || e.Action == "" {
			fmt.Fprintln(out, sc.Text()) // not an event (a build error on an older go)
			continue
		}
		k := testKey{e.Package, e.Test}
		switch e.Action {
		case "build-output":
			r.build[e.ImportPath] = append(r.build[e.ImportPath], e.Output)
		case "build-fail":
			fmt.Fprintf(out, "BUILD FAIL %s\n%s", e.ImportPath, strings.Join(r.build[e.ImportPath], ""))
		case "start":
			if _, ok := r.pkgStatus[e.Package]; !ok {
				r.pkgOrder = append(r.pkgOrder, e.Package)
			}
			r.pkgStatus[e.Package] = "run"
		case "run":
			if _, seen := r.status[k]; !seen && topLevel(e.Test) {
				r.order = append(r.order, k)
			}
			r.status[k] = "run"
		case "output":
			r.output[e.Package] = append(r.output[e.Package], line{e.Test, e.Output})
		case "pass", "fail", "skip":
			if e.Test != "" {
				r.status[k] = e.Action
				if topLevel(e.Test) {
					switch {
					case e.Action == "fail":
						fmt.Fprintf(out, "--- FAIL: %s %s (%.1fs)\n%s", e.Package, e.Test, e.Elapsed, r.testOutput(k))
					case e.Elapsed >= 10:
						fmt.Fprintf(out, "    %s %s (%.0fs)\n", strings.ToUpper(e.Action), e.Test, e.Elapsed)
					}
				}
				continue
			}
			r.pkgStatus[e.Package] = e.Action
			r.pkgTime[e.Package] += e.Elapsed
			switch e.Action {
			case "pass":
				fmt.Fprintf(out, "ok   %s (%.1fs)\n", e.Package, e.Elapsed)
			case "fail":
				fmt.Fprintf(out, "FAIL %s (%.1fs)\n", e.Package, e.Elapsed)
				if len(r.failedTests(e.Package)) == 0 {
					// A panic, a -timeout or a build error: show what the
					// package said outside its tests.
					fmt.Fprint(out, r.testOutput(testKey{e.Package, ""}))
				}
			}
		}
	}
}

// testOutput is the output of a test and its subtests ("" is the
// package's own output and that of tests that never finished).
func (r *result) testOutput(k testKey) string {
	var b strings.Builder
	for _, l := range r.output[k.pkg] {
		if k.name == "" && (l.test == "" || r.status[testKey{k.pkg, l.test}] == "run") ||
			k.name != "" && (l.test == k.name || strings.HasPrefix(l.test, k.name+"/")) {
			b.WriteString(l.text)
		}
	}
	return b.String()
}

// failedTests lists the top-level tests of pkg that failed or never
// finished (a panic or -timeout ends the package under them).
func (r *result) failedTests(pkg string) []string {
	var out []string
	for _, k := range r.order {
		if k.pkg == pkg && (r.status[k] == "fail" || r.status[k] == "run") && !r.fixed[k] {
			out = append(out, k.name)
		}
	}
	return out
}

// rerunnable returns the listed flakes that failed.
func (r *result) rerunnable(flakes []flake) []flake {
	var out []flake
	for _, f := range flakes {
		if r.status[testKey{f.Package, f.Test}] == "fail" {
			out = append(out, f)
		}
	}
	return out
}

// applyRerun records a listed flake's one rerun; it counts as passed only
// if the rerun passed.
func (r *result) applyRerun(f flake, rr *result) {
	k := testKey{f.Package, f.Test}
	outcome := rr.status[k]
	if outcome == "" {
		outcome = "did not run"
	}
	r.reruns = append(r.reruns, fmt.Sprintf("%s (%s): %s on rerun", f.Test, f.Package, outcome))
	if outcome == "pass" {
		r.fixed[k] = true
	}
}

type verdict struct {
	ok       bool
	summary  string
	problems []string
	times    string // each package's time, slowest first
}

// packageTimes lists each package's time, slowest first (those under a
// second together), so a suite's growth shows in every summary.
func (r *result) packageTimes() string {
	type pt struct {
		pkg string
		s   float64
	}
	var all []pt
	for p, s := range r.pkgTime {
		all = append(all, pt{strings.TrimPrefix(p, modulePrefix), s})
	}
	sort.Slice(all, func(i, j int) bool { return all[i].s > all[j].s || all[i].s == all[j].s && all[i].pkg < all[j].pkg })
	var b strings.Builder
	small, smallS := 0, 0.0
	for _, x := range all {
		if x.s < 1 {
			small, smallS = small+1, smallS+x.s
			continue
		}
		fmt.Fprintf(&b, "  %7.1fs  %s\n", x.s, x.pkg)
	}
	if small > 0 {
		fmt.Fprintf(&b, "  %7.1fs  (%d packages under a second each)\n", smallS, small)
	}
	return b.String()
}

func (r *result) verdict(forbidSkips bool, goErr error) verdict {
	var passed, failed, skipped int
	var problems []string
	for _, k := range r.order {
		switch st := r.status[k]; {
		case st == "pass" || r.fixed[k]:
			passed++
		case st == "skip":
			skipped++
		case st == "fail":
			failed++
			problems = append(problems, fmt.Sprintf("FAIL %s %s", k.pkg, k.name))
		default:
			failed++
			problems = append(problems, fmt.Sprintf("FAIL %s %s: did not finish (panic or -timeout)", k.pkg, k.name))
		}
	}
	pkgFails := 0
	for _, p := range r.pkgOrder {
		if r.pkgStatus[p] != "fail" {
			continue
		}
		if len(r.failedTests(p)) == 0 && !r.onlyFixed(p) {
			pkgFails++
			problems = append(problems, fmt.Sprintf("FAIL %s: failed outside any test (build error, panic or -timeout)", p))
		}
	}
	var skips []string
	for k, st := range r.status {
		if st == "skip" {
			skips = append(skips, k.pkg+" "+k.name)
		}
	}
	sort.Strings(skips)
	if forbidSkips {
		for _, s := range skips {
			problems = append(problems, "SKIPPED in a tier that allows no skips: "+s)
		}
	}
	if goErr != nil && len(problems) == 0 && len(r.reruns) == 0 {
		problems = append(problems, fmt.Sprintf("go test failed with no failing test or package: %v", goErr))
	}
	summary := fmt.Sprintf("%d passed, %d failed, %d skipped (top-level tests; %d skips counting subtests), %d packages",
		passed, failed, skipped, len(skips), len(r.pkgOrder))
	if pkgFails > 0 {
		summary += fmt.Sprintf(", %d package failures outside tests", pkgFails)
	}
	summary += fmt.Sprintf("; reruns: %d", len(r.reruns))
	if len(r.reruns) > 0 {
		summary += " (" + strings.Join(r.reruns, "; ") + ")"
	}
	return verdict{ok: len(problems) == 0, summary: summary, problems: problems, times: r.packageTimes()}
}

// onlyFixed reports whether every failure of pkg was a listed flake that
// passed its rerun (the package's "fail" is then theirs).
func (r *result) onlyFixed(p string) bool {
	for _, k := range r.order {
		if k.pkg == p && r.fixed[k] {
			return true
		}
	}
	return false
}

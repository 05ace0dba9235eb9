// Command testrun runs one tier of Spore's tests (`go test -json`) and
// judges the result: every failing test fails the run, except a test named
// in the flake list (scripts/flaky.txt), which is rerun once, by name, and
// must pass then; every rerun is counted and named in the summary. A
// package that fails without a failing test (build error, panic, the
// -timeout budget) fails the run. With -forbid-skips (the real tier) a
// skipped test fails the run too: there a missing runtime is a failure.
//
// Usage (scripts/test.sh calls it):
//
//	go run ./scripts/testrun -tier fast -flaky scripts/flaky.txt -docs docs/reliability.md \
//	    -json-out /tmp/fast.json -summary /tmp/summary -- -race -count=1 -timeout=15m ./...
//
// Flags after "--" go to `go test`; they must use the -flag=value form so
// that the package patterns (the arguments not starting with "-") can be
// told apart for reruns.
package main

import (
	"flag"
	"fmt"
	"io"
	"os"
	"os/exec"
	"strings"
	"time"
)

func main() {
	tier := flag.String("tier", "", "tier name, for the summary")
	flakyFile := flag.String("flaky", "scripts/flaky.txt", "the flake list")
	docsFile := flag.String("docs", "docs/reliability.md", "document every flake entry must point into")
	forbidSkips := flag.Bool("forbid-skips", false, "a skipped test fails the run (real tier)")
	jsonOut := flag.String("json-out", "", "write the raw go test -json stream here")
	summaryOut := flag.String("summary", "", "append the one-line summary to this file")
	goBin := flag.String("go", envOr("GO", "go"), "the go command")
	flag.Parse()
	args := flag.Args()
	if *tier == "" || len(args) == 0 {
		fmt.Fprintln(os.Stderr, "usage: testrun -tier NAME [flags] -- <go test flags> <packages>")
		os.Exit(2)
	}
	flakes, err := loadFlakes(*flakyFile, *docsFile)
	if err != nil {
		fmt.Fprintf(os.Stderr, "testrun: %v\n", err)
		os.Exit(2)
	}
	start := time.Now()
	var raw io.Writer = io.Discard
	if *jsonOut != "" {
		f, err := os.Create(*jsonOut)
		if err != nil {
			fmt.Fprintf(os.Stderr, "testrun: %v\n", err)
			os.Exit(2)
		}
		defer f.Close()
		raw = f
	}
	v := runTier(*goBin, "", args, flakes, *forbidSkips, raw, os.Stdout)
	line := fmt.Sprintf("%s tier: %s in %s", *tier, v.summary, time.Since(start).Round(time.Second))
	fmt.Printf("\n%s\n", line)
	for _, p := range v.problems {
		fmt.Printf("  %s\n", p)
	}
	if *summaryOut != "" {
		if f, err := os.OpenFile(*summaryOut, os.O_CREATE|os.O_APPEND|os.O_WRONLY, 0o644); err == nil {
			fmt.Fprintln(f, line)
			for _, p := range v.problems {
				fmt.Fprintf(f, "  %s\n", p)
			}
			fmt.Fprintf(f, "  %s tier, time per package:\n%s", *tier, v.times)
			f.Close()
		}
	}
	if !v.ok {
		os.Exit(1)
	}
}

func envOr(k, def string) string {
	if v := os.Getenv(k); v != "" {
		return v
	}
	return def
}

// splitArgs separates go test flags from package patterns.
func splitArgs(args []string) (flags, pkgs []string) {
	for _, a := range args {
		if strings.HasPrefix(a, "-") {
			flags = append(flags, a)
		} else {
			pkgs = append(pkgs, a)
		}
	}
	return flags, pkgs
}

// runTier runs the tier's tests in dir, reruns the listed flakes that
// failed (once each) and judges the outcome.
func runTier(goBin, dir string, args []string, flakes []flake, forbidSkips bool, raw, out io.Writer) verdict {
	res, goErr := run(goBin, dir, args, raw, out)
	flags, _ := splitArgs(args)
	for _, f := range res.rerunnable(flakes) {
		fmt.Fprintf(out, "\n=== RERUN (listed flake, see %s): %s in %s\n", f.Anchor, f.Test, f.Package)
		rr, _ := run(goBin, dir, append(append([]string{}, flags...), "-run=^"+f.Test+"$", f.Package), raw, out)
		res.applyRerun(f, rr)
	}
	return res.verdict(forbidSkips, goErr)
}

// run runs go test -json with args in dir, copies the stream to raw, prints
// progress to out and returns what happened.
func run(goBin, dir string, args []string, raw, out io.Writer) (*result, error) {
	cmd := exec.Command(goBin, append([]string{"test", "-json"}, args...)...)
	cmd.Dir = dir
	cmd.Stderr = os.Stderr
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		return newResult(), err
	}
	if err := cmd.Start(); err != nil {
		return newResult(), err
	}
	res := newResult()
	res.parse(io.TeeReader(stdout, raw), out)
	return res, cmd.Wait()
}

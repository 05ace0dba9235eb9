package main

import (
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// A scratch module whose tests misbehave on demand: TestFlaky fails the
// first time it runs (a counter file), or always with FLAKY_ALWAYS; TestSkip
// skips with SKIPME; TestHang outlives a short -timeout with HANG.
const scratchTest = `package scratch

import (
	"os"
	"testing"
	"time"
)

func TestSteady(t *testing.T) {}

func TestFlaky(t *testing.T) {
	p := os.Getenv("FLAKY_COUNTER")
	b, _ := os.ReadFile(p)
	os.WriteFile(p, append(b, 'x'), 0o644)
	if len(b) == 0 || os.Getenv("FLAKY_ALWAYS") != "" {
		t.Fatal("flaked")
	}
}

func TestSkip(t *testing.T) {
	if os.Getenv("SKIPME") != "" {
		t.Skip("skipping on purpose")
	}
	t.Run("sub", func(t *testing.T) {})
}

func TestHang(t *testing.T) {
	if os.Getenv("HANG") != "" {
		time.Sleep(time.Minute)
	}
}
`

func scratch(t *testing.T) string {
	t.Helper()
	dir := t.TempDir()
	os.WriteFile(filepath.Join(dir, "go.mod"), []byte("module scratch\n\ngo 1.22\n"), 0o644)
	os.WriteFile(filepath.Join(dir, "scratch_test.go"), []byte(scratchTest), 0o644)
	t.Setenv("FLAKY_COUNTER", filepath.Join(dir, "counter"))
	t.Setenv("GOFLAGS", "")
	return dir
}

func flakesFor(t *testing.T, list string) []flake {
	t.Helper()
	dir := t.TempDir()
	os.WriteFile(filepath.Join(dir, "flaky.txt"), []byte(list), 0o644)
	os.WriteFile(filepath.Join(dir, "doc.md"), []byte("# Doc\n\n## Flaky: TestFlaky (a race)\n"), 0o644)
	f, err := loadFlakes(filepath.Join(dir, "flaky.txt"), filepath.Join(dir, "doc.md"))
	if err != nil {
		t.Fatal(err)
	}
	return f
}

func runScratch(t *testing.T, flakes []flake, forbidSkips bool, args ...string) verdict {
	t.Helper()
	dir := scratch(t)
	var out strings.Builder
	v := runTier("go", dir, append([]string{"-count=1"}, append(args, "./...")...), flakes, forbidSkips, io.Discard, &out)
	t.Logf("summary: %s\nproblems: %v\noutput:\n%s", v.summary, v.problems, out.String())
	return v
}

// A test that fails once and passes when run again fails the tier: nothing
// is rerun unless listed.
func TestUnlistedFlakeFails(t *testing.T) {
	v := runScratch(t, nil, false)
	if v.ok || !strings.Contains(strings.Join(v.problems, "\n"), "FAIL scratch TestFlaky") || !strings.Contains(v.summary, "reruns: 0") {
		t.Fatalf("an unlisted flake passed: %+v", v)
	}
}

// A listed flake is rerun once, and the rerun is counted and named.
func TestListedFlakeRerunOnce(t *testing.T) {
	v := runScratch(t, flakesFor(t, "TestFlaky scratch flaky-testflaky-a-race "+soon()+" some race\n"), false)
	if !v.ok || !strings.Contains(v.summary, "reruns: 1 (TestFlaky (scratch): pass on rerun)") || !strings.Contains(v.summary, "0 failed") {
		t.Fatalf("listed flake: %+v", v)
	}
	t.Setenv("FLAKY_ALWAYS", "1")
	v = runScratch(t, flakesFor(t, "TestFlaky scratch flaky-testflaky-a-race "+soon()+" some race\n"), false)
	if v.ok || !strings.Contains(v.summary, "fail on rerun") {
		t.Fatalf("a listed test failing its rerun passed: %+v", v)
	}
}

// In the real tier a skip is a failure.
func TestSkipsForbidden(t *testing.T) {
	t.Setenv("SKIPME", "1")
	flakes := flakesFor(t, "TestFlaky scratch flaky-testflaky-a-race "+soon()+" r\n")
	if v := runScratch(t, flakes, false); !v.ok || !strings.Contains(v.summary, "1 skipped") {
		t.Fatalf("fast tier with a skip: %+v", v)
	}
	if v := runScratch(t, flakes, true); v.ok || !strings.Contains(strings.Join(v.problems, "\n"), "SKIPPED in a tier that allows no skips: scratch TestSkip") {
		t.Fatalf("real tier with a skip passed: %+v", v)
	}
}

// A test that outlives -timeout fails the tier, by name.
func TestTimeoutFails(t *testing.T) {
	t.Setenv("HANG", "1")
	v := runScratch(t, flakesFor(t, "TestFlaky scratch flaky-testflaky-a-race "+soon()+" r\n"), false, "-timeout=3s")
	if v.ok || !strings.Contains(strings.Join(v.problems, "\n"), "TestHang") {
		t.Fatalf("a hung test passed: %+v", v)
	}
}

// A flake entry must point at documentation that exists.
func TestFlakeNeedsDocs(t *testing.T) {
	dir := t.TempDir()
	os.WriteFile(filepath.Join(dir, "flaky.txt"), []byte("TestX ./internal/x no-such-anchor "+soon()+" reason\n"), 0o644)
	os.WriteFile(filepath.Join(dir, "doc.md"), []byte("# Doc\n<a id=\"other\"></a>\n"), 0o644)
	if _, err := loadFlakes(filepath.Join(dir, "flaky.txt"), filepath.Join(dir, "doc.md")); err == nil {
		t.Fatal("an undocumented flake was accepted")
	}
	os.WriteFile(filepath.Join(dir, "flaky.txt"), []byte("# comment\nTestX ./internal/x other "+soon()+" reason\n"), 0o644)
	f, err := loadFlakes(filepath.Join(dir, "flaky.txt"), filepath.Join(dir, "doc.md"))
	if err != nil || len(f) != 1 || f[0].Package != modulePrefix+"internal/x" {
		t.Fatalf("loadFlakes = %+v, %v", f, err)
	}
}

func soon() string { return "expires=" + time.Now().AddDate(0, 0, 7).Format(time.DateOnly) }

// Every entry expires: one without a date, past its date or dated beyond
// MaxFlakeLife is refused (the run fails), one within it is taken.
func TestFlakeEntriesExpire(t *testing.T) {
	dir := t.TempDir()
	doc := filepath.Join(dir, "doc.md")
	os.WriteFile(doc, []byte("# Doc\n<a id=\"x\"></a>\n"), 0o644)
	list := filepath.Join(dir, "flaky.txt")
	defer func(old func() time.Time) { now = old }(now)
	now = func() time.Time { return time.Date(2026, 12, 4, 12, 0, 0, 0, time.UTC) }
	for entry, ok := range map[string]bool{
		"TestX ./internal/x x reason":                      false, // no date
		"TestX ./internal/x x expires=soon reason":         false,
		"TestX ./internal/x x expires=2026-12-04 reason":   false, // today: expired
		"TestX ./internal/x x expires=2026-11-30 reason":   false,
		"TestX ./internal/x x expires=2027-06-01 reason":   false, // too far
		"TestX ./internal/x x expires=2026-12-20 a reason": true,
	} {
		os.WriteFile(list, []byte(entry+"\n"), 0o644)
		f, err := loadFlakes(list, doc)
		if ok && (err != nil || len(f) != 1 || f[0].Reason != "a reason") || !ok && err == nil {
			t.Errorf("%q: %+v %v, want accepted %v", entry, f, err, ok)
		}
	}
}

// The repository's own flake list is valid.
func TestRepoFlakeList(t *testing.T) {
	if _, err := loadFlakes("../flaky.txt", "../../docs/reliability.md"); err != nil {
		t.Fatal(err)
	}
}

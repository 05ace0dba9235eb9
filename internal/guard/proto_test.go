package guard

import (
	"bytes"
	"os"
	"os/exec"
	"path/filepath"
	"testing"
)

// The generated protocol code is committed; it must match what the .proto
// files generate (run `make proto` after editing them).
func TestGeneratedProtoIsFresh(t *testing.T) {
	cache := os.Getenv("SPORE_CACHE_DIR")
	if cache == "" {
		cache = "/var/cache/spore"
	}
	tools := filepath.Join(cache, "tools")
	for _, tool := range []string{"protoc-gen-go", "protoc-gen-connect-go"} {
		if _, err := os.Stat(filepath.Join(tools, tool)); err != nil {
			t.Fatalf("%s missing in %s (run `make setup`)", tool, tools)
		}
	}
	if _, err := exec.LookPath("protoc"); err != nil {
		t.Fatal("protoc missing (run `make setup`)")
	}
	root, _ := filepath.Abs("../..")
	out := t.TempDir()
	cmd := exec.Command(filepath.Join(root, "proto", "gen.sh"), out)
	cmd.Env = append(os.Environ(), "PATH="+tools+":"+os.Getenv("PATH"))
	if b, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("gen.sh: %v: %s", err, b)
	}
	n := 0
	filepath.Walk(out, func(p string, info os.FileInfo, err error) error {
		if err != nil || info.IsDir() {
			return err
		}
		rel, _ := filepath.Rel(out, p)
		want, _ := os.ReadFile(p)
		got, err := os.ReadFile(filepath.Join(root, "proto", "gen", rel))
		if err != nil || !bytes.Equal(got, want) {
			t.Errorf("proto/gen/%s is stale: run `make proto`", rel)
		}
		n++
		return nil
	})
	if n == 0 {
		t.Fatal("gen.sh generated nothing")
	}
}

package atomicfs

import (
	"os"
	"path/filepath"
	"testing"
)

func TestWriteReplacesAndLeavesNoTemp(t *testing.T) {
	for name, write := range map[string]func(string, any) error{"durable": WriteJSON, "nosync": WriteJSONNoSync} {
		t.Run(name, func(t *testing.T) {
			dir := t.TempDir()
			p := filepath.Join(dir, "rec.json")
			for _, v := range []int{1, 2} {
				if err := write(p, map[string]int{"v": v}); err != nil {
					t.Fatal(err)
				}
			}
			var got map[string]int
			if err := ReadJSON(p, &got); err != nil || got["v"] != 2 {
				t.Fatalf("read back %v, %v", got, err)
			}
			st, err := os.Stat(p)
			if err != nil || st.Mode().Perm() != 0o600 {
				t.Fatalf("mode %v, %v", st.Mode(), err)
			}
			if ents, _ := os.ReadDir(dir); len(ents) != 1 {
				t.Fatalf("temporary files left: %v", ents)
			}
		})
	}
}

func TestWriteIntoMissingDirFails(t *testing.T) {
	if err := WriteFileNoSync(filepath.Join(t.TempDir(), "no", "such"), []byte("x"), 0o600); err == nil {
		t.Fatal("write into a missing directory succeeded")
	}
}

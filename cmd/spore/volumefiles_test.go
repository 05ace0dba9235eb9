package main

import (
	"bytes"
	"context"
	"crypto/rand"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/spore-run/spore/internal/api"
	"github.com/spore-run/spore/internal/apikey"
	"github.com/spore-run/spore/internal/store"
	"github.com/spore-run/spore/internal/store/sqlite"
)

// spore volume cp and files, against the API with its content routes over
// a directory per volume (what the node's volume mount is to the
// all-in-one server): a tree goes up and comes back the same (content,
// modes), a file into an existing directory keeps its name, "-" is
// standard input and output, symbolic links are skipped and named. Bad
// input is a clear error and a non-zero exit that copies nothing.
func TestVolumeCpAndFiles(t *testing.T) {
	ctx := context.Background()
	st, key := storeWithUserKey(t)
	vols := t.TempDir()
	srv := httptest.NewServer(api.New(api.Config{Store: st, VolumeContent: func(_ context.Context, v store.Volume) (*os.Root, error) {
		dir := filepath.Join(vols, v.ID)
		if err := os.MkdirAll(dir, 0o755); err != nil {
			return nil, err
		}
		return os.OpenRoot(dir)
	}}))
	defer srv.Close()
	cli := func(args ...string) (string, string, error) { return runCLI(t, srv.URL, key, args...) }
	if _, _, err := cli("volume", "create", "repo"); err != nil {
		t.Fatal(err)
	}
	out, _, err := cli("volume", "info", "repo", "--json")
	if err != nil {
		t.Fatal(err)
	}
	id := between(out, `"volumeID": "`, `"`)
	backing := filepath.Join(vols, id) // the volume's content, seen directly

	// A local tree: files of several sizes and modes, a deep one, a link.
	src := filepath.Join(t.TempDir(), "src")
	big := make([]byte, 300<<10)
	rand.Read(big)
	files := map[string][]byte{"a.txt": []byte("alpha\n"), "sub/b.bin": big, "sub/deep/er/c.txt": []byte("gamma"), "empty": nil, "run.sh": []byte("#!/bin/sh\necho hi\n")}
	for name, b := range files {
		p := filepath.Join(src, name)
		os.MkdirAll(filepath.Dir(p), 0o755)
		if err := os.WriteFile(p, b, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	os.Chmod(filepath.Join(src, "run.sh"), 0o755)
	os.MkdirAll(filepath.Join(src, "emptydir"), 0o755)
	os.Symlink("/etc/passwd", filepath.Join(src, "link"))

	_, errOut, err := cli("volume", "cp", "-r", src, "repo:/code")
	if err != nil || !strings.Contains(errOut, "uploaded 5 file(s)") || !strings.Contains(errOut, "skipped "+filepath.Join(src, "link")) {
		t.Fatalf("cp -r up: %q %v", errOut, err)
	}
	for name, b := range files {
		got, err := os.ReadFile(filepath.Join(backing, "code", name))
		if err != nil || !bytes.Equal(got, b) {
			t.Fatalf("%s in the volume: %d bytes, %v; want %d", name, len(got), err, len(b))
		}
	}
	if fi, err := os.Stat(filepath.Join(backing, "code", "run.sh")); err != nil || fi.Mode().Perm() != 0o755 {
		t.Fatalf("run.sh's mode in the volume: %v %v", fi.Mode(), err)
	}
	if fi, err := os.Stat(filepath.Join(backing, "code", "emptydir")); err != nil || !fi.IsDir() {
		t.Fatalf("emptydir in the volume: %v", err)
	}
	if _, err := os.Lstat(filepath.Join(backing, "code", "link")); !os.IsNotExist(err) {
		t.Fatalf("the link went up: %v", err)
	}
	// Into an existing directory: under the file's own name; a path
	// ending in / makes its parents.
	if _, _, err := cli("volume", "cp", filepath.Join(src, "a.txt"), "repo:/code/sub"); err != nil {
		t.Fatal(err)
	}
	if _, _, err := cli("volume", "cp", filepath.Join(src, "a.txt"), "repo:/docs/new/"); err != nil {
		t.Fatal(err)
	}
	for _, p := range []string{"code/sub/a.txt", "docs/new/a.txt"} {
		if b, err := os.ReadFile(filepath.Join(backing, p)); err != nil || string(b) != "alpha\n" {
			t.Fatalf("%s: %q %v", p, b, err)
		}
	}
	// Standard input up, standard output down.
	root := newRoot()
	root.SetIn(strings.NewReader("from stdin"))
	var discard bytes.Buffer
	root.SetOut(&discard)
	root.SetErr(&discard)
	root.SetArgs([]string{"volume", "cp", "-", "repo:/stdin.txt"})
	if err := root.ExecuteContext(ctx); err != nil {
		t.Fatalf("cp - : %v", err)
	}
	if out, _, err := cli("volume", "cp", "repo:/stdin.txt", "-"); err != nil || out != "from stdin" {
		t.Fatalf("cp to -: %q %v", out, err)
	}

	// files: one level, then everything below.
	out, _, err = cli("volume", "files", "repo:/code")
	if err != nil || !strings.Contains(out, "/code/a.txt") || !strings.Contains(out, "/code/sub/") || strings.Contains(out, "/code/sub/b.bin") {
		t.Fatalf("files: %q %v", out, err)
	}
	out, _, err = cli("volume", "files", "-r", "repo")
	if err != nil || !strings.Contains(out, "/code/sub/deep/er/c.txt") || !strings.Contains(out, "0755") || !strings.Contains(out, "/stdin.txt") {
		t.Fatalf("files -r: %q %v", out, err)
	}

	// Down again: the tree comes back the same.
	down := filepath.Join(t.TempDir(), "down")
	if _, errOut, err := cli("volume", "cp", "-r", "repo:/code", down); err != nil || !strings.Contains(errOut, "downloaded 6 file(s)") {
		t.Fatalf("cp -r down: %q %v", errOut, err)
	}
	for name, b := range files {
		got, err := os.ReadFile(filepath.Join(down, name))
		if err != nil || !bytes.Equal(got, b) {
			t.Fatalf("%s downloaded: %d bytes, %v; want %d", name, len(got), err, len(b))
		}
	}
	if fi, err := os.Stat(filepath.Join(down, "run.sh")); err != nil || fi.Mode().Perm() != 0o755 {
		t.Fatalf("run.sh's mode downloaded: %v %v", fi.Mode(), err)
	}
	if fi, err := os.Stat(filepath.Join(down, "emptydir")); err != nil || !fi.IsDir() {
		t.Fatalf("emptydir downloaded: %v", err)
	}
	// A file into an existing directory keeps its name.
	into := t.TempDir()
	if _, _, err := cli("volume", "cp", "repo:/code/sub/deep/er/c.txt", into); err != nil {
		t.Fatal(err)
	}
	if b, err := os.ReadFile(filepath.Join(into, "c.txt")); err != nil || string(b) != "gamma" {
		t.Fatalf("c.txt into a directory: %q %v", b, err)
	}
	if ents, _ := os.ReadDir(into); len(ents) != 1 {
		t.Fatalf("left in the directory: %v (a temporary file?)", ents)
	}

	// Refusals: an error, a non-zero exit, nothing copied.
	before := treeOf(t, backing)
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"volume", "cp", src, "repo:/x"}, "with -r"},
		{[]string{"volume", "cp", "-r", "repo:/code", filepath.Join(t.TempDir(), "nodir", "deeper", "x")}, ""},
		{[]string{"volume", "cp", src, filepath.Join(t.TempDir(), "x")}, "must be a volume"},
		{[]string{"volume", "cp", "repo:/a", "repo:/b"}, "both SRC and DST are volumes"},
		{[]string{"volume", "cp", "repo:/nope.txt", filepath.Join(into, "nope")}, "not"},
		{[]string{"volume", "cp", filepath.Join(src, "a.txt"), "repo:rel/x"}, "must start with /"},
		{[]string{"volume", "cp", filepath.Join(src, "a.txt"), "nosuch:/x"}, "not found"},
		{[]string{"volume", "cp", filepath.Join(src, "a.txt"), "repo:/../escape.txt"}, ""},
		{[]string{"volume", "cp", "repo:/code", into}, "with -r"},
		{[]string{"volume", "cp", "repo:/code", "-"}, "only a file"},
		{[]string{"volume", "cp", filepath.Join(src, "nope"), "repo:/x"}, "no such file"},
		{[]string{"volume", "files", "repo:/code/a.txt"}, "not a directory"},
		{[]string{"volume", "files", "nosuch"}, "not found"},
	} {
		out, _, err := cli(tc.args...)
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%v: %q %v, want an error with %q", tc.args, out, err, tc.want)
		}
	}
	if after := treeOf(t, backing); after != before {
		t.Fatalf("refused copies changed the volume:\n%s\nwas\n%s", after, before)
	}
	if _, err := os.Stat(filepath.Join(into, "nope")); !os.IsNotExist(err) {
		t.Fatalf("a refused download left a file: %v", err)
	}
	if _, err := os.Stat(filepath.Join(vols, "escape.txt")); !os.IsNotExist(err) {
		t.Fatalf("a path with .. reached outside the volume: %v", err)
	}
}

// treeOf lists a directory tree with sizes.
func treeOf(t *testing.T, dir string) string {
	var b strings.Builder
	filepath.Walk(dir, func(p string, fi os.FileInfo, err error) error {
		if err == nil {
			rel, _ := filepath.Rel(dir, p)
			b.WriteString(rel + " " + fi.Mode().String() + " ")
			if !fi.IsDir() {
				b.WriteString(fi.ModTime().String())
			}
			b.WriteString("\n")
		}
		return nil
	})
	return b.String()
}

func between(s, from, to string) string {
	_, rest, _ := strings.Cut(s, from)
	v, _, _ := strings.Cut(rest, to)
	return v
}

// storeWithUserKey opens a SQLite store (closed when t ends) holding one
// user key, and returns it with the key.
func storeWithUserKey(t *testing.T) (store.Store, string) {
	t.Helper()
	st, err := sqlite.Open(context.Background(), filepath.Join(t.TempDir(), "spore.db"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { st.Close() })
	const key = "spore_user_key_for_the_cli_tests"
	if err := st.AddAPIKey(context.Background(), store.APIKey{ID: "k1", Hash: apikey.Hash(key), Role: store.RoleMember, TeamID: store.DefaultTeam, CreatedAt: time.Now()}); err != nil {
		t.Fatal(err)
	}
	return st, key
}

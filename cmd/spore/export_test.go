package main

import (
	"archive/tar"
	"bytes"
	"os"
	"path/filepath"
	"testing"
)

type tarEntry struct {
	name, body, link string
	typ              byte
}

func tarOf(t *testing.T, entries ...tarEntry) []byte {
	t.Helper()
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	for _, e := range entries {
		h := &tar.Header{Name: e.name, Typeflag: e.typ, Mode: 0o644, Size: int64(len(e.body)), Linkname: e.link}
		if e.typ != tar.TypeReg {
			h.Size = 0
		}
		if err := tw.WriteHeader(h); err != nil {
			t.Fatal(err)
		}
		if e.typ == tar.TypeReg {
			tw.Write([]byte(e.body))
		}
	}
	tw.Close()
	return buf.Bytes()
}

// TestExtractLayout: a layout tar unpacks (files, directories, a file
// whose directory has no entry of its own), and its length is counted.
func TestExtractLayout(t *testing.T) {
	dir := t.TempDir()
	b := tarOf(t, tarEntry{name: "oci-layout", body: `{"imageLayoutVersion":"1.0.0"}`, typ: tar.TypeReg},
		tarEntry{name: "blobs/", typ: tar.TypeDir},
		tarEntry{name: "blobs/sha256/abc", body: "blob", typ: tar.TypeReg},
		tarEntry{name: "index.json", body: "{}", typ: tar.TypeReg})
	n, err := extractLayout(bytes.NewReader(b), dir)
	if err != nil || n != int64(len(b)) {
		t.Fatalf("extract: %d bytes of %d, %v", n, len(b), err)
	}
	if got, _ := os.ReadFile(filepath.Join(dir, "blobs/sha256/abc")); string(got) != "blob" {
		t.Fatalf("blob: %q", got)
	}
}

// TestExtractLayoutRefuses: a tar from the server cannot write outside
// the directory or make links: absolute names, ".." anywhere, symlinks,
// hard links and devices fail the extraction, and nothing lands outside.
func TestExtractLayoutRefuses(t *testing.T) {
	for what, e := range map[string]tarEntry{
		"absolute":     {name: "/tmp/spore-escape", body: "x", typ: tar.TypeReg},
		"parent":       {name: "../escape", body: "x", typ: tar.TypeReg},
		"inner parent": {name: "blobs/../../escape", body: "x", typ: tar.TypeReg},
		"parent dir":   {name: "../escape/", typ: tar.TypeDir},
		"symlink":      {name: "blobs", link: "/", typ: tar.TypeSymlink},
		"hard link":    {name: "x", link: "/etc/passwd", typ: tar.TypeLink},
		"device":       {name: "dev", typ: tar.TypeChar},
		"empty name":   {name: "", body: "x", typ: tar.TypeReg},
		"backslash":    {name: `..\escape`, body: "x", typ: tar.TypeReg},
		"dot":          {name: "./index.json", body: "x", typ: tar.TypeReg},
	} {
		parent := t.TempDir()
		dir := filepath.Join(parent, "layout")
		if err := os.Mkdir(dir, 0o755); err != nil {
			t.Fatal(err)
		}
		b := tarOf(t, tarEntry{name: "oci-layout", body: "{}", typ: tar.TypeReg}, e)
		if _, err := extractLayout(bytes.NewReader(b), dir); err == nil {
			t.Errorf("%s (%q): extracted", what, e.name)
		} else {
			t.Logf("%s: %v", what, err)
		}
		if ents, _ := os.ReadDir(parent); len(ents) != 1 {
			t.Errorf("%s: something was written beside the layout: %v", what, ents)
		}
	}
	if _, err := os.Stat("/tmp/spore-escape"); err == nil {
		t.Fatal("/tmp/spore-escape was written")
	}
}

// TestPrepareLayoutDir: --oci-layout takes a missing or empty directory,
// not one with files.
func TestPrepareLayoutDir(t *testing.T) {
	parent := t.TempDir()
	if created, err := prepareLayoutDir(filepath.Join(parent, "new")); err != nil || !created {
		t.Fatalf("missing dir: %v, %v", created, err)
	}
	if created, err := prepareLayoutDir(filepath.Join(parent, "new")); err != nil || created {
		t.Fatalf("empty dir: %v, %v", created, err)
	}
	os.WriteFile(filepath.Join(parent, "new", "f"), nil, 0o644)
	if _, err := prepareLayoutDir(filepath.Join(parent, "new")); err == nil {
		t.Fatal("a directory with a file was taken")
	}
}

package main

import (
	"encoding/json"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/spore-run/spore/internal/api"
)

// The volume verbs: create (shared by default, --exclusive, --size), ls,
// info (--json carries the token), rm; bad input is a clear error and a
// non-zero exit that creates nothing.
func TestVolumeVerbs(t *testing.T) {
	st, key := storeWithUserKey(t)
	srv := httptest.NewServer(api.New(api.Config{Store: st}))
	defer srv.Close()

	out, _, err := runCLI(t, srv.URL, key, "volume", "create", "repo")
	if err != nil || !strings.Contains(out, " repo shared 10 GiB") {
		t.Fatalf("volume create: %q %v", out, err)
	}
	out, _, err = runCLI(t, srv.URL, key, "volume", "create", "--exclusive", "--size", "1.5G", "cache")
	if err != nil || !strings.Contains(out, " cache exclusive 1.5 GiB") {
		t.Fatalf("volume create --exclusive --size: %q %v", out, err)
	}
	for _, args := range [][]string{
		{"volume", "create", "--size", "12 parsecs", "x"},
		{"volume", "create", "--size", "100K", "x"},
		{"volume", "create", "--size", "8M", "x"},
		{"volume", "create", "a/b"},
		{"volume", "create", "repo"},
	} {
		if out, _, err := runCLI(t, srv.URL, key, args...); err == nil {
			t.Fatalf("%v: %q, want an error", args, out)
		}
	}
	out, _, err = runCLI(t, srv.URL, key, "volume", "ls")
	if err != nil || strings.Count(out, "\n") != 3 || !strings.Contains(out, "repo") || !strings.Contains(out, "cache") || strings.Contains(out, "spv_") {
		t.Fatalf("volume ls: %q %v", out, err)
	}
	out, _, err = runCLI(t, srv.URL, key, "volume", "info", "cache", "--json")
	var v api.VolumeAndToken
	if err != nil || json.Unmarshal([]byte(out), &v) != nil || v.Name != "cache" || v.Mode != "exclusive" || v.SizeMB != 1536 || !strings.HasPrefix(v.Token, "spv_") {
		t.Fatalf("volume info --json: %q %v", out, err)
	}
	if _, _, err := runCLI(t, srv.URL, key, "volume", "info", "nope"); err == nil || !strings.Contains(err.Error(), "not found") {
		t.Fatalf("volume info nope: %v", err)
	}
	out, _, err = runCLI(t, srv.URL, key, "volume", "rm", "repo", v.VolumeID)
	if err != nil || strings.Count(out, "deleted") != 2 {
		t.Fatalf("volume rm: %q %v", out, err)
	}
	if out, _, _ := runCLI(t, srv.URL, key, "volume", "ls"); strings.Count(out, "\n") != 1 {
		t.Fatalf("after rm: %q", out)
	}
}

func TestParseVolumeFlags(t *testing.T) {
	got, err := parseVolumeFlags([]string{"data:/data", "cache:/home/user/cache:ro", "x:/y:rw"})
	if err != nil || len(got) != 3 || got[0].Name != "data" || got[0].Path != "/data" || got[0].ReadOnly || !got[1].ReadOnly || got[2].ReadOnly {
		t.Fatalf("parseVolumeFlags = %+v, %v", got, err)
	}
	for _, bad := range []string{"data", ":/data", "data:rel", "data:/d:rx", "a:/b:ro:x"} {
		if _, err := parseVolumeFlags([]string{bad}); err == nil {
			t.Errorf("--volume %q accepted", bad)
		}
	}
}

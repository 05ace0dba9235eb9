package main

import (
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/spf13/pflag"

	"github.com/spore-run/spore/internal/server"
)

// TestRegistryFlags: --allow-private-registry (repeatable) and
// --registry-auth-file reach the server's configuration; a registry that is
// not host[:port], and a credentials file others may read or that names
// credential helpers, are refused at start naming the flag.
func TestRegistryFlags(t *testing.T) {
	dir := t.TempDir()
	good := filepath.Join(dir, "auth.json")
	if err := os.WriteFile(good, []byte(`{"auths":{"registry.lan":{"username":"u","password":"p"}}}`), 0o600); err != nil {
		t.Fatal(err)
	}
	open := filepath.Join(dir, "open.json")
	if err := os.WriteFile(open, []byte(`{"auths":{}}`), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(open, 0o644); err != nil {
		t.Fatal(err)
	}
	helper := filepath.Join(dir, "helper.json")
	if err := os.WriteFile(helper, []byte(`{"credsStore":"desktop"}`), 0o600); err != nil {
		t.Fatal(err)
	}
	parse := func(args ...string) (server.Config, error) {
		var cfg server.Config
		f := pflag.NewFlagSet("node", pflag.ContinueOnError)
		check := addHostFlags(f, &cfg)
		if err := f.Parse(args); err != nil {
			return cfg, err
		}
		return cfg, check()
	}
	cfg, err := parse("--allow-private-registry=registry.lan", "--allow-private-registry=10.0.0.5:5000", "--registry-auth-file="+good)
	if err != nil || !slices.Equal(cfg.PrivateRegistries, []string{"registry.lan", "10.0.0.5:5000"}) || cfg.RegistryAuthFile != good {
		t.Fatalf("valid flags: %+v, %v", cfg, err)
	}
	for _, c := range []struct {
		args []string
		says string
	}{
		{[]string{"--allow-private-registry=http://registry.lan"}, "--allow-private-registry"},
		{[]string{"--allow-private-registry=registry.lan/repo"}, "--allow-private-registry"},
		{[]string{"--registry-auth-file=" + open}, "0600"},
		{[]string{"--registry-auth-file=" + helper}, "credential helpers"},
		{[]string{"--registry-auth-file=" + filepath.Join(dir, "none")}, "--registry-auth-file"},
	} {
		if _, err := parse(c.args...); err == nil || !strings.Contains(err.Error(), c.says) {
			t.Errorf("%v: %v, want an error saying %q", c.args, err, c.says)
		}
	}
}

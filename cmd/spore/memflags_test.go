package main

import (
	"strings"
	"testing"

	"github.com/spf13/pflag"

	"github.com/spore-run/spore/internal/server"
)

// TestMemoryFloorFlag: --memory-floor (MiB) sets the node's memory floor;
// its former name --memory-reserve still does; a size below -1 is refused
// at start naming the flag.
func TestMemoryFloorFlag(t *testing.T) {
	parse := func(args ...string) (server.Config, error) {
		var cfg server.Config
		f := pflag.NewFlagSet("node", pflag.ContinueOnError)
		check := addHostFlags(f, &cfg)
		if err := f.Parse(args); err != nil {
			return cfg, err
		}
		return cfg, check()
	}
	for args, want := range map[string]int64{"": 0, "--memory-floor=2048": 2048 << 20, "--memory-reserve=512": 512 << 20, "--memory-floor=-1": -1 << 20} {
		var a []string
		if args != "" {
			a = []string{args}
		}
		cfg, err := parse(a...)
		if err != nil || cfg.MemoryReserve != want {
			t.Errorf("%q: floor %d, %v; want %d", args, cfg.MemoryReserve, err, want)
		}
	}
	if _, err := parse("--memory-floor=-2"); err == nil || !strings.Contains(err.Error(), "--memory-floor") {
		t.Fatalf("--memory-floor=-2: %v, want an error naming the flag", err)
	}
}

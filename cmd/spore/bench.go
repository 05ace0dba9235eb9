package main

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"runtime/debug"
	"slices"
	"strings"
	"time"

	"github.com/spf13/cobra"

	"github.com/spore-run/spore/internal/bench"
	"github.com/spore-run/spore/internal/client"
	"github.com/spore-run/spore/internal/errdefs"
	"github.com/spore-run/spore/internal/node"
	"github.com/spore-run/spore/internal/nodeapi"
	"github.com/spore-run/spore/internal/server"
)

func newBenchCmd(f *cliFlags) *cobra.Command {
	var (
		local, quick, noBare                           bool
		count, densityMax, forkReps                    int
		localPool, localTargets, localBurst, localNets int
		forkLevels                                     []int
		sections                                       []string
		out, cgroupParent                              string
		rootfsDir, runsc                               string
		forkGap                                        time.Duration
	)
	cmd := &cobra.Command{
		Use:   "bench",
		Short: "Measure every operation, beside bare runsc, with scaling curves and density",
		Long: `Measure Spore as users meet it: every operation through the API, each beside
the bare runsc command it sits on (same run, same sandbox), fork and memory
scaling curves, create throughput with concurrent clients, and how many idle
sandboxes this host holds before a create is refused.

Against the server at SPORE_API_URL (bare runsc needs this host's --data-dir),
or self-contained with --local (a private server on a temporary data directory).
Writes report.json, report.md and PNG plots to --out.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if count < 0 || densityMax < 0 {
				return errors.New("--count and --density-max must not be negative")
			}
			for _, s := range sections {
				if !slices.Contains(bench.AllSections, s) {
					return fmt.Errorf("unknown section %q (known: %s)", s, strings.Join(bench.AllSections, ", "))
				}
			}
			if out == "" {
				out = "bench-" + time.Now().UTC().Format("20060102-150405")
			}
			cfg := bench.Config{
				Count: count, Quick: quick, Sections: sections, DensityMax: densityMax, CgroupParent: cgroupParent, ForkLevels: forkLevels, ForkGap: forkGap, ForkReps: forkReps,
				Progress: cmd.ErrOrStderr(), Command: "spore " + strings.Join(os.Args[1:], " "), Git: gitRevision(),
				Log: slog.New(slog.NewTextHandler(cmd.ErrOrStderr(), &slog.HandlerOptions{Level: slog.LevelWarn})),
			}
			ctx := cmd.Context()
			for _, n := range forkLevels {
				if n < 1 || n > 100 {
					return fmt.Errorf("--fork-levels: %d is outside 1..100", n)
				}
			}
			if localPool < 0 {
				return errors.New("--local-pool must not be negative")
			}
			if forkReps < 0 || forkReps > 20 {
				return fmt.Errorf("--fork-reps: %d is outside 0..20", forkReps)
			}
			if forkGap < 0 {
				return errors.New("--fork-gap must not be negative")
			}
			if localTargets < 0 {
				return errors.New("--local-restore-targets must not be negative")
			}
			if localBurst < 0 {
				return errors.New("--local-restore-targets-burst must not be negative")
			}
			if localNets < 0 {
				return errors.New("--local-reserved-networks must not be negative")
			}
			if local {
				return benchLocal(ctx, f, localPaths{rootfs: rootfsDir, runsc: runsc, pool: localPool, targets: localTargets, burst: localBurst, nets: localNets}, cfg, noBare, out, cmd)
			}
			c, err := f.client()
			if err != nil {
				return err
			}
			cfg.Client, cfg.Target = c, c.Base()
			cfg.PoolSize = -1 // unknown
			if !noBare {
				cfg.Bare = bareFor(f.g.dataDir, runsc, cmd)
			}
			return runBench(ctx, cfg, out, f.json, cmd)
		},
	}
	fl := cmd.Flags()
	fl.BoolVar(&local, "local", false, "start a private server on a temporary data directory and measure it")
	fl.BoolVar(&quick, "quick", false, "tiny counts and curves (a smoke test of the suite)")
	fl.BoolVar(&noBare, "no-bare", false, "skip the bare runsc comparisons")
	fl.IntVar(&count, "count", 0, "repetitions of each latency operation (default 20; 2 with --quick)")
	fl.IntVar(&densityMax, "density-max", 0, "stop the density fill at this many sandboxes (default: until a create is refused)")
	fl.IntSliceVar(&forkLevels, "fork-levels", nil, "the fork section's n (default 1,10,50,100)")
	fl.IntVar(&forkReps, "fork-reps", 0, "forks timed for each n > 1 (0: 3 for n ≤ 10, 1 above)")
	fl.DurationVar(&forkGap, "fork-gap", 0, "pause before each fork, so the server makes its restore targets again between forks (0: forks back to back)")
	fl.IntVar(&localTargets, "local-restore-targets", node.DefaultRestoreTargets, "restore targets per shape of the --local server (sandboxes booted ahead, waiting for an image; 0: none, every restore boots its sandbox)")
	fl.IntVar(&localBurst, "local-restore-targets-burst", node.DefaultRestoreTargetsBurst, "most restore targets the --local server keeps for a shape after a burst of restores of it, such as a fork (0: no growth)")
	fl.IntVar(&localNets, "local-reserved-networks", node.DefaultReservedNetworks, "sandbox networks the --local server keeps set up ahead of time, for restores that find no restore target (0: none)")
	fl.IntVar(&localPool, "local-pool", 2, "warm pool of the --local server (0: every create restores, as a fleet replica's default)")
	fl.StringSliceVar(&sections, "sections", nil, "run only these sections: "+strings.Join(bench.AllSections, ","))
	fl.StringVar(&out, "out", "", "directory for report.json, report.md and the plots (default ./bench-<time>)")
	fl.StringVar(&cgroupParent, "cgroup-parent", "/spore", "the server's cgroup parent (per-sandbox memory in the density section)")
	fl.StringVar(&rootfsDir, "rootfs-dir", "", "root filesystems of the --local server (default <data-dir>/rootfs)")
	fl.StringVar(&runsc, "runsc", "", "runsc binary (default <data-dir>/bin/runsc)")
	cmd.AddCommand(newBenchCompareCmd(), newBenchReadmeCmd())
	return cmd
}

func newBenchReadmeCmd() *cobra.Command {
	var (
		root  string
		check bool
	)
	cmd := &cobra.Command{
		Use:   "readme",
		Short: "Rewrite README.md's speed table from the reports docs/benchmarks/LATEST names",
		Long: `Render README.md's speed table (between its speed-table markers) from the
committed reports docs/benchmarks/LATEST names, and write it into README.md.
With --check, write nothing: print the difference and fail when it differs.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if check {
				diff, err := bench.ReadmeDiff(root)
				if err != nil || diff == "" {
					return err
				}
				fmt.Fprint(cmd.OutOrStdout(), diff)
				return errors.New("README.md's speed table is stale")
			}
			changed, err := bench.UpdateReadme(root)
			if err != nil {
				return err
			}
			state := "already up to date"
			if changed {
				state = "rewritten"
			}
			fmt.Fprintf(cmd.ErrOrStderr(), "spore bench readme: %s's speed table %s\n", filepath.Join(root, bench.ReadmeFile), state)
			return nil
		},
	}
	cmd.Flags().StringVar(&root, "root", ".", "the repository's root (holding README.md and docs/benchmarks)")
	cmd.Flags().BoolVar(&check, "check", false, "write nothing; print the difference and fail when the table is stale")
	return cmd
}

func newBenchCompareCmd() *cobra.Command {
	var names []string
	cmd := &cobra.Command{
		Use:   "compare A/report.json B/report.json",
		Short: "What run B adds to run A, operation by operation (p50, p95, mean) and curve by curve",
		Long: `Line up the operations and curve points two ` + "`spore bench`" + ` reports share and
print, as Markdown, what the second adds: e.g. a fleet (an API replica and a
remote node) against ` + "`spore bench --local`" + ` (the same code in one process).`,
		Args: cobra.ExactArgs(2),
		RunE: func(cmd *cobra.Command, args []string) error {
			a, err := bench.ReadReport(args[0])
			if err != nil {
				return err
			}
			b, err := bench.ReadReport(args[1])
			if err != nil {
				return err
			}
			if len(names) != 2 {
				return errors.New("--names wants two names")
			}
			return bench.WriteComparison(cmd.OutOrStdout(), names[0], names[1], bench.Compare(a, b))
		},
	}
	cmd.Flags().StringSliceVar(&names, "names", []string{"A", "B"}, "the two runs' names in the table")
	return cmd
}

// bareFor returns the bare-runsc runner for a server's data directory, or
// nil (the report says why) when this host cannot run it.
func bareFor(dataDir, runsc string, cmd *cobra.Command) *bench.Bare {
	if runsc == "" {
		runsc = filepath.Join(dataDir, "bin", "runsc")
	}
	b := &bench.Bare{Runsc: runsc, DataDir: dataDir}
	if err := b.Check(); err != nil {
		fmt.Fprintf(cmd.ErrOrStderr(), "spore bench: no bare runsc comparisons: %v\n", err)
		return nil
	}
	return b
}

// benchLocal runs the suite against a private server: its own temporary
// data directory, network prefix and cgroup parent, sharing this host's
// root filesystems and runsc.
type localPaths struct {
	rootfs, runsc string
	pool          int
	targets       int // restore targets per shape (0: none)
	burst         int // most targets per shape after a burst (0: no growth)
	nets          int // reserved networks (0: none)
}

func benchLocal(ctx context.Context, f *cliFlags, paths localPaths, cfg bench.Config, noBare bool, out string, cmd *cobra.Command) error {
	runsc := paths.runsc
	if runsc == "" {
		runsc = filepath.Join(f.g.dataDir, "bin", "runsc")
	}
	rootfs := paths.rootfs
	if rootfs == "" {
		rootfs = filepath.Join(f.g.dataDir, "rootfs")
	}
	if _, err := os.Stat(runsc); err != nil {
		return fmt.Errorf("runsc not installed (run `make setup` or `spore setup`): %w", err)
	}
	// One fixed directory, so a run that was killed outright is cleaned up
	// by the next one (the engine's lock refuses two runs at once).
	dir := filepath.Join(f.g.dataDir, "bench-local")
	nodeCfg := node.Config{DataDir: dir, RootFSDir: rootfs, Runsc: runsc,
		NetPrefix: "sbn", CgroupParent: "/spore-bench"}
	if _, err := os.Stat(dir); err == nil {
		fmt.Fprintln(cmd.ErrOrStderr(), "spore bench: cleaning up after an interrupted local run...")
		if err := teardownLocal(nodeCfg); err != nil {
			return err
		}
	}
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return err
	}
	defer func() {
		if err := teardownLocal(nodeCfg); err != nil {
			fmt.Fprintf(cmd.ErrOrStderr(), "spore bench: cleanup: %v\n", err)
		}
	}()
	sctx, stop := context.WithCancel(ctx)
	defer stop()
	ready := make(chan [2]string, 1)
	done := make(chan error, 1)
	pool := paths.pool
	go func() {
		done <- server.Run(sctx, server.Config{
			DataDir: dir, Listen: "127.0.0.1:0", RootFSDir: nodeCfg.RootFSDir, Runsc: runsc,
			NetPrefix: nodeCfg.NetPrefix, CgroupParent: nodeCfg.CgroupParent, PoolSize: pool, RestoreTargets: serverTargets(paths.targets), RestoreTargetsBurst: serverTargets(paths.burst), ReservedNetworks: serverTargets(paths.nets),
			// The host's admission check, not placement's overcommit
			// policy, ends the density fill: it measures the host.
			Overcommit: benchOvercommit,
			Logger:     slog.New(slog.NewTextHandler(cmd.ErrOrStderr(), &slog.HandlerOptions{Level: slog.LevelWarn})),
			Ready:      func(addr, key string) { ready <- [2]string{addr, key} },
		})
	}()
	fmt.Fprintln(cmd.ErrOrStderr(), "spore bench: starting a private server (templates build on first start)...")
	select {
	case a := <-ready:
		cfg.Target = "http://" + a[0]
		cfg.Client = client.New(cfg.Target, a[1])
	case err := <-done:
		return fmt.Errorf("local server: %w", err)
	case <-ctx.Done():
		return ctx.Err()
	}
	cfg.Local, cfg.PoolSize, cfg.CgroupParent = true, pool, "/spore-bench"
	cfg.RestoreTargets, cfg.RestoreTargetsBurst, cfg.ReservedNetworks = paths.targets, paths.burst, paths.nets
	cfg.Notes = append(cfg.Notes, fmt.Sprintf("the --local server ran with --memory-overcommit %g --cpu-overcommit %g (placement never refuses before the host's admission check)", benchOvercommit.Memory, benchOvercommit.VCPUs))
	if !noBare {
		b := &bench.Bare{Runsc: runsc, DataDir: dir}
		if err := b.Check(); err != nil {
			return err
		}
		cfg.Bare = b
	}
	berr := runBench(ctx, cfg, out, f.json, cmd)
	stop()
	if err := <-done; err != nil && berr == nil {
		berr = fmt.Errorf("local server: %w", err)
	}
	return berr
}

// serverTargets maps a flag's restore-target count (0: none) to the
// server's (0: its default, negative: none).
func serverTargets(n int) int {
	if n == 0 {
		return -1
	}
	return n
}

// benchOvercommit is the --local server's: high enough that placement
// never refuses before the host does (the defaults would stop the density
// fill at 80 default sandboxes on a 2-core host).
var benchOvercommit = nodeapi.Overcommit{Memory: 100, VCPUs: 1000}

// teardownLocal frees everything the private server left (its warm pool,
// anything a failed or killed run left running, networks, cgroups) and
// removes its data directory.
func teardownLocal(cfg node.Config) error {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	n, err := node.Open(ctx, cfg)
	if err != nil {
		return fmt.Errorf("open the local bench's node: %w", err)
	}
	var errs []error
	for _, sb := range n.Engine.List(ctx) {
		if err := n.Engine.Kill(ctx, sb.ID); err != nil && !errdefs.IsNotFound(err) {
			errs = append(errs, err)
		}
	}
	n.Close()
	errs = append(errs, n.Runtime.Purge(ctx), n.Net.Sweep(ctx, nil), n.Net.RemoveHostRules())
	if err := errors.Join(errs...); err != nil {
		return err
	}
	return os.RemoveAll(cfg.DataDir)
}

func runBench(ctx context.Context, cfg bench.Config, out string, asJSON bool, cmd *cobra.Command) error {
	rep, err := bench.Run(ctx, cfg)
	if err != nil {
		return err
	}
	if err := bench.WriteAll(out, rep); err != nil {
		return err
	}
	if err := bench.Validate(rep); err != nil {
		return fmt.Errorf("the report in %s is not valid: %w", out, err)
	}
	if asJSON {
		return printJSON(cmd.OutOrStdout(), rep)
	}
	if err := bench.WriteMarkdown(cmd.OutOrStdout(), rep); err != nil {
		return err
	}
	fmt.Fprintf(cmd.ErrOrStderr(), "spore bench: report in %s (report.json, report.md, plots)\n", out)
	return nil
}

// revision is the git commit this binary was built from (set by the
// Makefile's -ldflags; "-dirty" when the tree had changes).
var revision = ""

// gitRevision is the VCS revision this binary was built from.
func gitRevision() string {
	if revision != "" {
		return revision
	}
	bi, ok := debug.ReadBuildInfo()
	if !ok {
		return "unknown"
	}
	rev, dirty := "unknown", false
	for _, s := range bi.Settings {
		switch s.Key {
		case "vcs.revision":
			rev = s.Value
		case "vcs.modified":
			dirty = s.Value == "true"
		}
	}
	if dirty {
		rev += "-dirty"
	}
	return rev
}

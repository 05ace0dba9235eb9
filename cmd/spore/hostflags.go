package main

import (
	"fmt"
	"net/netip"
	"os"
	"time"

	"github.com/spf13/pflag"

	"github.com/spore-run/spore/internal/netaudit"
	"github.com/spore-run/spore/internal/netns"
	"github.com/spore-run/spore/internal/node"
	"github.com/spore-run/spore/internal/nodeapi/local"
	"github.com/spore-run/spore/internal/runtime/gvisor"
	"github.com/spore-run/spore/internal/scheduler"
	"github.com/spore-run/spore/internal/server"
)

// addHostFlags adds the flags of a host that runs sandboxes (`spore up`,
// `spore node`) and returns the function that checks them into cfg.
func addHostFlags(f *pflag.FlagSet, cfg *server.Config) func() error {
	var reserveMiB int64
	var egressFloor, egressDeny, dnsUpstreams []string
	var dnsPort int
	floorDefault := []string{}
	for _, p := range netns.DefaultFloor() {
		floorDefault = append(floorDefault, p.String())
	}
	f.StringVar(&cfg.RootFSDir, "rootfs-dir", "", "root filesystems (default <data-dir>/rootfs)")
	f.StringVar(&cfg.Runsc, "runsc", "", "runsc binary (default <data-dir>/bin/runsc)")
	f.StringVar(&cfg.EnvdBinary, "envd", "", "spore-envd binary (default: beside this binary)")
	f.StringVar(&cfg.NetPrefix, "net-prefix", "sp", "prefix of this server's network namespaces and interfaces")
	f.StringVar(&cfg.CgroupParent, "cgroup-parent", "/spore", "cgroup under which sandboxes run")
	f.Int64Var(&reserveMiB, "memory-floor", 0, "MiB of the host's MemAvailable kept for the host: a create, fork child, rollback or resume whose image's memory does not fit above it is refused with 429, and under it the node hibernates its least recently active sandboxes (0: 1024, -1: neither)")
	f.Int64Var(&reserveMiB, "memory-reserve", 0, "the former name of --memory-floor")
	_ = f.MarkHidden("memory-reserve")
	f.Float64Var(&cfg.Overcommit.Memory, "memory-overcommit", local.DefaultMemoryOvercommit, "placement may promise sandboxes' memory limits up to this many times the host's memory (less the reserve): limits are caps, an idle sandbox holds ~2 % of its limit")
	f.Float64Var(&cfg.Overcommit.VCPUs, "cpu-overcommit", local.DefaultCPUOvercommit, "placement may promise sandboxes' vCPU limits up to this many times the host's CPUs (a vCPU limit is a CPU quota: overcommit shares cores)")
	f.StringVar(&cfg.Cgroups, "cgroups", "runsc", "who manages sandboxes' cgroups: runsc, or driver (cgroup v1: ~15 ms faster starts and restores, but sandboxes see the host's memory and CPU count)")
	f.StringArrayVar(&cfg.RunscFlags, "runsc-flag", nil, "extra global runsc flag, repeatable (--runsc-flag=--debug --runsc-flag=--debug-log=/tmp/runsc/ shows runsc's own timeline)")
	f.StringSliceVar(&egressFloor, "egress-floor", floorDefault, "destinations (CIDRs) no sandbox reaches whatever its allowOut: replaces the default list; the host's own addresses are always added")
	f.StringSliceVar(&egressDeny, "egress-deny", nil, "more destinations (CIDRs) added to the egress floor")
	f.BoolVar(&cfg.NoIPv6, "no-ipv6", false, "give sandboxes IPv4 alone (by default they also get IPv6, NAT66'd through the host, when the host has IPv6)")
	f.IntVar(&cfg.RestoreTargets, "restore-targets", node.DefaultRestoreTargets, "sandboxes booted ahead of time, per shape that restores ask for, waiting for an image: a create from a snapshot, rollback or resume then pays only the image's load (0: none)")
	f.IntVar(&cfg.RestoreTargetsBurst, "restore-targets-burst", node.DefaultRestoreTargetsBurst, "most restore targets kept for a shape after a burst of restores of it (a fork's children, overlapping creates): its targets grow to the burst's size, up to this, until the shape goes 5 minutes without a restore (0 or at most --restore-targets: no growth)")
	f.IntVar(&cfg.ReservedNetworks, "reserved-networks", node.DefaultReservedNetworks, "sandbox networks set up ahead of time (namespaces, links, addresses) for the restores that find no restore target: a fork's children and concurrent creates then only write their policy's rules (0: none)")
	f.IntVar(&cfg.Launches, "launch-slots", 0, "boots and restores (creates, fork children, rollbacks, resumes) that run at once; the others wait, and a free slot goes to the waiting team with the fewest running, so one team's burst cannot starve another's creates (0: twice the CPUs, at least 4; -1: no bound)")
	f.Int64Var(&cfg.BackgroundLoadMB, "background-load", gvisor.DefaultBackgroundLoadBytes>>20, "MiB of memory from which a restore (create from a snapshot, rollback, resume, fork) returns before the memory is all loaded: the sandbox runs while the rest loads in the background (0: never)")
	f.StringSliceVar(&dnsUpstreams, "dns-upstream", nil, "resolvers (addr or addr:port) the sandboxes' DNS forwarder asks (default: the nameservers of /etc/resolv.conf)")
	var cacheMiB int64
	f.StringVar(&cfg.BlobStore, "blob-store", os.Getenv("SPORE_BLOB_STORE"), "where snapshots are made durable and shared between nodes: none, /abs/dir (file:///abs/dir), or s3://BUCKET[/PREFIX][?endpoint=URL&region=R&path-style=true] with credentials from AWS_ACCESS_KEY_ID/AWS_SECRET_ACCESS_KEY or a profile (default: $SPORE_BLOB_STORE, else <data-dir>/blobs for spore up and none for spore node)")
	f.Int64Var(&cacheMiB, "chunk-cache-size", 0, "MiB of snapshot chunks the node keeps in <data-dir>/chunk-cache for restores and peers (0: 10240)")
	f.StringArrayVar(&cfg.InsecureRegistries, "insecure-registry", nil, "registry (host or host:port) this node pulls images from over plain HTTP, repeatable; every other registry only over HTTPS. Implies --allow-private-registry")
	f.StringArrayVar(&cfg.PrivateRegistries, "allow-private-registry", nil, "registry, or storage host a registry redirects to (host or host:port), that image pulls and pushes may reach at an address in the egress floor (private, loopback, link-local, this host's), repeatable; every other such address is refused")
	f.StringVar(&cfg.RegistryAuthFile, "registry-auth-file", "", "registry credentials for image pulls that bring none: Docker's config.json form ({\"auths\": {\"HOST\": {\"auth\": base64(user:password)}}}), mode 0600, read at every pull; the host's own Docker credentials are never used")
	f.DurationVar(&cfg.EgressRetention, "egress-retention", netaudit.DefaultRetention, "how long a sandbox's egress audit (every outbound connection attempt; `spore logs --egress`) is kept on its node after its last entry")
	f.StringArrayVar(&cfg.EgressCAFiles, "egress-upstream-ca", nil, "PEM file of certificates the egress proxy trusts, beside the host's roots, for the upstreams of the HTTPS requests it injects credentials into (network rules), repeatable")
	f.IntVar(&dnsPort, "dns-port", 0, "port of the sandboxes' DNS forwarder on the host side of their links (0: the one used last, else a free one)")
	return func() error {
		if reserveMiB < -1 {
			return fmt.Errorf("--memory-floor must be -1 (none) or a size in MiB, got %d", reserveMiB)
		}
		cfg.MemoryReserve = reserveMiB << 20
		if cfg.Launches < -1 {
			return fmt.Errorf("--launch-slots must be -1 (no bound), 0 (the default) or more, got %d", cfg.Launches)
		}
		if cfg.RestoreTargets < 0 {
			return fmt.Errorf("--restore-targets must be 0 (none) or more, got %d", cfg.RestoreTargets)
		}
		cfg.RestoreTargets = serverTargets(cfg.RestoreTargets)
		if cfg.RestoreTargetsBurst < 0 {
			return fmt.Errorf("--restore-targets-burst must be 0 (no growth) or more, got %d", cfg.RestoreTargetsBurst)
		}
		cfg.RestoreTargetsBurst = serverTargets(cfg.RestoreTargetsBurst)
		if cfg.ReservedNetworks < 0 {
			return fmt.Errorf("--reserved-networks must be 0 (none) or more, got %d", cfg.ReservedNetworks)
		}
		cfg.ReservedNetworks = serverTargets(cfg.ReservedNetworks)
		switch {
		case cfg.BackgroundLoadMB < 0:
			return fmt.Errorf("--background-load must be 0 (never) or a size in MiB, got %d", cfg.BackgroundLoadMB)
		case cfg.BackgroundLoadMB == 0:
			cfg.BackgroundLoadMB = -1
		}
		for _, oc := range []struct {
			name string
			v    float64
		}{{"--memory-overcommit", cfg.Overcommit.Memory}, {"--cpu-overcommit", cfg.Overcommit.VCPUs}} {
			if !(oc.v >= 0.1 && oc.v <= scheduler.MaxOvercommit) {
				return fmt.Errorf("%s must be a ratio from 0.1 to %d, got %g", oc.name, scheduler.MaxOvercommit, oc.v)
			}
		}
		floor, err := netns.ParsePrefixes(egressFloor)
		if err != nil {
			return fmt.Errorf("--egress-floor: %w", err)
		}
		extra, err := netns.ParsePrefixes(egressDeny)
		if err != nil {
			return fmt.Errorf("--egress-deny: %w", err)
		}
		// Never nil: an empty --egress-floor means no floor but the host's addresses.
		cfg.EgressFloor = append(append([]netip.Prefix{}, floor...), extra...)
		if cfg.DNSUpstreams, err = node.ParseUpstreams(dnsUpstreams); err != nil {
			return err
		}
		if dnsPort < 0 || dnsPort > 65535 {
			return fmt.Errorf("--dns-port must be 0-65535, got %d", dnsPort)
		}
		cfg.DNSPort = uint16(dnsPort)
		if _, err := node.ParseInsecureRegistries(cfg.InsecureRegistries); err != nil {
			return fmt.Errorf("--insecure-registry: %w", err)
		}
		if _, err := node.ParsePrivateRegistries(cfg.PrivateRegistries); err != nil {
			return fmt.Errorf("--allow-private-registry: %w", err)
		}
		if cfg.RegistryAuthFile != "" {
			if _, err := node.LoadRegistryAuth(cfg.RegistryAuthFile); err != nil {
				return fmt.Errorf("--registry-auth-file: %w", err)
			}
		}
		if cfg.EgressRetention < time.Minute {
			return fmt.Errorf("--egress-retention must be at least 1m, got %v", cfg.EgressRetention)
		}
		if cacheMiB < 0 {
			return fmt.Errorf("--chunk-cache-size must be a size in MiB, got %d", cacheMiB)
		}
		cfg.ChunkCacheBytes = cacheMiB << 20
		return nil
	}
}

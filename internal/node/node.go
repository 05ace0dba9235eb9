// Package node wires one host's pieces into a working node: the gVisor
// runtime, per-instance networks, the snapshot repository, the engine,
// the in-sandbox daemon (installed into the data directory and bound into
// every sandbox) and the default templates.
package node

import (
	"context"
	"crypto/sha256"
	"crypto/x509"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/spore-run/spore/internal/blob"
	"github.com/spore-run/spore/internal/chunk"
	"github.com/spore-run/spore/internal/dnsfwd"
	"github.com/spore-run/spore/internal/egress"
	"github.com/spore-run/spore/internal/engine"
	"github.com/spore-run/spore/internal/envdclient"
	"github.com/spore-run/spore/internal/netaudit"
	"github.com/spore-run/spore/internal/netns"
	"github.com/spore-run/spore/internal/nodeapi"
	"github.com/spore-run/spore/internal/rootfs"
	"github.com/spore-run/spore/internal/runtime"
	"github.com/spore-run/spore/internal/runtime/gvisor"
	"github.com/spore-run/spore/internal/setup"
	"github.com/spore-run/spore/internal/snapshot"
	"github.com/spore-run/spore/internal/snapsync"
)

// Config configures a node.
type Config struct {
	DataDir string // /var/lib/spore
	// RootFSDir overrides <DataDir>/rootfs (tests share one).
	RootFSDir string
	// OwnRootFS says no other node uses RootFSDir, so this node may remove
	// the root filesystem builds kept there that it does not need
	// (PruneVersions); implied for the default directory. In a directory
	// several nodes share (a fleet on one host), a node cannot know what
	// the others need, and kept builds stay.
	OwnRootFS bool
	// Runsc overrides <DataDir>/bin/runsc.
	Runsc string
	// EnvdBinary is the spore-envd to install (default: beside the running
	// executable).
	EnvdBinary string
	// VolumePoolBytes is the volume pool's size (a sparse image: bytes
	// are used as volumes fill; 0: the data directory's file system's).
	VolumePoolBytes int64
	// NetPrefix names the node's network objects (default "sp").
	NetPrefix string
	// CgroupParent for instances (default "/spore").
	CgroupParent string
	// Cgroups is who manages instances' cgroups: "runsc" (default) or
	// "driver" (faster on cgroup v1; see gvisor.Config.Cgroups).
	Cgroups string
	// RunscFlags are extra global runsc flags ("--debug",
	// "--debug-log=/tmp/runsc/" to see runsc's own timeline).
	RunscFlags []string
	// MemoryReserve is the memory floor: host memory new sandboxes may
	// not use, and under which the node hibernates its coldest sandboxes
	// (see engine.Config.MemoryReserve; 0: the default, negative: none).
	MemoryReserve int64
	// MemoryPressureEvery is how often MemAvailable is compared with the
	// floor (pressure.go; 0: DefaultMemoryPressureEvery, negative: never).
	MemoryPressureEvery time.Duration
	// MemoryMargin is how far above the floor a relief brings MemAvailable
	// back (engine.Config.MemoryMargin; 0: the engine's default).
	MemoryMargin int64
	// EgressFloor is what no sandbox reaches whatever its policy (nil:
	// netns.DefaultFloor; the host's addresses are always added).
	EgressFloor []netip.Prefix
	// NoIPv6 keeps sandboxes on IPv4 alone (netns.Config.NoIPv6); without
	// it they get IPv6 when the host has it.
	NoIPv6 bool
	// RestoreTargets is how many restore targets the engine keeps per
	// shape restores ask for (engine.Config.RestoreTargets): 0 means
	// DefaultRestoreTargets, negative none.
	RestoreTargets int
	// RestoreTargetsBurst is the most restore targets a shape keeps after
	// a burst of restores of it (engine.Config.RestoreTargetsBurst): 0
	// means DefaultRestoreTargetsBurst, negative no growth.
	RestoreTargetsBurst int
	// Launches is how many boots and restores run at once, shared between
	// teams in turn (engine.Config.Launches): 0 means
	// engine.DefaultLaunches(), negative no bound.
	Launches int
	// ReservedNetworks is how many sandbox networks the engine keeps set
	// up ahead of time for restores that find no restore target
	// (engine.Config.ReservedNetworks): 0 means DefaultReservedNetworks,
	// negative none.
	ReservedNetworks int
	// BackgroundLoadMB: restores of images with at least this many MiB of
	// memory return before it is all loaded (gvisor.Config
	// .BackgroundLoadBytes): 0 means the driver's default, negative never.
	BackgroundLoadMB int64
	// DNSUpstreams are the resolvers the sandboxes' DNS forwarder asks
	// (default: the nameservers of the host's /etc/resolv.conf).
	DNSUpstreams []netip.AddrPort
	// DNSPort is the forwarder's port on the host ends (0: the port
	// recorded in the data directory, else a free one).
	DNSPort uint16
	// Blobs is the blob store snapshots are made durable in and fetched
	// from (nil: none; snapshots stay on this node's disk).
	Blobs blob.Store
	// ChunkCacheBytes bounds the node's chunk cache (<DataDir>/chunk-cache;
	// 0: DefaultChunkCacheBytes).
	ChunkCacheBytes int64
	// PeerClient reaches this node's peers (their chunk and manifest
	// handlers) as a member of the fleet (fleetauth); nil: none are asked.
	PeerClient *http.Client
	// InsecureRegistries are the registries (host or host:port) this
	// node pulls images from over plain HTTP; every other registry only
	// over HTTPS (see BuildImage).
	InsecureRegistries []string
	// PrivateRegistries are the registries (host or host:port) this node
	// may reach at an address in its egress floor (a LAN or loopback
	// registry, or a storage host one redirects to); InsecureRegistries
	// are included. Every other is refused there (see BuildImage).
	PrivateRegistries []string
	// RegistryAuthFile holds the operator's registry credentials, used by
	// pulls that bring none (LoadRegistryAuth; "": none). The host's own
	// Docker credentials are never used.
	RegistryAuthFile string
	// EgressRetention is how long a sandbox's egress audit journal
	// (<DataDir>/egress-audit) is kept after its last entry (0:
	// netaudit.DefaultRetention).
	EgressRetention time.Duration
	// EgressCAFiles are PEM files of certificates the egress proxy trusts
	// beside the host's roots when it verifies the upstreams of the HTTPS
	// requests it injects headers into (an internal CA).
	EgressCAFiles []string
	Logger        *slog.Logger
}

// DefaultChunkCacheBytes bounds a node's chunk cache by default.
const DefaultChunkCacheBytes = 10 << 30

// envdMountPoint is where the in-sandbox daemon's directory is bound.
const envdMountPoint = "/opt/spore"

// Node is a running node.
type Node struct {
	Engine  *engine.Engine
	Runtime *gvisor.Driver
	Net     *netns.Manager
	Envd    *envdclient.Client
	// Sync moves snapshots to and from the blob store (nil without one).
	Sync *snapsync.Syncer
	// Audit is the egress audit journal: every outbound connection
	// attempt of the node's sandboxes.
	Audit       *netaudit.Journal
	stopSweep   chan struct{}
	stopMemory  func() // the memory pressure relief (pressure.go)
	rootfsDir   string
	CPUFeatures []string
	envdDir     string
	dns         *dnsfwd.Forwarder
	egress      *egress.Proxy
	reg         *registries // how image registries are reached
	blobs       blob.Store  // cfg.Blobs (nil: none)
	versions    *versions   // the root filesystem and runsc builds kept (versions.go)
	exportDir   string      // <DataDir>/exports: the only place an export writes a layout
	vols        *volumes    // the volume slots and pool (volumes.go)
	log         *slog.Logger
}

// Open wires the node and recovers its sandboxes.
func Open(ctx context.Context, cfg Config) (*Node, error) {
	dataDir, err := filepath.Abs(cfg.DataDir)
	if err != nil {
		return nil, err
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	reg, err := newRegistries(cfg)
	if err != nil {
		return nil, err
	}
	if cfg.RootFSDir == "" {
		cfg.RootFSDir, cfg.OwnRootFS = setup.RootFSDir(dataDir), true
	}
	if cfg.Runsc == "" {
		cfg.Runsc = setup.RunscPath(dataDir)
	}
	if cfg.EnvdBinary == "" {
		exe, err := os.Executable()
		if err != nil {
			return nil, err
		}
		cfg.EnvdBinary = filepath.Join(filepath.Dir(exe), "spore-envd")
	}
	tuneHost(cfg.Logger)
	envdDir, err := installEnvd(cfg.EnvdBinary, filepath.Join(dataDir, "envd"))
	if err != nil {
		return nil, fmt.Errorf("install envd: %w", err)
	}
	drv, err := gvisor.New(ctx, gvisor.Config{
		Runsc: cfg.Runsc, StateDir: filepath.Join(dataDir, "runtime"), BuildsDir: setup.RunscBuildsDir(dataDir), CgroupParent: cfg.CgroupParent, Logger: cfg.Logger,
		ExtraFlags: cfg.RunscFlags, Cgroups: cfg.Cgroups, BackgroundLoadBytes: cfg.BackgroundLoadMB << 20,
	})
	if err != nil {
		return nil, err
	}
	if st, err := rootfs.Lookup(cfg.RootFSDir, "base"); err == nil && st.Revision < rootfs.BaseSpec().Revision {
		cfg.Logger.Warn("the base root filesystem predates this build (sandboxes may lack name resolution); run `spore setup`", "revision", st.Revision, "want", rootfs.BaseSpec().Revision)
	}
	upstreams := cfg.DNSUpstreams
	if len(upstreams) == 0 {
		if upstreams, err = HostResolvers("/etc/resolv.conf"); err != nil || len(upstreams) == 0 {
			cfg.Logger.Warn("no DNS upstream (none given, none in /etc/resolv.conf): names do not resolve in sandboxes", "err", err)
		}
	}
	sockets, err := listenDNS(filepath.Join(dataDir, "dns-port"), cfg.DNSPort, cfg.Logger)
	if err != nil {
		return nil, err
	}
	// The egress proxy resolves allowed names through the same upstreams
	// as the sandboxes' forwarder, from the root namespace.
	journal, err := netaudit.OpenJournal(filepath.Join(dataDir, "egress-audit"), cfg.EgressRetention)
	if err != nil {
		sockets.Close()
		return nil, err
	}
	aud := &auditor{j: journal, log: cfg.Logger}
	roots, err := upstreamRoots(cfg.EgressCAFiles)
	if err != nil {
		return nil, err
	}
	proxy := egress.New(egress.Config{Upstreams: upstreams, Logger: cfg.Logger, Audit: aud.proxied, RootCAs: roots})
	nm, err := netns.New(ctx, netns.Config{Prefix: cfg.NetPrefix, StateDir: filepath.Join(dataDir, "net"), Logger: cfg.Logger,
		Floor: cfg.EgressFloor, DNSPort: sockets.port, Egress: proxy, Audit: aud, NoIPv6: cfg.NoIPv6})
	if err != nil {
		proxy.Close()
		sockets.Close()
		return nil, err
	}
	fwd, err := dnsfwd.Serve(dnsfwd.Config{Upstreams: upstreams, Policy: dnsPolicy(nm), Logger: cfg.Logger}, sockets.udp, sockets.tcp)
	if err != nil {
		proxy.Close()
		sockets.Close()
		return nil, err
	}
	repo, err := snapshot.Open(filepath.Join(dataDir, "snapshots"))
	if err != nil {
		fwd.Close()
		proxy.Close()
		return nil, err
	}
	client := envdclient.New()
	vols := openVolumes(ctx, dataDir, cfg.VolumePoolBytes, cfg.Logger)
	eng, err := engine.Open(ctx, engine.Config{
		Dir: filepath.Join(dataDir, "engine"), RootFSDir: cfg.RootFSDir,
		Runtime: drv, Snapshots: repo, Logger: cfg.Logger, Network: nm, Init: client, Volumes: vols,
		MemoryReserve: cfg.MemoryReserve, MemoryMargin: cfg.MemoryMargin, RestoreTargets: orDefault(cfg.RestoreTargets, DefaultRestoreTargets),
		RestoreTargetsBurst: orDefault(cfg.RestoreTargetsBurst, DefaultRestoreTargetsBurst),
		ReservedNetworks:    orDefault(cfg.ReservedNetworks, DefaultReservedNetworks),
		Launches:            cfg.Launches,
	})
	if err != nil {
		vols.close()
		fwd.Close()
		proxy.Close()
		return nil, err
	}
	n := &Node{Engine: eng, Runtime: drv, Net: nm, Envd: client, envdDir: envdDir, dns: fwd, egress: proxy, Audit: journal, log: cfg.Logger, CPUFeatures: HostCPUFeatures(),
		exportDir: filepath.Join(dataDir, "exports"),
		rootfsDir: cfg.RootFSDir, reg: reg, blobs: cfg.Blobs, vols: vols}
	n.versions = &versions{n: n, pruneTrees: cfg.OwnRootFS}
	if _, err := n.PruneVersions(ctx); err != nil {
		n.log.Warn("prune the versions nothing needs", "err", err)
	}
	n.stopSweep = make(chan struct{})
	n.stopMemory = n.watchMemory(cfg.MemoryPressureEvery)
	go n.sweepAudit(n.stopSweep)
	go n.pruneVersionsEvery(pruneEvery, n.stopSweep)
	if cfg.Blobs != nil {
		if n.Sync, err = openSync(dataDir, cfg, repo, drv.Name(), n); err != nil {
			n.Close()
			return nil, err
		}
	}
	return n, nil
}

// openSync sets up the node's way to the blob store: its chunk cache and
// a syncer that rewrites a fetched snapshot's daemon mount for this node.
func openSync(dataDir string, cfg Config, repo *snapshot.Repo, runtimeName string, n *Node) (*snapsync.Syncer, error) {
	size := cfg.ChunkCacheBytes
	if size <= 0 {
		size = DefaultChunkCacheBytes
	}
	cache, err := chunk.OpenCache(filepath.Join(dataDir, "chunk-cache"), size)
	if err != nil {
		return nil, fmt.Errorf("chunk cache: %w", err)
	}
	return snapsync.New(snapsync.Config{
		Repo: repo, Store: cfg.Blobs, Cache: cache, PeerClient: cfg.PeerClient,
		Runtime: runtimeName, CPUFeatures: n.CPUFeatures, Log: cfg.Logger, Deps: n.versions,
		RootFSBuild: func(name string) (string, error) {
			st, err := rootfs.Lookup(cfg.RootFSDir, name)
			return st.ID, err
		},
		Localize: func(m *snapshot.Manifest) {
			for i := range m.Run.Mounts {
				if m.Run.Mounts[i].Destination == envdMountPoint {
					m.Run.Mounts[i].Source = n.envdDir
				}
			}
			n.vols.localize(m)
		},
	})
}

// HostCPUFeatures returns the CPU flags of /proc/cpuinfo (a checkpoint
// may rely on any of them; a restore needs them all), sorted.
func HostCPUFeatures() []string {
	b, err := os.ReadFile("/proc/cpuinfo")
	if err != nil {
		return nil
	}
	for _, line := range strings.Split(string(b), "\n") {
		k, v, ok := strings.Cut(line, ":")
		if ok && strings.TrimSpace(k) == "flags" {
			f := strings.Fields(v)
			slices.Sort(f)
			return slices.Compact(f)
		}
	}
	return nil
}

// Close releases the node; sandboxes keep running (without name
// resolution until the node is back).
//
// When no sandbox network is left, the root namespace's table goes too:
// nothing needs its masquerading any more, and its rule for the DNS
// forwarder's port would keep naming a port the forwarder no longer holds
// (another program may take it). Sandboxes left running keep it (the
// node re-attaches them at its next start).
func (n *Node) Close() error {
	if n.stopMemory != nil {
		n.stopMemory()
	}
	if n.stopSweep != nil {
		close(n.stopSweep)
	}
	// Sandboxes outlive the node's process (the next one reattaches them):
	// their volumes stay mounted unless none is left.
	idle := len(n.Engine.List(context.Background())) == 0
	err := errors.Join(n.Engine.Close(), n.dns.Close(), n.egress.Close())
	if idle {
		err = errors.Join(err, n.vols.close())
	}
	n.Net.Close()
	if nets, lerr := n.Net.List(); lerr == nil && len(nets) == 0 {
		err = errors.Join(err, n.Net.RemoveHostRules())
	}
	return err
}

// EgressLog returns the egress proxy's recent decisions on a sandbox's
// connections to ports 80 and 443 while its policy has domain entries
// (oldest first; at most egress.RingSize, kept while its instance runs).
func (n *Node) EgressLog(ctx context.Context, id string) ([]egress.Record, error) {
	sb, err := n.Engine.Get(ctx, id)
	if err != nil {
		return nil, err
	}
	return n.egress.Log(sb.Instance), nil
}

// EnvdDir is the installed daemon's directory (bound at /opt/spore).
func (n *Node) EnvdDir() string { return n.envdDir }

// installEnvd copies the daemon binary into a directory named by its
// content, so a snapshot keeps the daemon build it was taken with and a
// new build makes new templates.
func installEnvd(bin, root string) (string, error) {
	f, err := os.Open(bin)
	if err != nil {
		return "", fmt.Errorf("%s (run `make build`): %w", bin, err)
	}
	defer f.Close()
	h := sha256.New()
	if _, err := io.Copy(h, f); err != nil {
		return "", err
	}
	dir := filepath.Join(root, hex.EncodeToString(h.Sum(nil))[:16])
	dst := filepath.Join(dir, "bin", "spore-envd")
	if _, err := os.Stat(dst); err == nil {
		return dir, nil
	}
	if err := os.MkdirAll(filepath.Dir(dst), 0o755); err != nil {
		return "", err
	}
	if _, err := f.Seek(0, io.SeekStart); err != nil {
		return "", err
	}
	tmp, err := os.CreateTemp(filepath.Dir(dst), ".envd-*")
	if err != nil {
		return "", err
	}
	defer os.Remove(tmp.Name())
	if _, err := io.Copy(tmp, f); err != nil {
		tmp.Close()
		return "", err
	}
	tmp.Chmod(0o755)
	if err := tmp.Close(); err != nil {
		return "", err
	}
	return dir, os.Rename(tmp.Name(), dst)
}

// Template names every node builds (nodeapi.BuiltinTemplates).
const (
	TemplateBase            = nodeapi.TemplateBase
	TemplateCodeInterpreter = nodeapi.TemplateCodeInterpreter
)

// TemplateSpecs are the default templates: the daemon as init, ready once
// it answers; the code interpreter's with a Python context already warm
// (its kernel is in the snapshot, so the first runCode is instant).
func (n *Node) TemplateSpecs() []engine.TemplateSpec {
	run := snapshot.RunConfig{
		Args: []string{"/opt/spore/bin/spore-envd"},
		Env:  []string{"PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"},
		Cwd:  "/",
		User: runtime.User{UID: 0, GID: 0},
		// /dev/shm gets half the memory, as Linux sizes it by default.
		Limits: runtime.Limits{VCPUs: 2, MemoryMB: 1024, MaxProcs: 1024, DiskMB: 4096, ShmMB: 512},
		Mounts: append([]runtime.Mount{{Source: n.envdDir, Destination: envdMountPoint, ReadOnly: true}}, n.vols.slots()...),
	}
	if n.Runtime.MemoryAlerts() {
		// The runtime tells envd when memory rises: its OOM watchdog may
		// poll rarely while memory is low (each poll wakes the sandbox).
		run.Args = append(run.Args, "-oom-watch-idle=60s")
		run.MemoryAlertSignal = "USR2"
	}
	return []engine.TemplateSpec{
		{Name: TemplateBase, Run: run, Ready: []string{"/opt/spore/bin/spore-envd", "-health"}},
		{Name: TemplateCodeInterpreter, Run: run, Ready: []string{"/bin/sh", "-c",
			`/opt/spore/bin/spore-envd -health && curl -sf -X POST http://127.0.0.1:49999/execute -d '{"code":"1"}' >/dev/null`}},
	}
}

// EnsureTemplates builds the default templates that are missing or stale.
func (n *Node) EnsureTemplates(ctx context.Context) error {
	for _, spec := range n.TemplateSpecs() {
		m, built, err := n.Engine.EnsureTemplate(ctx, spec)
		if err != nil {
			return fmt.Errorf("template %s: %w", spec.Name, err)
		}
		n.log.Info("template ready", "template_id", spec.Name, "snapshot_id", m.ID, "built", built)
	}
	// A rebuilt template may have been what kept an old version.
	if _, err := n.PruneVersions(ctx); err != nil {
		n.log.Warn("prune the versions nothing needs", "err", err)
	}
	return nil
}

// pidMax is the kernel.pid_max a node wants: the 64-bit kernel's maximum.
// Each gVisor sandbox runs ~40 host threads, so the default 32768 caps a
// host at ~800 sandboxes whatever its memory (measured).
const pidMax = 4194304

// tuneHost raises kernel.pid_max when it is lower (as container hosts do).
// A failure is logged: the engine's admission check still keeps the host
// from running out of tasks.
func tuneHost(log *slog.Logger) {
	const p = "/proc/sys/kernel/pid_max"
	b, err := os.ReadFile(p)
	if err != nil {
		return
	}
	if cur, err := strconv.Atoi(strings.TrimSpace(string(b))); err != nil || cur >= pidMax {
		return
	}
	if err := os.WriteFile(p, []byte(strconv.Itoa(pidMax)), 0o644); err != nil {
		log.Warn("raise kernel.pid_max", "err", err)
		return
	}
	log.Info("raised kernel.pid_max for sandbox density", "pid_max", pidMax)
}

// upstreamRoots are the host's roots plus the certificates in files.
func upstreamRoots(files []string) (*x509.CertPool, error) {
	if len(files) == 0 {
		return nil, nil // the host's
	}
	pool, err := x509.SystemCertPool()
	if err != nil {
		pool = x509.NewCertPool()
	}
	for _, f := range files {
		b, err := os.ReadFile(f)
		if err != nil {
			return nil, fmt.Errorf("egress CA file: %w", err)
		}
		if !pool.AppendCertsFromPEM(b) {
			return nil, fmt.Errorf("egress CA file %s: no PEM certificate in it", f)
		}
	}
	return pool, nil
}

// DefaultRestoreTargets is how many restore targets a node keeps per
// shape. One served restores spaced by more than a target's fill (~60 ms
// of boot after the previous restore answered); a restore that came
// sooner (a create right after a kill, a rollback after a rollback)
// waited for the fill, ~30 ms at p50 in the bench. With two, the second
// is ready while the first is made again. An idle target holds 12-18 MB
// (its cgroup's memory), so two cost at most ~140 MB over the 4 shapes
// kept.
const DefaultRestoreTargets = 2

// DefaultRestoreTargetsBurst is the most restore targets a node keeps for
// a shape after a burst of restores of it (a fork's children, overlapping
// creates), until the shape has gone engine.DefaultTargetBurstIdle without
// a restore. A fork of 10 that finds 10 targets took 358.6 ms against
// 552.8 ms with 2, a fork of 100 that finds 16 5.59 s against 6.43 s
// (pools of a fixed size, p50 of 3, forks 4 s apart: docs/benchmarks.md).
// Sixteen idle targets hold ~300 MB.
const DefaultRestoreTargetsBurst = 16

// DefaultReservedNetworks is how many sandbox networks a node keeps set up
// ahead of time: a fork of 16 sets up none on its path. Each holds two
// network namespaces, two veth pairs and the egress proxy's listeners, a
// few hundred KiB of the kernel's memory.
const DefaultReservedNetworks = 16

// orDefault maps a configured count to the engine's: 0 is def, negative
// none.
func orDefault(n, def int) int {
	switch {
	case n == 0:
		return def
	case n < 0:
		return 0
	}
	return n
}

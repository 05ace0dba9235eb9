package metrics

import (
	"context"
	"strconv"

	"github.com/prometheus/client_golang/prometheus"
)

// LaunchLoad is an engine's launch slots now (engine.LaunchLoad).
type LaunchLoad struct{ Slots, Running, Queued int }

// HostFigures are what a host that runs an engine (a node agent, spore
// up) shows at a scrape, read then from the engine and the node's
// snapshot sync.
type HostFigures struct {
	Launch LaunchLoad
	// Sandboxes by state as the engine holds them.
	Sandboxes map[string]int
	// MemoryFree is the memory the host has for new sandboxes (its
	// MemAvailable less the floor and what launches in flight hold);
	// nil when the engine admits by nothing.
	MemoryFree *int64
	// RestoreTargets are the idle instances kept for restores.
	RestoreTargets int
	// PendingCleanups and Quarantined: the node's housekeeping (GET
	// /debug/stats).
	PendingCleanups, Quarantined int
	// RefusedMemory and RefusedTasks count the launches admission
	// refused since the engine started.
	RefusedMemory, RefusedTasks int64
	// Cache is the node's chunk cache; nil without a blob store.
	Cache *CacheFigures
	// Fetch is what its fetches of snapshots did; nil without a blob
	// store.
	Fetch *FetchFigures
	// Egress is what its egress proxy's connections came to; nil
	// without one.
	Egress *EgressFigures
}

// EgressFigures are a host's egress proxy connections since it started
// (egress.Totals).
type EgressFigures struct {
	Connections            map[string]int64 // by outcome: allowed, or the refusal's reason
	Injected, HostMismatch int64
	BytesOut, BytesIn      int64
}

// CacheFigures are a chunk cache's size now.
type CacheFigures struct {
	Bytes, MaxBytes int64
	Chunks          int
}

// FetchFigures are a node's snapshot fetches since it started
// (snapsync.FetchTotals).
type FetchFigures struct {
	Fetched, Failed                      int64
	FromCache, FromPeer, FromStore, Zero int64
	PeerBytes, StoreBytes, Corrupt       int64
}

var (
	dLaunchSlots   = desc("engine_launch_slots", "This host's launch slots (0: no bound).")
	dLaunchRunning = desc("engine_launches_running", "Launches (boots, restores) holding a slot on this host now.")
	dLaunchQueued  = desc("engine_launches_queued", "Launches waiting for a slot on this host now.")
	dHostSandboxes = desc("host_sandboxes", "Sandboxes this host's engine holds, by state.", "state")
	dHostFree      = desc("host_memory_free_bytes", "Memory this host has for new sandboxes: MemAvailable less its floor and what launches in flight hold.")
	dHostTargets   = desc("host_restore_targets", "Idle instances this host keeps ready for restores.")
	dHostCleanups  = desc("host_pending_cleanups", "Instances and snapshots this host has yet to free (retried; normally 0).")
	dEgressConns   = desc("egress_connections_total", "Connections from this host's sandboxes through its egress proxy (domain rules, injections), by outcome: allowed, or why refused.", "outcome")
	dEgressBytes   = desc("egress_bytes_total", "Bytes relayed by this host's egress proxy, by direction (out: sandbox to upstream).", "direction")
	dEgressInject  = desc("egress_injected_connections_total", "Allowed connections whose requests got injected credentials.")
	dEgressMismat  = desc("egress_host_mismatch_total", "Intercepted connections refused for a request naming another host than the TLS server name.")
	dHostQuarantn  = desc("host_quarantined_records", "Sandbox records this host set aside at start, unreadable.")
	dHostRefused   = desc("host_admission_refusals_total", "Launches (creates, restores, fork children, restore targets) this host's admission refused since it started, by what it lacked.", "reason")
	dCacheBytes    = desc("host_chunk_cache_bytes", "Bytes in this host's chunk cache.")
	dCacheMax      = desc("host_chunk_cache_capacity_bytes", "This host's chunk cache's capacity.")
	dCacheChunks   = desc("host_chunk_cache_chunks", "Chunks in this host's chunk cache.")
	dFetches       = desc("host_snapshot_fetches_total", "Snapshots this host fetched to restore them, by outcome.", "outcome")
	dFetchChunks   = desc("host_chunk_fetches_total", "Chunks this host's snapshot fetches took, by tier (cache, peer, store; zero: written without a fetch).", "tier")
	dFetchBytes    = desc("host_chunk_fetch_bytes_total", "Stored bytes this host's snapshot fetches transferred, by tier (peer, store).", "tier")
	dFetchCorrupt  = desc("host_chunk_corrupt_total", "Chunk copies this host fetched that failed their hash check (refetched elsewhere).")
)

// Host collects a host's figures at each scrape.
type Host struct {
	read func(context.Context) HostFigures
}

// NewHost returns the collector of what read reports.
func NewHost(read func(context.Context) HostFigures) *Host { return &Host{read: read} }

// Describe implements prometheus.Collector.
func (h *Host) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{dLaunchSlots, dLaunchRunning, dLaunchQueued, dHostSandboxes, dHostFree, dHostTargets,
		dHostCleanups, dHostQuarantn, dHostRefused, dCacheBytes, dCacheMax, dCacheChunks, dFetches, dFetchChunks, dFetchBytes, dFetchCorrupt,
		dEgressConns, dEgressBytes, dEgressInject, dEgressMismat} {
		ch <- d
	}
}

// Collect implements prometheus.Collector.
func (h *Host) Collect(ch chan<- prometheus.Metric) {
	ctx, cancel := context.WithTimeout(context.Background(), ScrapeTimeout)
	defer cancel()
	f := h.read(ctx)
	gauge := func(d *prometheus.Desc, v float64, labels ...string) {
		ch <- prometheus.MustNewConstMetric(d, prometheus.GaugeValue, v, labels...)
	}
	counter := func(d *prometheus.Desc, v int64, labels ...string) {
		ch <- prometheus.MustNewConstMetric(d, prometheus.CounterValue, float64(v), labels...)
	}
	gauge(dLaunchSlots, float64(f.Launch.Slots))
	gauge(dLaunchRunning, float64(f.Launch.Running))
	gauge(dLaunchQueued, float64(f.Launch.Queued))
	for state, n := range f.Sandboxes {
		gauge(dHostSandboxes, float64(n), state)
	}
	if f.MemoryFree != nil {
		gauge(dHostFree, float64(*f.MemoryFree))
	}
	gauge(dHostTargets, float64(f.RestoreTargets))
	gauge(dHostCleanups, float64(f.PendingCleanups))
	gauge(dHostQuarantn, float64(f.Quarantined))
	counter(dHostRefused, f.RefusedMemory, "memory")
	counter(dHostRefused, f.RefusedTasks, "tasks")
	if c := f.Cache; c != nil {
		gauge(dCacheBytes, float64(c.Bytes))
		gauge(dCacheMax, float64(c.MaxBytes))
		gauge(dCacheChunks, float64(c.Chunks))
	}
	if x := f.Fetch; x != nil {
		counter(dFetches, x.Fetched, "fetched")
		counter(dFetches, x.Failed, "failed")
		counter(dFetchChunks, x.FromCache, "cache")
		counter(dFetchChunks, x.FromPeer, "peer")
		counter(dFetchChunks, x.FromStore, "store")
		counter(dFetchChunks, x.Zero, "zero")
		counter(dFetchBytes, x.PeerBytes, "peer")
		counter(dFetchBytes, x.StoreBytes, "store")
		counter(dFetchCorrupt, x.Corrupt)
	}
	if e := f.Egress; e != nil {
		// allowed is always shown, so the series exists before the first
		// connection.
		counter(dEgressConns, e.Connections["allowed"], "allowed")
		for outcome, n := range e.Connections {
			if outcome != "allowed" {
				counter(dEgressConns, n, outcome)
			}
		}
		counter(dEgressBytes, e.BytesOut, "out")
		counter(dEgressBytes, e.BytesIn, "in")
		counter(dEgressInject, e.Injected)
		counter(dEgressMismat, e.HostMismatch)
	}
}

// ProxyFigures are a sandbox traffic proxy's requests since it started
// (proxy.Totals).
type ProxyFigures struct {
	Requests          map[int]int64 // by status code (0: none written)
	Forwarded         int64
	BytesIn, BytesOut int64 // request and response body bytes
}

var (
	dProxyReqs  = desc("proxy_requests_total", "Requests to sandboxes' ports this proxy answered, by side (replica: in front; node: behind a replica) and status code.", "side", "code")
	dProxyFwd   = desc("proxy_forwarded_total", "Requests this proxy sent on to a sandbox (the rest it answered itself).", "side")
	dProxyBytes = desc("proxy_bytes_total", "Body bytes through this proxy, by direction (in: request bodies from clients; out: responses to them).", "side", "direction")
)

// Proxy collects a sandbox traffic proxy's figures at each scrape.
type Proxy struct {
	side string
	read func() ProxyFigures
}

// NewProxy returns the collector of what read reports, labelled with
// side ("replica" or "node").
func NewProxy(side string, read func() ProxyFigures) *Proxy { return &Proxy{side: side, read: read} }

// Describe implements prometheus.Collector.
func (p *Proxy) Describe(ch chan<- *prometheus.Desc) {
	ch <- dProxyReqs
	ch <- dProxyFwd
	ch <- dProxyBytes
}

// Collect implements prometheus.Collector.
func (p *Proxy) Collect(ch chan<- prometheus.Metric) {
	f := p.read()
	counter := func(d *prometheus.Desc, v int64, labels ...string) {
		ch <- prometheus.MustNewConstMetric(d, prometheus.CounterValue, float64(v), labels...)
	}
	for code, n := range f.Requests {
		counter(dProxyReqs, n, p.side, strconv.Itoa(code))
	}
	counter(dProxyFwd, f.Forwarded, p.side)
	counter(dProxyBytes, f.BytesIn, p.side, "in")
	counter(dProxyBytes, f.BytesOut, p.side, "out")
}

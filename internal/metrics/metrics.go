// Package metrics is what Spore gives Prometheus (docs/metrics.md): each
// API replica's own requests, and the fleet as the store holds it
// (sandboxes by node and state, snapshots and their bytes, each node's
// capacity, free memory and launch queue from its heartbeats, each
// team's live sandboxes), read at scrape time in grouped counts, served
// at GET /metrics to operator keys and the metrics token (internal/api);
// and a host's own (Host: its engine's launch slots, sandboxes, memory,
// admission refusals, chunk cache, snapshot fetches by tier), served by
// a node agent's metrics listener and by spore up.
package metrics

import (
	"context"
	"log/slog"
	"strconv"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"

	"github.com/spore-run/spore/internal/store"
)

// Namespace prefixes every metric name.
const Namespace = "spore"

// ScrapeTimeout bounds the store reads of one scrape.
const ScrapeTimeout = 5 * time.Second

// NewRegistry is a registry with the Go runtime's and the process's
// collectors.
func NewRegistry() *prometheus.Registry {
	reg := prometheus.NewRegistry()
	reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	return reg
}

// API measures an API replica's requests by route pattern (a bounded set:
// never the path, which holds IDs) and status code.
type API struct {
	requests *prometheus.CounterVec
	duration *prometheus.HistogramVec
}

// NewAPI registers the request metrics with reg.
func NewAPI(reg prometheus.Registerer) *API {
	m := &API{
		requests: prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: Namespace, Subsystem: "api", Name: "requests_total",
			Help: "API requests answered, by route pattern and status code."}, []string{"route", "code"}),
		duration: prometheus.NewHistogramVec(prometheus.HistogramOpts{Namespace: Namespace, Subsystem: "api", Name: "request_duration_seconds",
			Help:    "Time to answer an API request (to the end of the handler; a stream's whole life), by route pattern and status code.",
			Buckets: []float64{.001, .0025, .005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5, 10, 30, 60}}, []string{"route", "code"}),
	}
	reg.MustRegister(m.requests, m.duration)
	return m
}

// Observe records one request.
func (m *API) Observe(route string, code int, d time.Duration) {
	if m == nil {
		return
	}
	c := strconv.Itoa(code)
	m.requests.WithLabelValues(route, c).Inc()
	m.duration.WithLabelValues(route, c).Observe(d.Seconds())
}

// FleetStore is what the fleet collector reads.
type FleetStore interface {
	Census(ctx context.Context) (store.Census, error)
	ListNodes(ctx context.Context) ([]store.Node, error)
	LiveSandboxes(ctx context.Context) (map[string]int, error)
}

func desc(name, help string, labels ...string) *prometheus.Desc {
	return prometheus.NewDesc(prometheus.BuildFQName(Namespace, "", name), help, labels, nil)
}

var (
	dSandboxes      = desc("sandboxes", "Sandboxes the store lists, by node and state.", "node", "state")
	dSnapshots      = desc("snapshots", "Snapshots the store lists, by kind (snapshot, template, hibernation) and storage state.", "kind", "storage")
	dSnapshotBytes  = desc("snapshot_bytes", "Sum of the sizes of the snapshots the store lists, by kind and storage state.", "kind", "storage")
	dWarmPool       = desc("warm_pool_sandboxes", "Sandboxes the warm pool holds restored ahead of time, by template.", "template")
	dTeamLive       = desc("team_live_sandboxes", "A team's sandboxes holding a host (creating, running, paused in memory).", "team")
	dNode           = desc("node_info", "A node the fleet knows: 1, with its state and whether it drains.", "node", "state", "draining")
	dNodeMemory     = desc("node_memory_capacity_bytes", "A node's host memory.", "node")
	dNodeCPUs       = desc("node_cpu_capacity", "A node's host CPUs.", "node")
	dNodeSlots      = desc("node_sandbox_slots", "A node's sandbox slots.", "node")
	dNodeFree       = desc("node_memory_free_bytes", "Memory a node had for new sandboxes at its last heartbeat (MemAvailable less its floor and admissions).", "node")
	dNodeQueued     = desc("node_launches_queued", "Launches (boots, restores) waiting for a node's launch slots at its last heartbeat.", "node")
	dNodeHeartbeat  = desc("node_heartbeat_age_seconds", "Seconds since a node's last heartbeat.", "node")
	dScrapeDuration = desc("fleet_scrape_duration_seconds", "Time the fleet collector's store reads took in this scrape.")
)

// Fleet collects the fleet's figures from the store at each scrape.
type Fleet struct {
	st  FleetStore
	now func() time.Time
	log *slog.Logger
}

// NewFleet returns the fleet collector over st.
func NewFleet(st FleetStore, log *slog.Logger) *Fleet {
	return &Fleet{st: st, now: time.Now, log: log}
}

// Describe implements prometheus.Collector.
func (f *Fleet) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{dSandboxes, dSnapshots, dSnapshotBytes, dWarmPool, dTeamLive, dNode, dNodeMemory, dNodeCPUs,
		dNodeSlots, dNodeFree, dNodeQueued, dNodeHeartbeat, dScrapeDuration} {
		ch <- d
	}
}

// Collect implements prometheus.Collector: three grouped reads.
func (f *Fleet) Collect(ch chan<- prometheus.Metric) {
	ctx, cancel := context.WithTimeout(context.Background(), ScrapeTimeout)
	defer cancel()
	t0 := time.Now()
	fail := func(d *prometheus.Desc, err error) {
		if f.log != nil {
			f.log.Warn("metrics: read the store", "err", err)
		}
		ch <- prometheus.NewInvalidMetric(d, err)
	}
	if c, err := f.st.Census(ctx); err != nil {
		fail(dSandboxes, err)
	} else {
		for _, x := range c.Sandboxes {
			ch <- prometheus.MustNewConstMetric(dSandboxes, prometheus.GaugeValue, float64(x.N), x.NodeID, x.State)
		}
		for _, x := range c.Snapshots {
			storage := x.Storage
			if storage == "" {
				storage = store.StorageLocal
			}
			ch <- prometheus.MustNewConstMetric(dSnapshots, prometheus.GaugeValue, float64(x.N), x.Kind, storage)
			ch <- prometheus.MustNewConstMetric(dSnapshotBytes, prometheus.GaugeValue, float64(x.Bytes), x.Kind, storage)
		}
		for _, x := range c.Pooled {
			ch <- prometheus.MustNewConstMetric(dWarmPool, prometheus.GaugeValue, float64(x.N), x.TemplateID)
		}
	}
	if live, err := f.st.LiveSandboxes(ctx); err != nil {
		fail(dTeamLive, err)
	} else {
		for team, n := range live {
			ch <- prometheus.MustNewConstMetric(dTeamLive, prometheus.GaugeValue, float64(n), team)
		}
	}
	if nodes, err := f.st.ListNodes(ctx); err != nil {
		fail(dNode, err)
	} else {
		now := f.now()
		for _, n := range nodes {
			ch <- prometheus.MustNewConstMetric(dNode, prometheus.GaugeValue, 1, n.ID, n.State, strconv.FormatBool(n.Draining))
			ch <- prometheus.MustNewConstMetric(dNodeMemory, prometheus.GaugeValue, float64(n.Capacity.MemoryMB)*(1<<20), n.ID)
			ch <- prometheus.MustNewConstMetric(dNodeCPUs, prometheus.GaugeValue, n.Capacity.VCPUs, n.ID)
			ch <- prometheus.MustNewConstMetric(dNodeSlots, prometheus.GaugeValue, float64(n.Capacity.Sandboxes), n.ID)
			if n.MemoryFreeMB != nil {
				ch <- prometheus.MustNewConstMetric(dNodeFree, prometheus.GaugeValue, float64(*n.MemoryFreeMB)*(1<<20), n.ID)
			}
			ch <- prometheus.MustNewConstMetric(dNodeQueued, prometheus.GaugeValue, float64(n.LaunchesQueued), n.ID)
			ch <- prometheus.MustNewConstMetric(dNodeHeartbeat, prometheus.GaugeValue, now.Sub(n.Heartbeat).Seconds(), n.ID)
		}
	}
	ch <- prometheus.MustNewConstMetric(dScrapeDuration, prometheus.GaugeValue, time.Since(t0).Seconds())
}

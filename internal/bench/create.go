package bench

import (
	"context"
	"fmt"
	"slices"
	"sync"
	"time"

	"github.com/spore-run/spore/internal/api"
)

// Names of the create-from-template figures. The first is the warm-pool
// hit users meet between requests (its name predates the others and is
// kept so reports compare across runs); the others are what a create costs
// when the pool cannot serve it.
const (
	opCreateWarm = "create from template"
	opCreateCold = "create from template: cold (no warm pool)"
	opCreateSeq  = "create from template: back to back"
)

// opCreateClients names the concurrent-clients create figure.
func opCreateClients(clients int) string {
	return fmt.Sprintf("create from template: %d concurrent clients", clients)
}

// createOps measures Sandbox.create(template) four ways: a warm-pool hit
// with the pool refilled between creates; cold (a restore on the spot);
// back to back by one client (the pool drains and refills beside the
// creates); and many clients at once.
func (r *runner) createOps(ctx context.Context, n int) error {
	if err := r.createWarm(ctx, n); err != nil {
		return err
	}
	if err := r.createCold(ctx, n); err != nil {
		return err
	}
	if err := r.createSeq(ctx, n); err != nil {
		return err
	}
	clients, total := 16, 32
	if r.cfg.Quick {
		clients, total = 2, 2
	}
	return r.createConcurrent(ctx, clients, total)
}

// createWarm: Sandbox.create(template) as users do it, warm pool and all,
// with a pause between creates so the pool refills as it would between a
// user's requests; and kill (timed on its own).
func (r *runner) createWarm(ctx context.Context, n int) error {
	create := r.op(opCreateWarm, "lifecycle", "ms")
	kill := r.op("kill", "lifecycle", "ms")
	for range n {
		time.Sleep(500 * time.Millisecond)
		var id string
		if _, err := r.sample(ctx, create, func(ctx context.Context) error {
			var err error
			id, err = r.create(ctx, api.CreateRequest{TemplateID: templateBase})
			return err
		}); err != nil {
			return err
		}
		if _, err := r.sample(ctx, kill, func(ctx context.Context) error { return r.kill(ctx, id) }); err != nil {
			return err
		}
	}
	create.Note = fmt.Sprintf("a warm-pool hit: 0.5 s between creates lets the pool refill, as between a user's requests; %s (pool size %s)",
		poolServed(n, len(r.parts[create.Name]["restore"])), poolSize(r.cfg.PoolSize))
	return nil
}

// createCold: a create the warm pool cannot serve, so the template is
// restored on the spot. The pool serves only creates that name no shape;
// this one names the template's own (same limits, so the same restore a
// server without a pool does).
func (r *runner) createCold(ctx context.Context, n int) error {
	req, image, err := r.coldRequest(ctx, templateBase)
	if err != nil {
		return err
	}
	o := r.op(opCreateCold, "lifecycle", "ms")
	for range n {
		var id string
		if _, err := r.sample(ctx, o, func(ctx context.Context) error {
			var err error
			id, err = r.create(ctx, req)
			return err
		}); err != nil {
			return err
		}
		if err := r.kill(ctx, id); err != nil { // not timed
			return err
		}
	}
	o.Note = fmt.Sprintf("a restore of the template on the spot: each create names the template's own shape (%d MB, %d vCPUs), which the warm pool never serves; kill not timed; %s",
		req.MemoryMB, req.CPUCount, poolServed(n, len(r.parts[o.Name]["restore"])))
	if b := r.cfg.Bare; b != nil {
		// Bare: `runsc restore` of the template's own image with the
		// bundle of a sandbox created the same way.
		id, err := r.create(ctx, req)
		if err != nil {
			return err
		}
		inst, err := b.Instance(id)
		if err != nil {
			return err
		}
		if err := r.bare(o, "runsc restore (the template's image)", n, func() (float64, error) { return b.Restore(ctx, inst, b.ImageDir(image)) }); err != nil {
			return err
		}
		if err := r.kill(ctx, id); err != nil {
			return err
		}
	}
	return nil
}

// coldRequest is a create of template that the warm pool cannot serve
// (it names the template's own memory and vCPUs), and the snapshot ID of
// the template's image.
func (r *runner) coldRequest(ctx context.Context, template string) (api.CreateRequest, string, error) {
	ts, err := r.c.Templates(ctx)
	if err != nil {
		return api.CreateRequest{}, "", fmt.Errorf("list templates: %w", err)
	}
	for _, t := range ts {
		if t.TemplateID == template || slices.Contains(t.Names, template) || slices.Contains(t.Aliases, template) {
			req, err := coldShape(template, t)
			return req, t.TemplateID, err
		}
	}
	return api.CreateRequest{}, "", fmt.Errorf("template %q not listed", template)
}

// coldShape builds the shaped request; a template listing no shape
// cannot be named without changing the limits, so that is an error.
func coldShape(template string, t api.TemplateInfo) (api.CreateRequest, error) {
	if t.MemoryMB <= 0 || t.CPUCount <= 0 {
		return api.CreateRequest{}, fmt.Errorf("template %q lists no shape (memory %d MB, %d vCPUs): cannot bypass the warm pool with the same limits", template, t.MemoryMB, t.CPUCount)
	}
	return api.CreateRequest{TemplateID: template, MemoryMB: t.MemoryMB, CPUCount: t.CPUCount}, nil
}

// createSeq: creates back to back by one client, each kept until the
// series ends: the warm pool serves the first, then refills beside the
// creates that follow (sustained load from one client).
func (r *runner) createSeq(ctx context.Context, n int) error {
	o := r.op(opCreateSeq, "lifecycle", "ms")
	var ids []string
	t0 := time.Now()
	for range n {
		if _, err := r.sample(ctx, o, func(ctx context.Context) error {
			id, err := r.create(ctx, api.CreateRequest{TemplateID: templateBase})
			if err == nil {
				ids = append(ids, id)
			}
			return err
		}); err != nil {
			r.killAll(ctx, ids)
			return err
		}
	}
	wall := time.Since(t0)
	if err := r.killAll(ctx, ids); err != nil {
		return err
	}
	o.Note = fmt.Sprintf("%d creates by one client with no pause, each kept until the series ended (then killed, not timed): %.1f creates/s; %s (pool size %s), the rest restored on the spot while the pool refilled beside them",
		n, float64(n)/wall.Seconds(), poolServed(n, len(r.parts[o.Name]["restore"])), poolSize(r.cfg.PoolSize))
	return nil
}

// createConcurrent: total creates by clients at once, each kept until
// all end (the throughput curve's top level, as a latency figure).
func (r *runner) createConcurrent(ctx context.Context, clients, total int) error {
	o := r.op(opCreateClients(clients), "lifecycle", "ms")
	time.Sleep(2 * time.Second) // let the warm pool refill, as between bursts
	var (
		mu      sync.Mutex
		ids     []string
		samples []float64
		parts   []map[string]float64
	)
	t0 := time.Now()
	err := parallel(ctx, total, clients, func(ctx context.Context, _ int) error {
		var id string
		v, ps, err := timed(ctx, func(ctx context.Context) error {
			var err error
			id, err = r.create(ctx, api.CreateRequest{TemplateID: templateBase})
			return err
		})
		if err != nil {
			return err
		}
		mu.Lock()
		defer mu.Unlock()
		ids, samples, parts = append(ids, id), append(samples, round(v, 3)), append(parts, ps)
		return nil
	})
	wall := time.Since(t0)
	if kerr := r.killAll(ctx, ids); err == nil {
		err = kerr
	}
	if err != nil {
		return fmt.Errorf("%s: %w", o.Name, err)
	}
	o.Samples = append(o.Samples, samples...)
	for _, ps := range parts {
		r.addParts(o.Name, ps)
	}
	s := Summarize(samples)
	o.Note = fmt.Sprintf("%d creates by %d clients at once, each kept until all ended (then killed, not timed): %.1f creates/s, p50 %.1f ms, p90 %.1f ms; %s (pool size %s, refilled before the burst)",
		total, clients, float64(total)/wall.Seconds(), s.P50, s.P90, poolServed(total, len(r.parts[o.Name]["restore"])), poolSize(r.cfg.PoolSize))
	r.detail("%d clients: %.1f creates/s, p50 %.0f ms", clients, float64(total)/wall.Seconds(), s.P50)
	return nil
}

// poolServed says how many of n creates the warm pool served: a create
// the pool served did no restore of its own, so it reports no "restore"
// phase in Server-Timing.
func poolServed(n, restored int) string {
	return fmt.Sprintf("%d of %d served by the warm pool", max(0, n-restored), n)
}

func poolSize(n int) string {
	if n < 0 {
		return "unknown"
	}
	return fmt.Sprint(n)
}

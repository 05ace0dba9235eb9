package engine

import (
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"net/netip"
	"strings"

	"github.com/spore-run/spore/internal/egress"
	"github.com/spore-run/spore/internal/envd"
	"github.com/spore-run/spore/internal/errdefs"
	"github.com/spore-run/spore/internal/netns"
	"github.com/spore-run/spore/internal/runtime"
	"github.com/spore-run/spore/internal/tenant"
	"github.com/spore-run/spore/internal/timing"
)

// Network gives each instance its own network (implemented by
// netns.Manager). Optional: without it sandboxes have no network.
type Network interface {
	Setup(ctx context.Context, instance string, p netns.Policy) (netns.Net, error)
	Teardown(ctx context.Context, instance string) error
	SetPolicy(ctx context.Context, instance string, p netns.Policy) error
	// Reserve sets up a network ahead of time, for a restore target: it
	// lets nothing out until Claim gives it a sandbox's policy, and
	// journals its egress audit under that sandbox.
	Reserve(ctx context.Context, instance string) (netns.Net, error)
	Claim(ctx context.Context, instance, sandbox string, p netns.Policy) error
	Sweep(ctx context.Context, keep map[string]bool) error
}

// Initializer re-initialises the in-sandbox daemon after a restore, so each
// restored sandbox gets its own identity and access token (implemented by
// envdclient.Client). Optional: needs a Network.
type Initializer interface {
	Init(ctx context.Context, addr netip.Addr, token string, req envd.InitRequest) error
}

// launch sets up the instance's network, then boots it (image == "") or
// restores it from image, once admitted by the host's memory
// (admission.go). On failure nothing is left.
func (e *Engine) launch(ctx context.Context, sandbox string, spec runtime.Spec, image string, policy netns.Policy) (addr netip.Addr, err error) {
	done := timing.Track(ctx, "launch-queue")
	release, err := e.gate.acquire(ctx, tenant.Of(ctx))
	done()
	if err != nil {
		return addr, fmt.Errorf("wait for a launch slot: %w", err)
	}
	defer release()
	t := e.takeTarget(spec.ID)
	if t == nil {
		t = e.takeNet(spec.ID)
	}
	hold, err := e.admitLaunch(ctx, sandbox, image)
	if err != nil {
		if t != nil {
			e.dropTarget(t)
		}
		return addr, err
	}
	defer func() { e.launched(hold, sandbox, spec.ID, err == nil) }()
	if t != nil && !t.netOnly { // a reserved network is claimed ready
		done := timing.Track(ctx, "target")
		select {
		case <-t.ready:
		case <-ctx.Done():
			done()
			e.dropTarget(t)
			return addr, ctx.Err()
		}
		done()
		if t.err == nil && image != "" {
			addr, err := e.launchInto(ctx, sandbox, t, spec, image, policy)
			if err == nil || ctx.Err() != nil {
				return addr, err
			}
			// Nothing of the target is left: a plain restore under its
			// ID. (A target should never fail where a plain restore
			// works: say so.)
			e.log.Warn("restore into a restore target failed: restoring without one", "sandbox_id", sandbox, "instance", spec.ID, "err", err)
		}
		// Else its fill failed (and left nothing): launch under its ID
		// as if it had never been made.
	}
	if e.net != nil {
		n, err := e.networkFor(ctx, sandbox, spec.ID, t, policy)
		if err != nil {
			return addr, err
		}
		spec.NetNS, addr = n.NetNS, n.Addr
	}
	if image == "" {
		done := timing.Track(ctx, "boot")
		err = e.rt.Start(ctx, spec)
		done()
	} else {
		done := timing.Track(ctx, "restore")
		err = e.rt.Restore(ctx, spec, image)
		done()
	}
	if err != nil {
		if e.net != nil {
			cctx, cancel := cleanupCtx()
			defer cancel()
			if terr := e.net.Teardown(cctx, spec.ID); terr != nil {
				e.log.Warn("teardown network", "instance", spec.ID, "err", terr)
			}
		}
		return netip.Addr{}, launchErr(err)
	}
	e.watch(sandbox, spec.ID)
	return addr, nil
}

// launchErr marks the runtime refusing an instance the engine specified as
// the engine's failure: an image or root filesystem missing on disk, a
// clashing instance ID or a rejected spec is not the client's doing, and
// must not reach it as a 404/409/400 (carrying host paths) but as an
// internal error.
func launchErr(err error) error {
	if errdefs.IsNotFound(err) || errdefs.IsAlreadyExists(err) || errdefs.IsInvalidArgument(err) || errdefs.IsConflict(err) {
		return fmt.Errorf("%w: %w", errdefs.ErrInternal, err)
	}
	return err
}

// sandboxOf is the sandbox an instance (<sandboxID>-<gen>) belongs to.
func sandboxOf(instance string) string {
	if i := strings.LastIndexByte(instance, '-'); i > 0 {
		return instance[:i]
	}
	return instance
}

// killInstance kills an instance and frees its network, treating "already
// gone" as success.
func (e *Engine) killInstance(ctx context.Context, instance string) error {
	if instance == "" {
		return nil
	}
	done := timing.Track(ctx, "kill")
	err := e.rt.Kill(ctx, instance)
	done()
	if err != nil && !errdefs.IsNotFound(err) {
		return err
	}
	if e.net != nil {
		defer timing.Track(ctx, "net-teardown")()
		return e.net.Teardown(ctx, instance)
	}
	return nil
}

// initDaemon re-initialises the daemon of a just-restored instance with
// rec's identity, token and environment; imageToken is the token the
// image's daemon holds.
func (e *Engine) initDaemon(ctx context.Context, rec *record, addr netip.Addr, imageToken string) error {
	if e.init == nil || !addr.IsValid() {
		return nil
	}
	defer timing.Track(ctx, "envd")()
	token := rec.Run.AccessToken
	env := map[string]string{}
	for _, kv := range rec.Run.Env {
		if k, v, ok := strings.Cut(kv, "="); ok {
			env[k] = v
		}
	}
	req := envd.InitRequest{AccessToken: &token, SandboxID: rec.ID, EnvVars: env, VolumeMounts: daemonVolumes(rec.Run)}
	if rec.Policy.CA != nil {
		req.EgressCA = string(rec.Policy.CA.CertPEM)
	}
	if err := e.init.Init(ctx, addr, imageToken, req); err != nil {
		return err
	}
	if rec.Policy.CA != nil {
		rec.TrustedCA = caPrint(rec.Policy.CA)
	}
	return nil
}

// caPrint is an egress CA's fingerprint ("" for none).
func caPrint(ca *egress.CA) string {
	if ca == nil {
		return ""
	}
	sum := sha256.Sum256(ca.CertPEM)
	return hex.EncodeToString(sum[:8])
}

// newToken returns a fresh access token for a sandbox's daemon.
func newToken() string {
	b := make([]byte, 24)
	rand.Read(b)
	return hex.EncodeToString(b)
}

// SetPolicy changes a running sandbox's egress policy.
func (e *Engine) SetPolicy(ctx context.Context, id string, p netns.Policy) error {
	rec, unlock, err := e.lock(ctx, id)
	if err != nil {
		return err
	}
	defer unlock()
	if e.net == nil {
		return errdefs.Invalidf("this engine runs sandboxes without network")
	}
	// A CA the sandbox's trust store does not have yet (its trust store
	// keeps it across a restart of the node, which forgets the CA itself).
	newCA := p.CA != nil && caPrint(p.CA) != rec.TrustedCA
	if newCA && rec.State != StateRunning {
		return errdefs.Conflictf("sandbox %s is %s: network rules are first given to a running sandbox (its trust store gets their CA)", id, rec.State)
	}
	if rec.Instance != "" {
		if err := e.net.SetPolicy(ctx, rec.Instance, p); err != nil {
			return err
		}
	}
	rec.Policy = p
	if newCA && rec.Instance != "" {
		// Network rules given at run time: the sandbox's trust store
		// gets its CA now (new processes trust it).
		if err := e.initDaemon(ctx, rec, rec.Addr, rec.Run.AccessToken); err != nil {
			return err
		}
	}
	return e.save(rec)
}

// Reconfigure gives a running sandbox a new environment for its commands
// (merged over the template's) and, when p is set, a new egress policy:
// what a sandbox taken from a warm pool needs to become the one a create
// asked for. The daemon is re-initialised with the sandbox's own token.
func (e *Engine) Reconfigure(ctx context.Context, id string, env []string, p *netns.Policy) (Sandbox, error) {
	rec, unlock, err := e.lock(ctx, id)
	if err != nil {
		return Sandbox{}, err
	}
	defer unlock()
	if err := wantState(rec, "reconfigure", StateRunning); err != nil {
		return Sandbox{}, err
	}
	newCA := p != nil && p.CA != nil && caPrint(p.CA) != rec.TrustedCA
	if p != nil && e.net != nil {
		if err := e.net.SetPolicy(ctx, rec.Instance, *p); err != nil {
			return Sandbox{}, err
		}
		rec.Policy = *p
	}
	if len(env) > 0 || newCA {
		rec.Run.Env = append(append([]string(nil), rec.Run.Env...), env...)
		if err := e.initDaemon(ctx, rec, rec.Addr, rec.Run.AccessToken); err != nil {
			return Sandbox{}, err
		}
	}
	if err := e.save(rec); err != nil {
		return Sandbox{}, err
	}
	return rec.view(), nil
}

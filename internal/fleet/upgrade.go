package fleet

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"syscall"
	"time"

	"github.com/spore-run/spore/internal/errdefs"
)

// A rolling upgrade replaces every process of a running fleet that runs
// `spore` (node agents, then API replicas), one at a time, with another
// executable, while clients keep using the fleet (docs/deploy.md,
// "Rolling upgrade"):
//
//   - a node is drained first (POST /nodes/{id}/drain: placement skips it,
//     its sandboxes are hibernated and, with a shared blob store, made
//     durable, so each resumes on another node at its next connect); it is
//     stopped only once it holds no sandbox, started on the new binary,
//     and undrained once it registered again and is ready;
//   - a replica is stopped (SIGTERM: it finishes the requests it has) and
//     started on the new binary while the others serve, and the next one
//     waits until it answers /health.
//
// PostgreSQL and the S3 server are not Spore and are left alone.

// UpgradeStep is what a rolling upgrade did to one fleet process.
type UpgradeStep struct {
	Name   string `json:"name"`              // node-K or api-I
	NodeID string `json:"node_id,omitempty"` // nodes only
	// Hibernated counts the sandboxes the node's drains hibernated; Drains
	// the drain calls it took (a create placed just before the first
	// lands, and is hibernated by the next).
	Hibernated int `json:"hibernated"`
	Drains     int `json:"drains"`
	// Sandboxes are the IDs of the sandboxes the node held while it was
	// drained: listed before the first drain call and after each one
	// (what a drain hibernates stays listed on the node until it resumes
	// elsewhere). A command streaming from one of them when the drain
	// hibernated it was cut (docs/deploy.md, "Rolling upgrade").
	Sandboxes []string `json:"sandboxes,omitempty"`
	// NotDurable counts what the node still held only locally when it was
	// stopped (snapshots uploading, hibernations not yet in the blob
	// store): nothing is lost (its data directory stays), but those wait
	// for the node to come back.
	NotDurable int       `json:"not_durable"`
	Began      time.Time `json:"began"`            // the drain (node) or the stop (replica) began
	Drained    time.Time `json:"drained,omitzero"` // a node: its last drain call returned, and it held nothing
	Stopped    time.Time `json:"stopped"`          // the old process was signalled
	Ready      time.Time `json:"ready"`            // the new one answers (a node: registered again and ready)
	Done       time.Time `json:"done"`             // a node: undrained
}

// upgradeTimeouts bound each wait of a rolling upgrade.
type upgradeTimeouts struct {
	drain   time.Duration // until the node holds no sandbox
	durable time.Duration // until what the node holds is in the blob store
	ready   time.Duration // until the new process answers
	poll    time.Duration // between checks
}

var defaultUpgradeTimeouts = upgradeTimeouts{drain: 10 * time.Minute, durable: 2 * time.Minute, ready: 5 * time.Minute, poll: 500 * time.Millisecond}

// versionRE is what `spore version` prints.
var versionRE = regexp.MustCompile(`^spore (\S+)\n?$`)

// checkExecutable makes path absolute and checks it is a spore binary
// (`path version` answers "spore <version>"), returning the version.
func checkExecutable(ctx context.Context, path string) (abs, version string, err error) {
	if path == "" {
		return "", "", errdefs.Invalidf("no executable given")
	}
	if abs, err = filepath.Abs(path); err != nil {
		return "", "", err
	}
	fi, err := os.Stat(abs)
	if err != nil {
		return "", "", fmt.Errorf("executable %s: %w: %w", abs, err, errdefs.ErrInvalidArgument)
	}
	if !fi.Mode().IsRegular() || fi.Mode().Perm()&0o111 == 0 {
		return "", "", errdefs.Invalidf("%s is not an executable file (mode %v)", abs, fi.Mode())
	}
	vctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	out, err := exec.CommandContext(vctx, abs, "version").Output()
	m := versionRE.FindStringSubmatch(string(out))
	if err != nil || m == nil {
		return "", "", errdefs.Invalidf("%s is not a spore binary: `%s version` printed %q (%v)", abs, abs, strings.TrimSpace(string(out)), err)
	}
	return abs, m[1], nil
}

// UpgradeProc restarts fleet process name (a node agent or an API
// replica) with executable in place of the spore binary it ran, with the
// same flags: SIGTERM (SIGKILL after 30 s), then the new process, whose
// command line the state records. It does not drain a node first:
// RollingUpgrade does. A process that is not running is just started.
func UpgradeProc(ctx context.Context, dir, name, executable string) (Proc, error) {
	exe, _, err := checkExecutable(ctx, executable)
	if err != nil {
		return Proc{}, err
	}
	if _, err := Load(dir); err != nil {
		return Proc{}, err // before the lock, which makes the parent directory
	}
	unlock, err := lock(dir)
	if err != nil {
		return Proc{}, err
	}
	defer unlock()
	st, err := Load(dir)
	if err != nil {
		return Proc{}, err
	}
	i, err := sporeProc(st, name)
	if err != nil {
		return Proc{}, err
	}
	return replaceProc(ctx, st, i, exe)
}

// sporeProc finds the index of fleet process name, which must run spore.
func sporeProc(st *State, name string) (int, error) {
	for i, p := range st.Processes {
		if p.Name != name {
			continue
		}
		if p.Role != "node" && p.Role != "api" {
			return 0, errdefs.Invalidf("%s is not a spore process (role %s): only node agents and API replicas are upgraded", name, p.Role)
		}
		return i, nil
	}
	return 0, fmt.Errorf("no process %q in the fleet in %s: %w", name, st.Dir, errdefs.ErrNotFound)
}

// replaceProc stops st.Processes[i] and starts it again with exe, the
// same arguments, log and namespace, and records it.
func replaceProc(ctx context.Context, st *State, i int, exe string) (Proc, error) {
	p := st.Processes[i]
	if err := p.stop(ctx, syscall.SIGTERM, 30*time.Second); err != nil {
		return Proc{}, err
	}
	np, err := start(exec.Command(exe, p.Args[1:]...), p.Log, p.Netns)
	if err != nil {
		return Proc{}, fmt.Errorf("%s on %s: %w", p.Name, exe, err)
	}
	np.Role, np.Name = p.Role, p.Name
	st.Processes[i] = np
	return np, st.save()
}

// RollingUpgrade replaces every node agent and then every API replica of
// the fleet in dir, one at a time, with executable (see the comment at
// the top of this file), through the fleet's API with apiKey (the
// fleet's own key when ""). It refuses to start unless every process
// runs and every node is ready. A node already draining before stays
// drained. On a failure it stops there and says what state it left (a
// node it drained stays drained: the error says how to undrain it);
// once that is fixed and the node undrained, running it again finishes
// the upgrade (processes already on executable are replaced again,
// harmlessly).
func RollingUpgrade(ctx context.Context, dir, executable, apiKey string, log *slog.Logger) ([]UpgradeStep, error) {
	return rollingUpgrade(ctx, dir, executable, apiKey, log, defaultUpgradeTimeouts)
}

func rollingUpgrade(ctx context.Context, dir, executable, apiKey string, log *slog.Logger, to upgradeTimeouts) ([]UpgradeStep, error) {
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	exe, version, err := checkExecutable(ctx, executable)
	if err != nil {
		return nil, err
	}
	if dir, err = filepath.Abs(dir); err != nil {
		return nil, err
	}
	if _, err := Load(dir); err != nil {
		return nil, err // before the lock, which makes the parent directory
	}
	unlock, err := lock(dir)
	if err != nil {
		return nil, err
	}
	defer unlock()
	st, err := Load(dir)
	if err != nil {
		return nil, err
	}
	if !st.Complete {
		return nil, fmt.Errorf("the fleet in %s never finished starting: %w", dir, errdefs.ErrConflict)
	}
	if apiKey == "" {
		b, err := os.ReadFile(st.KeyFile)
		if err != nil {
			return nil, fmt.Errorf("the fleet's API key: %w", err)
		}
		apiKey = strings.TrimSpace(string(b))
	}
	a := newAdminAPI(st.APIURLs, apiKey)
	wasDraining, err := preflight(ctx, st, a)
	if err != nil {
		return nil, err
	}
	// What down re-executes to purge the nodes: the new binary from now.
	st.Executable = exe
	if err := st.save(); err != nil {
		return nil, err
	}
	log.Info("rolling upgrade", "dir", dir, "executable", exe, "version", version, "nodes", len(st.Nodes), "replicas", len(st.APIURLs))
	var steps []UpgradeStep
	for _, n := range st.Nodes {
		step, err := upgradeNode(ctx, st, a, n, exe, !wasDraining[n.ID], log, to)
		steps = append(steps, step)
		if err != nil {
			return steps, err
		}
	}
	for i, p := range st.Processes {
		if p.Role != "api" {
			continue
		}
		step, err := upgradeReplica(ctx, st, i, exe, log, to)
		steps = append(steps, step)
		if err != nil {
			return steps, err
		}
	}
	log.Info("rolling upgrade done", "dir", dir, "version", version)
	return steps, nil
}

// preflight checks the fleet can lose one process at a time: every spore
// process runs, every replica answers, every node is ready. It returns
// the nodes draining already.
func preflight(ctx context.Context, st *State, a adminAPI) (map[string]bool, error) {
	for _, p := range st.Processes {
		if (p.Role == "node" || p.Role == "api") && !p.alive() {
			return nil, fmt.Errorf("%s (pid %d) is not running: start it (or bring the fleet down) before a rolling upgrade: %w", p.Name, p.PID, errdefs.ErrConflict)
		}
	}
	for _, p := range st.Processes {
		if p.Role == "api" {
			if err := waitHTTP(ctx, p, st.APIURLs[apiIndex(p.Name)]+"/health", "", 10*time.Second); err != nil {
				return nil, fmt.Errorf("%w: %w", err, errdefs.ErrConflict)
			}
		}
	}
	nodes, err := a.nodes(ctx)
	if err != nil {
		return nil, err
	}
	draining := map[string]bool{}
	for _, n := range st.Nodes {
		ns, ok := nodes[n.ID]
		if !ok || ns.State != "ready" {
			return nil, fmt.Errorf("node %d (%s) is %q, not ready: a rolling upgrade needs every node up: %w", n.Index, n.ID, ns.State, errdefs.ErrConflict)
		}
		draining[n.ID] = ns.Draining
	}
	return draining, nil
}

// upgradeNode drains node n, waits until it holds nothing and what it
// held is durable, replaces its agent, waits until it registered again
// and is ready, and undrains it (unless undrain is false).
func upgradeNode(ctx context.Context, st *State, a adminAPI, n Node, exe string, undrain bool, log *slog.Logger, to upgradeTimeouts) (UpgradeStep, error) {
	name := fmt.Sprintf("node-%d", n.Index)
	step := UpgradeStep{Name: name, NodeID: n.ID, Began: time.Now()}
	i, err := sporeProc(st, name)
	if err != nil {
		return step, err
	}
	left := func(err error) error {
		return fmt.Errorf("%s (%s) is left drained: %w (`spore node undrain %s` once it runs)", name, n.ID, err, n.ID)
	}
	if err := drainEmpty(ctx, a, n.ID, &step, log, to); err != nil {
		return step, left(err)
	}
	step.Drained = time.Now()
	if sharedStore(n) {
		step.NotDurable = waitDurable(ctx, a, n.ID, log, to)
	}
	step.Stopped = time.Now()
	p, err := replaceProc(ctx, st, i, exe)
	if err != nil {
		return step, left(err)
	}
	if err := waitNodeReady(ctx, a, p, n.ID, step.Stopped, to); err != nil {
		return step, left(err)
	}
	step.Ready = time.Now()
	log.Info("node agent replaced", "node_id", n.ID, "name", name, "pid", p.PID, "down", step.Ready.Sub(step.Stopped).Round(time.Millisecond))
	if undrain {
		if err := retry(ctx, to.ready, to.poll, func() error { return a.undrain(ctx, n.ID) }); err != nil {
			return step, left(err)
		}
	}
	step.Done = time.Now()
	return step, nil
}

// drainEmpty drains node id until GET /nodes says it holds no sandbox: a
// create placed before the first drain took effect is hibernated by the
// next one (a drain skips sandboxes still being created).
func drainEmpty(ctx context.Context, a adminAPI, id string, step *UpgradeStep, log *slog.Logger, to upgradeTimeouts) error {
	deadline := time.Now().Add(to.drain)
	noteHeld(ctx, a, id, step, log)
	for {
		n, err := a.drain(ctx, id)
		step.Drains++
		step.Hibernated += n
		noteHeld(ctx, a, id, step, log)
		var held int
		if err == nil {
			var ns nodeStatus
			if ns, err = a.node(ctx, id); err == nil {
				if held = ns.Sandboxes; held == 0 {
					log.Info("node drained", "node_id", id, "hibernated", step.Hibernated, "drains", step.Drains)
					return nil
				}
			}
		}
		if err != nil && !retryable(err) {
			return fmt.Errorf("drain: %w", err)
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("still holds %d sandboxes after %d drains in %s (last error: %v): %w", held, step.Drains, to.drain, err, errdefs.ErrUnavailable)
		}
		if err := sleep(ctx, to.poll); err != nil {
			return err
		}
	}
}

// noteHeld adds the sandboxes the API lists on node id to
// step.Sandboxes. A list that fails is logged and skipped: the record is
// what the upgrade reports, not what it decides on.
func noteHeld(ctx context.Context, a adminAPI, id string, step *UpgradeStep, log *slog.Logger) {
	sbs, err := listAll[struct {
		SandboxID string `json:"sandboxID"`
		ClientID  string `json:"clientID"`
	}](ctx, a, "/v2/sandboxes?limit=1000")
	if err != nil {
		log.Warn("list the sandboxes of a node being drained", "node_id", id, "err", err)
		return
	}
	for _, sb := range sbs {
		if sb.ClientID == id && !slices.Contains(step.Sandboxes, sb.SandboxID) {
			step.Sandboxes = append(step.Sandboxes, sb.SandboxID)
		}
	}
}

// waitDurable waits until what node id holds is in the blob store, and
// returns how much is not when the wait ends (then it resumes on that
// node once it is back: nothing is lost, its data directory stays).
func waitDurable(ctx context.Context, a adminAPI, id string, log *slog.Logger, to upgradeTimeouts) int {
	deadline := time.Now().Add(to.durable)
	for {
		sn, hib, err := a.notDurable(ctx, id)
		if err == nil && sn+hib == 0 {
			return 0
		}
		if time.Now().After(deadline) || sleep(ctx, to.poll) != nil {
			log.Warn("stopping a node whose snapshots or hibernations are not all durable yet: they wait for it to come back",
				"node_id", id, "uploading_snapshots", sn, "local_hibernations", hib, "err", err)
			return sn + hib
		}
	}
}

// waitNodeReady waits until node id registered after since and is ready
// (its reconcile done), while p runs.
func waitNodeReady(ctx context.Context, a adminAPI, p Proc, id string, since time.Time, to upgradeTimeouts) error {
	deadline := time.Now().Add(to.ready)
	last := "no answer"
	for {
		ns, err := a.node(ctx, id)
		if err == nil && ns.State == "ready" && ns.heartbeatAfter(since) {
			return nil
		}
		if err != nil {
			last = err.Error()
		} else {
			last = ns.State
		}
		if !p.alive() {
			return fmt.Errorf("%s exited after its start; its log %s ends with:\n%s", p.Name, p.Log, tail(p.Log, 3000))
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("%s did not register as ready within %s (last: %s): %w", p.Name, to.ready, last, errdefs.ErrUnavailable)
		}
		if err := sleep(ctx, to.poll); err != nil {
			return err
		}
	}
}

// upgradeReplica replaces API replica st.Processes[i] and waits until it
// answers /health (which it does once it has read the node registry).
func upgradeReplica(ctx context.Context, st *State, i int, exe string, log *slog.Logger, to upgradeTimeouts) (UpgradeStep, error) {
	name := st.Processes[i].Name
	step := UpgradeStep{Name: name, Began: time.Now(), Stopped: time.Now()}
	p, err := replaceProc(ctx, st, i, exe)
	if err != nil {
		return step, err
	}
	if err := waitHTTP(ctx, p, st.APIURLs[apiIndex(name)]+"/health", "", to.ready); err != nil {
		return step, err
	}
	step.Ready = time.Now()
	step.Done = step.Ready
	log.Info("API replica replaced", "name", name, "pid", p.PID, "down", step.Ready.Sub(step.Stopped).Round(time.Millisecond))
	return step, nil
}

// sharedStore says whether node n was given a blob store (its last
// --blob-store is not "none"): then its snapshots and hibernations
// become durable, and resume on other nodes.
func sharedStore(n Node) bool {
	v := ""
	for j, a := range n.PurgeArgs {
		if a == "--blob-store" && j+1 < len(n.PurgeArgs) {
			v = n.PurgeArgs[j+1]
		} else if s, ok := strings.CutPrefix(a, "--blob-store="); ok {
			v = s
		}
	}
	return v != "" && v != "none"
}

// retry calls f until it succeeds, fails for good, or d passes.
func retry(ctx context.Context, d, every time.Duration, f func() error) error {
	deadline := time.Now().Add(d)
	for {
		err := f()
		if err == nil || !retryable(err) || time.Now().After(deadline) {
			return err
		}
		if err := sleep(ctx, every); err != nil {
			return err
		}
	}
}

func sleep(ctx context.Context, d time.Duration) error {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-t.C:
		return nil
	}
}

package store

import (
	"context"
	"fmt"
	"math"
	"strconv"
	"strings"
	"time"

	"github.com/spore-run/spore/internal/errdefs"
)

// Quotas are a team's limits (docs/teams.md); 0 is no limit. The store
// enforces them in the transaction that writes what they count, so every
// replica sees one decision.
type Quotas struct {
	// Sandboxes, VCPUs and MemoryMB bound the sandboxes that hold a
	// host's resources: creating, running or paused in memory
	// (hibernated ones hold only storage).
	Sandboxes int   `json:"sandboxes,omitempty"`
	VCPUs     int   `json:"vcpus,omitempty"`
	MemoryMB  int64 `json:"memoryMB,omitempty"`
	// SnapshotBytes bounds the sizes of the team's snapshots; a new
	// snapshot that would pass it is refused (hibernations are counted,
	// never refused: they free a host).
	SnapshotBytes int64 `json:"snapshotBytes,omitempty"`
	// VolumeBytes bounds the sum of the team's volumes' sizes.
	VolumeBytes int64 `json:"volumeBytes,omitempty"`
	// CreatesPerMinute bounds the sandboxes the team creates (a create,
	// each fork child, a restore into a new sandbox) in any minute.
	CreatesPerMinute int `json:"createsPerMinute,omitempty"`
}

// Zero reports whether q limits nothing.
func (q Quotas) Zero() bool { return q == Quotas{} }

// Validate refuses a negative limit.
func (q Quotas) Validate() error {
	for _, v := range []struct {
		name string
		n    int64
	}{{"sandboxes", int64(q.Sandboxes)}, {"vcpus", int64(q.VCPUs)}, {"memoryMB", q.MemoryMB},
		{"snapshotBytes", q.SnapshotBytes}, {"volumeBytes", q.VolumeBytes}, {"createsPerMinute", int64(q.CreatesPerMinute)}} {
		if v.n < 0 {
			return errdefs.Invalidf("quota %s is %d: a quota is 0 (no limit) or more", v.name, v.n)
		}
	}
	return nil
}

// TeamUsage is what a team holds now, as its quotas count it.
type TeamUsage struct {
	Sandboxes     int   `json:"sandboxes"` // creating, running or paused in memory
	Hibernated    int   `json:"hibernated"`
	VCPUs         int   `json:"vcpus"`
	MemoryMB      int64 `json:"memoryMB"`
	Snapshots     int   `json:"snapshots"`
	SnapshotBytes int64 `json:"snapshotBytes"`
	Volumes       int   `json:"volumes"`
	VolumeBytes   int64 `json:"volumeBytes"` // their sizes' sum
	// CreatesLastMinute is the sliding estimate CreatesPerMinute is
	// held to (see Rate).
	CreatesLastMinute int `json:"createsLastMinute"`
}

// The size a sandbox is charged when its row names none (the default
// templates' limits): the placement's defaults too.
const (
	DefaultVCPUs    = 2
	DefaultMemoryMB = 1024
)

// Charge is what a sandbox row counts against its team's quotas.
type Charge struct {
	Sandboxes int
	VCPUs     int
	MemoryMB  int64
}

// ChargeOf is sb's charge: nothing unless it belongs to a team and holds
// a host's resources (creating, running, paused in memory).
func ChargeOf(sb Sandbox) Charge {
	if sb.TeamID == "" {
		return Charge{}
	}
	switch sb.State {
	case StateCreating, StateRunning, StatePaused:
	default:
		return Charge{}
	}
	return Charge{Sandboxes: 1, VCPUs: VCPUsOf(sb), MemoryMB: MemoryOf(sb)}
}

// VCPUsOf and MemoryOf are a row's size, the defaults where it names none.
func VCPUsOf(sb Sandbox) int {
	if sb.CPUCount > 0 {
		return sb.CPUCount
	}
	return DefaultVCPUs
}

// MemoryOf: see VCPUsOf.
func MemoryOf(sb Sandbox) int64 {
	if sb.MemoryMB > 0 {
		return int64(sb.MemoryMB)
	}
	return DefaultMemoryMB
}

// Grows reports whether writing next over prev (nil: a new row) adds to
// next's team's charge, so the write must be checked against its quotas;
// creates reports whether it is a sandbox the team creates (a new row,
// or a pooled one claimed), which counts against CreatesPerMinute.
func Grows(prev *Sandbox, next Sandbox) (grows, creates bool) {
	c := ChargeOf(next)
	if c.Sandboxes == 0 {
		return false, false
	}
	if prev == nil || prev.TeamID != next.TeamID {
		return true, true
	}
	p := ChargeOf(*prev)
	return c.Sandboxes > p.Sandboxes || c.VCPUs > p.VCPUs || c.MemoryMB > p.MemoryMB, false
}

// QuotaError is a write refused by a team's quota: 403 for a size, 429
// for the create rate (errdefs kinds Permission and ResourceLimit).
type QuotaError struct {
	Team  string
	Quota string // the Quotas field's JSON name
	Limit int64
	Use   int64 // what the team holds (or created in the last minute)
	Add   int64 // what the write asked for
}

func (e *QuotaError) Error() string {
	if e.Quota == "createsPerMinute" {
		return fmt.Sprintf("team %s is over its quota createsPerMinute: %d sandboxes a minute (%d created in the last minute); try again shortly", e.Team, e.Limit, e.Use)
	}
	return fmt.Sprintf("team %s is over its quota %s: %d, with %d in use and %d more asked", e.Team, e.Quota, e.Limit, e.Use, e.Add)
}

// Unwrap gives the error's kind.
func (e *QuotaError) Unwrap() error {
	if e.Quota == "createsPerMinute" {
		return errdefs.ErrResourceLimit
	}
	return errdefs.ErrPermission
}

// CheckCharge refuses adding add to use under q (the first quota it
// passes, by name).
func CheckCharge(team string, q Quotas, use TeamUsage, add Charge) error {
	for _, c := range []struct {
		name       string
		limit, use int64
		add        int64
	}{
		{"sandboxes", int64(q.Sandboxes), int64(use.Sandboxes), int64(add.Sandboxes)},
		{"vcpus", int64(q.VCPUs), int64(use.VCPUs), int64(add.VCPUs)},
		{"memoryMB", q.MemoryMB, use.MemoryMB, add.MemoryMB},
	} {
		if c.limit > 0 && c.add > 0 && c.use+c.add > c.limit {
			return &QuotaError{Team: team, Quota: c.name, Limit: c.limit, Use: c.use, Add: c.add}
		}
	}
	return nil
}

// Rate is a team's create counter: a sliding estimate over a minute from
// the count of this fixed minute and the last one (the last weighs what
// of it still lies within the past 60 s). It moves in the store's write
// transaction, so replicas share it.
type Rate struct {
	Minute int64 // Unix minute of Count
	Count  int   // creates in Minute
	Prev   int   // creates in Minute-1
}

// At is r seen at now: the counts moved on if minutes passed.
func (r Rate) At(now time.Time) Rate {
	m := now.Unix() / 60
	switch {
	case m == r.Minute:
		return r
	case m == r.Minute+1:
		return Rate{Minute: m, Prev: r.Count}
	default:
		return Rate{Minute: m}
	}
}

// Estimate is the creates of the last 60 s as of now (r already At now).
func (r Rate) Estimate(now time.Time) int {
	into := float64(now.UnixMilli()%60000) / 60000
	return r.Count + int(float64(r.Prev)*(1-into)+0.5)
}

// Take counts n creates at now under limit (0: none), or refuses them
// with a QuotaError, r unchanged.
func (r Rate) Take(team string, now time.Time, n, limit int) (Rate, error) {
	r = r.At(now)
	if limit > 0 {
		if est := r.Estimate(now); est+n > limit {
			return r, &QuotaError{Team: team, Quota: "createsPerMinute", Limit: int64(limit), Use: int64(est), Add: int64(n)}
		}
	}
	r.Count += n
	return r, nil
}

// CheckBytes refuses adding add bytes to use under limit (0: none).
func CheckBytes(team, quota string, limit, use, add int64) error {
	if limit > 0 && add > 0 && use+add > limit {
		return &QuotaError{Team: team, Quota: quota, Limit: limit, Use: use, Add: add}
	}
	return nil
}

// Beyond is what c charges more than p, dimension by dimension (never
// less than 0): what a write of c over p adds.
func (c Charge) Beyond(p Charge) Charge {
	return Charge{Sandboxes: max(0, c.Sandboxes-p.Sandboxes), VCPUs: max(0, c.VCPUs-p.VCPUs), MemoryMB: max(0, c.MemoryMB-p.MemoryMB)}
}

// QuotaTx is what a store's write transaction answers for ChargeSandbox
// and ChargeBytes: the reads (and the rate's write) each store makes in
// its own SQL, the rules being these functions'.
type QuotaTx interface {
	// TeamQuotas reads a team's quotas (ErrNotFound: no such team).
	TeamQuotas(ctx context.Context, team string) (Quotas, error)
	// HoldTeam serializes quota checks of one team until the
	// transaction ends (a no-op where transactions already are).
	HoldTeam(ctx context.Context, team string) error
	SandboxUse(ctx context.Context, team string) (TeamUsage, error)
	// BytesUse sums the sizes quota ("snapshotBytes", "volumeBytes")
	// counts for team, but the row except's.
	BytesUse(ctx context.Context, quota, team, except string) (int64, error)
	CreateRate(ctx context.Context, team string) (Rate, error)
	SetCreateRate(ctx context.Context, team string, r Rate) error
}

// ChargeSandbox checks writing next over prev (nil: a new row) against
// next's team's quotas, in q's transaction, and counts a create in the
// team's rate; a sandbox charged to a team that does not exist is
// ErrNotFound.
func ChargeSandbox(ctx context.Context, q QuotaTx, now time.Time, prev *Sandbox, next Sandbox) error {
	grows, creates := Grows(prev, next)
	if !grows {
		return nil
	}
	team := next.TeamID
	qs, err := q.TeamQuotas(ctx, team)
	if err != nil || qs.Zero() {
		return err
	}
	if err := q.HoldTeam(ctx, team); err != nil {
		return err
	}
	var p Charge
	if prev != nil && prev.TeamID == team {
		p = ChargeOf(*prev)
	}
	use, err := q.SandboxUse(ctx, team)
	if err != nil {
		return err
	}
	if err := CheckCharge(team, qs, use, ChargeOf(next).Beyond(p)); err != nil {
		return err
	}
	if !creates || qs.CreatesPerMinute == 0 {
		return nil
	}
	r, err := q.CreateRate(ctx, team)
	if err != nil {
		return err
	}
	if r, err = r.Take(team, now, 1, qs.CreatesPerMinute); err != nil {
		return err
	}
	return q.SetCreateRate(ctx, team, r)
}

// ChargeBytes checks a snapshot's or a volume's row (id, size) against
// its team's quota ("snapshotBytes" or "volumeBytes"), in q's
// transaction; prevSize is the stored row's size (-1: a new row). A team
// that does not exist has no quota (only a sandbox needs its team).
func ChargeBytes(ctx context.Context, q QuotaTx, team, quota, id string, prevSize, size int64) error {
	if team == "" || size <= max(prevSize, 0) {
		return nil
	}
	qs, err := q.TeamQuotas(ctx, team)
	if errdefs.IsNotFound(err) {
		return nil
	}
	if err != nil {
		return err
	}
	limit := qs.SnapshotBytes
	if quota == "volumeBytes" {
		limit = qs.VolumeBytes
	}
	if limit == 0 {
		return nil
	}
	if err := q.HoldTeam(ctx, team); err != nil {
		return err
	}
	used, err := q.BytesUse(ctx, quota, team, id)
	if err != nil {
		return err
	}
	return CheckBytes(team, quota, limit, used, size)
}

// QuotaNames are the quotas' names in ParseQuotas (the CLI's flags).
var QuotaNames = []string{"sandboxes", "vcpus", "memory-mb", "snapshot-bytes", "volume-bytes", "creates-per-minute"}

// ParseQuotas reads quotas written as the CLI's flags are named,
// "sandboxes=20,vcpus=40,memory-mb=40960,snapshot-bytes=10737418240,
// volume-bytes=...,creates-per-minute=120" (any of them; "" none).
func ParseQuotas(spec string) (Quotas, error) {
	var q Quotas
	if strings.TrimSpace(spec) == "" {
		return q, nil
	}
	seen := map[string]bool{}
	for _, part := range strings.Split(spec, ",") {
		k, v, ok := strings.Cut(strings.TrimSpace(part), "=")
		n, err := strconv.ParseInt(strings.TrimSpace(v), 10, 64)
		if !ok || err != nil || n < 0 {
			return Quotas{}, errdefs.Invalidf("quota %q: want NAME=N, N a whole number of 0 or more (names: %s)", part, strings.Join(QuotaNames, ", "))
		}
		k = strings.TrimSpace(k)
		if seen[k] {
			return Quotas{}, errdefs.Invalidf("quota %s given twice", k)
		}
		seen[k] = true
		switch k {
		case "sandboxes":
			q.Sandboxes = int(min(n, math.MaxInt32))
		case "vcpus":
			q.VCPUs = int(min(n, math.MaxInt32))
		case "memory-mb":
			q.MemoryMB = n
		case "snapshot-bytes":
			q.SnapshotBytes = n
		case "volume-bytes":
			q.VolumeBytes = n
		case "creates-per-minute":
			q.CreatesPerMinute = int(min(n, math.MaxInt32))
		default:
			return Quotas{}, errdefs.Invalidf("no quota %q (names: %s)", k, strings.Join(QuotaNames, ", "))
		}
	}
	return q, nil
}

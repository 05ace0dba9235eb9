package store

import (
	"context"
	"encoding/base64"
	"strconv"
	"strings"
	"time"

	"github.com/spore-run/spore/internal/errdefs"
)

// Audit record kinds.
const (
	AuditAPI     = "api"     // a state-changing API call
	AuditSandbox = "sandbox" // a sandbox's lifecycle event
	AuditEgress  = "egress"  // a sandbox's egress summary, when it ended
)

// AuditRecord is one entry of the audit trail (docs/teams.md): who (team
// and key), what (action and resource), the outcome, when and from
// where. Records are only appended, and outlive what they name.
type AuditRecord struct {
	Seq     int64     `json:"seq"` // set by the store, increasing
	At      time.Time `json:"at"`
	TeamID  string    `json:"teamID,omitempty"`
	KeyID   string    `json:"keyID,omitempty"`
	KeyName string    `json:"keyName,omitempty"`
	Kind    string    `json:"kind"`
	// Action is the route ("POST /v2/sandboxes") of an API call, or the
	// event ("sandbox.created", "sandbox.killed", "egress.summary").
	Action   string `json:"action"`
	Resource string `json:"resource,omitempty"` // the ID it acted on
	Status   int    `json:"status,omitempty"`   // an API call's HTTP status
	Remote   string `json:"remote,omitempty"`   // the caller's address
	Detail   string `json:"detail,omitempty"`
}

// AuditFilter selects audit records, newest first.
type AuditFilter struct {
	TeamID   string // "": every team's (operators)
	Resource string
	Since    time.Time // at or after (zero: no bound)
	Until    time.Time // before (zero: no bound)
	Limit    int
	Cursor   string
}

// MaxAuditPage bounds one ListAudit page.
const MaxAuditPage = 1000

// Audits is the audit trail.
type Audits interface {
	// AppendAudit adds records (Seq set by the store) in one transaction.
	AppendAudit(ctx context.Context, recs []AuditRecord) error
	// ListAudit returns records newest first (by At, then Seq), at most
	// Limit (<= 0 or over MaxAuditPage: MaxAuditPage), and the cursor of
	// the next page ("" at the end); a malformed cursor is
	// ErrInvalidArgument.
	ListAudit(ctx context.Context, f AuditFilter) ([]AuditRecord, string, error)
	// PruneAudit deletes at most limit records older than before and
	// returns how many it deleted.
	PruneAudit(ctx context.Context, before time.Time, limit int) (int, error)
}

// EncodeAuditCursor is the paging token that continues after the record
// at (ms) and seq, in ListAudit's order.
func EncodeAuditCursor(atMS, seq int64) string {
	return base64.RawURLEncoding.EncodeToString([]byte("audit:" + strconv.FormatInt(atMS, 10) + ":" + strconv.FormatInt(seq, 10)))
}

// DecodeAuditCursor reads EncodeAuditCursor's token ("": the start, ok
// false); anything else is ErrInvalidArgument.
func DecodeAuditCursor(c string) (atMS, seq int64, ok bool, err error) {
	if c == "" {
		return 0, 0, false, nil
	}
	if b, err := base64.RawURLEncoding.DecodeString(c); err == nil {
		if v, found := strings.CutPrefix(string(b), "audit:"); found {
			a, s, found := strings.Cut(v, ":")
			at, err1 := strconv.ParseInt(a, 10, 64)
			sq, err2 := strconv.ParseInt(s, 10, 64)
			if found && err1 == nil && err2 == nil && sq >= 0 {
				return at, sq, true, nil
			}
		}
	}
	return 0, 0, false, errdefs.Invalidf("malformed paging token %q", c)
}

// AuditLimit is f's page size.
func (f AuditFilter) AuditLimit() int {
	if f.Limit <= 0 || f.Limit > MaxAuditPage {
		return MaxAuditPage
	}
	return f.Limit
}

// AuditColumns are the columns ListAudit reads, in ScanAudit's order.
const AuditColumns = `seq, at, team_id, key_id, key_name, kind, action, resource, status, remote, detail`

// AuditQuery is ListAudit's statement for f, with "?" for its arguments
// (a store numbers them as its driver needs): newest first, one row more
// than the page, to tell whether another follows (AuditPage).
func AuditQuery(f AuditFilter) (string, []any, error) {
	cAt, cSeq, after, err := DecodeAuditCursor(f.Cursor)
	if err != nil {
		return "", nil, err
	}
	var conds []string
	var args []any
	add := func(c string, a ...any) { conds = append(conds, c); args = append(args, a...) }
	if f.TeamID != "" {
		add("team_id = ?", f.TeamID)
	}
	if f.Resource != "" {
		add("resource = ?", f.Resource)
	}
	if !f.Since.IsZero() {
		add("at >= ?", f.Since.UnixMilli())
	}
	if !f.Until.IsZero() {
		add("at < ?", f.Until.UnixMilli())
	}
	if after {
		add("(at, seq) < (?, ?)", cAt, cSeq)
	}
	q := `SELECT ` + AuditColumns + ` FROM audit`
	if len(conds) > 0 {
		q += " WHERE " + strings.Join(conds, " AND ")
	}
	return q + " ORDER BY at DESC, seq DESC LIMIT " + strconv.Itoa(f.AuditLimit()+1), args, nil
}

// ScanAudit reads one row of AuditColumns.
func ScanAudit(sc interface{ Scan(...any) error }) (AuditRecord, error) {
	var r AuditRecord
	var at int64
	err := sc.Scan(&r.Seq, &at, &r.TeamID, &r.KeyID, &r.KeyName, &r.Kind, &r.Action, &r.Resource, &r.Status, &r.Remote, &r.Detail)
	r.At = time.UnixMilli(at).UTC()
	return r, err
}

// AuditPage trims the rows AuditQuery read to f's page and names the
// next page's cursor ("" when none follows).
func AuditPage(rows []AuditRecord, f AuditFilter) ([]AuditRecord, string) {
	limit := f.AuditLimit()
	if len(rows) <= limit {
		return rows, ""
	}
	rows = rows[:limit]
	last := rows[limit-1]
	return rows, EncodeAuditCursor(last.At.UnixMilli(), last.Seq)
}

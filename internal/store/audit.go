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

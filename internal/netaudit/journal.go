// Package netaudit records every outbound connection attempt of a
// sandbox (allowed or denied, where to, the name when the egress proxy
// saw one, bytes each way) in a node-local journal kept after the sandbox
// is gone, for a retention period.
//
// Where entries come from, per gateway namespace (Collector):
//   - denied attempts: the gateway's egress chain logs each new
//     connection it drops (rate-limited) to an NFLOG group with the rule's
//     name as prefix; a netlink socket in the namespace reads them;
//   - allowed connections: the namespace's connection tracking reports
//     each flow it confirms (NEW) and ends (DESTROY, with byte counters:
//     accounting is switched on in the namespace); a flow still open when
//     the sandbox's network goes is written with its bytes so far;
//   - connections to ports 80 and 443 under domain rules: the egress proxy
//     (which sees the name) reports them, and their redirected flows are
//     left out of the tracking's.
//
// Each sandbox's journal is bounded on disk (JournalConfig.MaxBytes): an
// append that would pass the bound first rewrites the file without its
// oldest half, under a first entry saying how many entries went
// (DroppedRule). A query reads the file line by line and keeps only the
// entries it returns.
package netaudit

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"time"

	"github.com/spore-run/spore/internal/errdefs"
	"github.com/spore-run/spore/internal/ids"
)

// Entry is one outbound connection attempt.
type Entry struct {
	At       time.Time  `json:"at"`            // the attempt (or the flow's start)
	End      *time.Time `json:"end,omitempty"` // when the connection ended (allowed ones)
	Proto    string     `json:"proto"`         // tcp, udp, icmp, or a protocol number
	Dst      string     `json:"dst"`           // address:port (address alone without ports)
	Domain   string     `json:"domain,omitempty"`
	Allowed  bool       `json:"allowed"`
	Rule     string     `json:"rule,omitempty"` // what decided: "floor", "deny", "internet off", or the egress proxy's rule
	Reason   string     `json:"reason,omitempty"`
	BytesOut int64      `json:"bytesOut"` // sandbox -> destination
	BytesIn  int64      `json:"bytesIn"`  // destination -> sandbox
	Open     bool       `json:"open,omitempty"`
	// Dropped, on the first line of a journal that reached its bound
	// (Rule DroppedRule), is how many older entries were dropped.
	Dropped int64 `json:"dropped,omitempty"`
}

// DroppedRule is the Rule of the entry a journal that reached its bound
// starts with: its Reason says how many older entries were dropped (the
// API shows it as any other entry), its Dropped counts them.
const DroppedRule = "dropped"

// DefaultRetention is how long a sandbox's journal is kept after its
// last entry.
const DefaultRetention = 7 * 24 * time.Hour

// DefaultMaxBytes bounds one sandbox's journal on disk: an append that
// would take it past the bound first drops its oldest entries
// (compact). A sandbox opening connections all day writes a few hundred
// bytes per attempt, so 16 MiB holds tens of thousands of them.
const DefaultMaxBytes = 16 << 20

// MinMaxBytes is the smallest bound a journal takes: room for the
// first line saying what was dropped and some entries.
const MinMaxBytes = 4 << 10

// MaxQuery bounds the entries one query returns.
const MaxQuery = 10000

// JournalConfig tunes a journal.
type JournalConfig struct {
	// Retention is how long a sandbox's journal is kept after its last
	// entry; <= 0 is DefaultRetention.
	Retention time.Duration
	// MaxBytes bounds each sandbox's journal file; <= 0 is
	// DefaultMaxBytes, under MinMaxBytes is refused.
	MaxBytes int64
}

// Journal is a directory of per-sandbox JSON-lines files.
type Journal struct {
	dir       string
	retention time.Duration
	maxBytes  int64
	now       func() time.Time

	mu    sync.Mutex                // guards open
	open  map[string]func() []Entry // live sources of open entries, by sandbox
	locks keyedLocks                // one per sandbox: its file's appends, rewrites and removal
}

// OpenJournal opens (creating) the journal in dir; retention <= 0 is
// DefaultRetention; each sandbox's file is bounded by DefaultMaxBytes.
func OpenJournal(dir string, retention time.Duration) (*Journal, error) {
	return OpenJournalConfig(dir, JournalConfig{Retention: retention})
}

// OpenJournalConfig opens (creating) the journal in dir with cfg. A
// temporary file a crash left in the middle of a rewrite (compact) is
// removed: the journal it was to replace is still whole.
func OpenJournalConfig(dir string, cfg JournalConfig) (*Journal, error) {
	if cfg.Retention <= 0 {
		cfg.Retention = DefaultRetention
	}
	if cfg.MaxBytes <= 0 {
		cfg.MaxBytes = DefaultMaxBytes
	}
	if cfg.MaxBytes < MinMaxBytes {
		return nil, errdefs.Invalidf("egress journal: a bound of %d bytes per sandbox is under the minimum of %d", cfg.MaxBytes, MinMaxBytes)
	}
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, fmt.Errorf("egress journal: %w", err)
	}
	if err := removeTemps(dir); err != nil {
		return nil, fmt.Errorf("egress journal: %w", err)
	}
	return &Journal{dir: dir, retention: cfg.Retention, maxBytes: cfg.MaxBytes, now: time.Now, open: map[string]func() []Entry{}}, nil
}

// Retention is how long a journal outlives its last entry.
func (j *Journal) Retention() time.Duration { return j.retention }

func (j *Journal) path(sandboxID string) string { return filepath.Join(j.dir, sandboxID+".jsonl") }

// Append adds entries to a sandbox's journal. One that would take the
// file past its bound drops the oldest entries first (compact).
func (j *Journal) Append(sandboxID string, es ...Entry) error {
	if len(es) == 0 {
		return nil
	}
	if err := ids.Validate("sandbox ID", sandboxID); err != nil {
		return err
	}
	var buf bytes.Buffer
	enc := json.NewEncoder(&buf)
	for _, e := range es {
		e.At = e.At.UTC()
		if err := enc.Encode(e); err != nil {
			return err
		}
	}
	unlock := j.locks.lock(sandboxID)
	defer unlock()
	f, err := os.OpenFile(j.path(sandboxID), os.O_CREATE|os.O_RDWR|os.O_APPEND, 0o600)
	if err != nil {
		return fmt.Errorf("egress journal: %w", err)
	}
	defer f.Close()
	fi, err := f.Stat()
	if err != nil {
		return fmt.Errorf("egress journal: %w", err)
	}
	if fi.Size()+int64(buf.Len()) > j.maxBytes {
		return j.compact(sandboxID, f, fi.Size(), buf.Bytes())
	}
	if torn(f, fi.Size()) {
		// A crash mid-write left a torn last line: it ends here, or it
		// would swallow the first new entry.
		if _, err := f.Write([]byte{'\n'}); err != nil {
			return fmt.Errorf("egress journal: %w", err)
		}
	}
	if _, err := f.Write(buf.Bytes()); err != nil {
		return fmt.Errorf("egress journal: %w", err)
	}
	return nil
}

// torn says whether a journal of size bytes does not end with a newline.
func torn(f *os.File, size int64) bool {
	if size == 0 {
		return false
	}
	var last [1]byte
	_, err := f.ReadAt(last[:], size-1)
	return err == nil && last[0] != '\n'
}

// Live registers a source of a sandbox's open connections (shown by
// Query beside the journal's entries) until the returned func is called.
func (j *Journal) Live(sandboxID string, src func() []Entry) (remove func()) {
	j.mu.Lock()
	defer j.mu.Unlock()
	j.open[sandboxID] = src
	return func() {
		j.mu.Lock()
		defer j.mu.Unlock()
		delete(j.open, sandboxID)
	}
}

// Query returns a sandbox's entries at or after since, oldest first, at
// most limit (the newest limit when there are more; limit <= 0 or over
// MaxQuery: MaxQuery), connections still open last. A journal that
// reached its bound starts with an entry of Rule DroppedRule saying how
// many older entries went. A sandbox with no journal (never connected
// anywhere, or expired) is ErrNotFound. The journal is read line by line
// and only the newest limit entries are kept (read): memory is bounded by
// limit, not by the journal's size.
func (j *Journal) Query(sandboxID string, since time.Time, limit int) ([]Entry, error) {
	if err := ids.Validate("sandbox ID", sandboxID); err != nil {
		return nil, err
	}
	if limit <= 0 || limit > MaxQuery {
		limit = MaxQuery
	}
	j.mu.Lock()
	live := j.open[sandboxID]
	j.mu.Unlock()
	out, err := j.read(sandboxID, since, limit)
	if errors.Is(err, fs.ErrNotExist) {
		if live == nil {
			return nil, errdefs.NotFoundf("no egress journal for sandbox %s", sandboxID)
		}
		err = nil
	}
	if err != nil {
		return nil, fmt.Errorf("egress journal: %w", err)
	}
	if live != nil {
		for _, e := range live() {
			if !e.At.Before(since) {
				out = append(out, e)
			}
		}
	}
	if len(out) > limit {
		out = out[len(out)-limit:]
	}
	return out, nil
}

// Sweep deletes the journals whose last entry is older than the
// retention (by the file's modification time) and returns how many.
func (j *Journal) Sweep() (int, error) {
	ents, err := os.ReadDir(j.dir)
	if err != nil {
		return 0, err
	}
	cutoff := j.now().Add(-j.retention)
	n := 0
	for _, e := range ents {
		fi, err := e.Info()
		if err != nil || !fi.Mode().IsRegular() || filepath.Ext(e.Name()) != ".jsonl" || strings.HasPrefix(e.Name(), ".") {
			continue
		}
		if !fi.ModTime().Before(cutoff) {
			continue
		}
		id := strings.TrimSuffix(e.Name(), ".jsonl")
		j.mu.Lock()
		_, live := j.open[id]
		j.mu.Unlock()
		if live {
			continue
		}
		unlock := j.locks.lock(id)
		// Still old under its lock (an append meanwhile keeps it).
		if fi, err := os.Stat(filepath.Join(j.dir, e.Name())); err == nil && fi.ModTime().Before(cutoff) {
			if os.Remove(filepath.Join(j.dir, e.Name())) == nil {
				n++
			}
		}
		unlock()
	}
	return n, nil
}

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
package netaudit

import (
	"bufio"
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
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
}

// DefaultRetention is how long a sandbox's journal is kept after its
// last entry.
const DefaultRetention = 7 * 24 * time.Hour

// MaxQuery bounds the entries one query returns.
const MaxQuery = 10000

// Journal is a directory of per-sandbox JSON-lines files.
type Journal struct {
	dir       string
	retention time.Duration
	now       func() time.Time

	mu    sync.Mutex                // guards open and locks
	open  map[string]func() []Entry // live sources of open entries, by sandbox
	locks map[string]*sync.Mutex    // one per sandbox: its file's appends, reads and removal
}

// lockOf is a sandbox's file lock: appends to different sandboxes'
// journals do not wait for each other.
func (j *Journal) lockOf(sandboxID string) *sync.Mutex {
	j.mu.Lock()
	defer j.mu.Unlock()
	l := j.locks[sandboxID]
	if l == nil {
		l = &sync.Mutex{}
		j.locks[sandboxID] = l
	}
	return l
}

// OpenJournal opens (creating) the journal in dir; retention <= 0 is
// DefaultRetention.
func OpenJournal(dir string, retention time.Duration) (*Journal, error) {
	if retention <= 0 {
		retention = DefaultRetention
	}
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, fmt.Errorf("egress journal: %w", err)
	}
	return &Journal{dir: dir, retention: retention, now: time.Now, open: map[string]func() []Entry{}, locks: map[string]*sync.Mutex{}}, nil
}

// Retention is how long a journal outlives its last entry.
func (j *Journal) Retention() time.Duration { return j.retention }

func (j *Journal) path(sandboxID string) string { return filepath.Join(j.dir, sandboxID+".jsonl") }

// Append adds entries to a sandbox's journal.
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
	l := j.lockOf(sandboxID)
	l.Lock()
	defer l.Unlock()
	f, err := os.OpenFile(j.path(sandboxID), os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o600)
	if err != nil {
		return fmt.Errorf("egress journal: %w", err)
	}
	_, err = f.Write(buf.Bytes())
	return errors.Join(err, f.Close())
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
// MaxQuery: MaxQuery), connections still open last. A sandbox with no
// journal (never connected anywhere, or expired) is ErrNotFound.
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
	l := j.lockOf(sandboxID)
	l.Lock()
	b, err := os.ReadFile(j.path(sandboxID))
	l.Unlock()
	if errors.Is(err, fs.ErrNotExist) {
		if live == nil {
			return nil, errdefs.NotFoundf("no egress journal for sandbox %s", sandboxID)
		}
		err = nil
	}
	if err != nil {
		return nil, fmt.Errorf("egress journal: %w", err)
	}
	var out []Entry
	sc := bufio.NewScanner(bytes.NewReader(b))
	sc.Buffer(make([]byte, 0, 64<<10), 1<<20)
	for sc.Scan() {
		var e Entry
		if json.Unmarshal(sc.Bytes(), &e) != nil {
			continue // a torn last line (a crash mid-write)
		}
		if !e.At.Before(since) {
			out = append(out, e)
		}
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
		if err != nil || !fi.Mode().IsRegular() || filepath.Ext(e.Name()) != ".jsonl" {
			continue
		}
		if fi.ModTime().Before(cutoff) {
			id := e.Name()[:len(e.Name())-len(".jsonl")]
			j.mu.Lock()
			_, live := j.open[id]
			j.mu.Unlock()
			if live {
				continue
			}
			l := j.lockOf(id)
			l.Lock()
			// Still old under its lock (an append meanwhile keeps it).
			if fi, err := os.Stat(filepath.Join(j.dir, e.Name())); err == nil && fi.ModTime().Before(cutoff) {
				if os.Remove(filepath.Join(j.dir, e.Name())) == nil {
					n++
				}
			}
			l.Unlock()
			j.mu.Lock()
			delete(j.locks, id)
			j.mu.Unlock()
		}
	}
	return n, nil
}

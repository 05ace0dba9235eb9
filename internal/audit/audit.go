// Package audit writes the audit trail (docs/teams.md): records of API
// calls and sandbox events, appended to the store in batches by one
// goroutine, so a call pays for a channel send, not a database write.
// Records wait in memory at most FlushEvery (and Close writes what is
// left), so a replica stopped the usual way loses none; one killed at
// once loses what it had not written yet (at most FlushEvery's worth).
package audit

import (
	"context"
	"log/slog"
	"sync"
	"time"

	"github.com/spore-run/spore/internal/store"
)

// DefaultRetention is how long a record is kept unless configured.
const DefaultRetention = 90 * 24 * time.Hour

// PruneEvery is how often a server prunes the trail.
const PruneEvery = time.Hour

// RetentionOr is d, or DefaultRetention for 0.
func RetentionOr(d time.Duration) time.Duration {
	if d == 0 {
		return DefaultRetention
	}
	return d
}

// Defaults of Writer.
const (
	FlushEvery = 100 * time.Millisecond
	BatchMax   = 500
	queueLen   = 4096
)

// Recorder takes audit records (a nil Recorder is fine to call: see Record).
type Recorder interface {
	Record(r store.AuditRecord)
}

// Record sends r to rec unless rec is nil.
func Record(rec Recorder, r store.AuditRecord) {
	if rec != nil {
		rec.Record(r)
	}
}

type item struct {
	rec   store.AuditRecord
	flush chan error // a Flush's marker, not a record
}

// Writer appends records to the store in batches.
type Writer struct {
	st   store.Audits
	log  *slog.Logger
	now  func() time.Time
	ch   chan item
	done chan struct{}
	mu   sync.RWMutex // held shared by senders, exclusively by Close
	shut bool
}

// NewWriter starts a writer; Close it to write what is left.
func NewWriter(st store.Audits, log *slog.Logger) *Writer {
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	w := &Writer{st: st, log: log, now: time.Now, ch: make(chan item, queueLen), done: make(chan struct{})}
	go w.run()
	return w
}

// Record queues r (At now if zero). When the queue is full (the store
// slower than the calls) it waits: records are not dropped. After Close
// it writes r at once.
func (w *Writer) Record(r store.AuditRecord) {
	if r.At.IsZero() {
		r.At = w.now()
	}
	r.At = r.At.UTC()
	w.mu.RLock()
	if !w.shut {
		w.ch <- item{rec: r}
		w.mu.RUnlock()
		return
	}
	w.mu.RUnlock()
	w.write(context.Background(), []store.AuditRecord{r})
}

// Flush returns once every record queued before it is in the store.
func (w *Writer) Flush(ctx context.Context) error {
	done := make(chan error, 1)
	w.mu.RLock()
	if w.shut {
		w.mu.RUnlock()
		return nil
	}
	w.ch <- item{flush: done}
	w.mu.RUnlock()
	select {
	case err := <-done:
		return err
	case <-ctx.Done():
		return ctx.Err()
	}
}

// Close writes what is queued and stops the writer.
func (w *Writer) Close() error {
	w.mu.Lock()
	if w.shut {
		w.mu.Unlock()
		return nil
	}
	w.shut = true
	close(w.ch)
	w.mu.Unlock()
	<-w.done
	return nil
}

func (w *Writer) run() {
	defer close(w.done)
	var batch []store.AuditRecord
	tick := time.NewTicker(FlushEvery)
	defer tick.Stop()
	for {
		select {
		case it, ok := <-w.ch:
			if !ok {
				w.write(context.Background(), batch)
				return
			}
			if it.flush != nil {
				it.flush <- w.write(context.Background(), batch)
				batch = nil
				continue
			}
			batch = append(batch, it.rec)
			if len(batch) >= BatchMax {
				w.write(context.Background(), batch)
				batch = nil
			}
		case <-tick.C:
			if len(batch) > 0 {
				w.write(context.Background(), batch)
				batch = nil
			}
		}
	}
}

// write appends a batch, trying again (1 s apart, for a minute) while
// the store fails; what it cannot write then is logged, record by record.
func (w *Writer) write(ctx context.Context, batch []store.AuditRecord) error {
	if len(batch) == 0 {
		return nil
	}
	var err error
	for try := 0; try < 60; try++ {
		if err = w.st.AppendAudit(ctx, batch); err == nil {
			return nil
		}
		w.log.Warn("audit: append failed; trying again", "records", len(batch), "err", err)
		time.Sleep(time.Second)
	}
	for _, r := range batch {
		w.log.Error("audit record lost (the store refused it for a minute)", "at", r.At, "team_id", r.TeamID, "key_id", r.KeyID,
			"action", r.Action, "resource", r.Resource, "status", r.Status, "err", err)
	}
	return err
}

// Prune deletes records older than retention, in batches, every every,
// until ctx ends. Every replica may run it: deleting is idempotent.
func Prune(ctx context.Context, st store.Audits, retention, every time.Duration, log *slog.Logger) {
	if retention <= 0 {
		return
	}
	t := time.NewTicker(every)
	defer t.Stop()
	for {
		PruneOnce(ctx, st, time.Now().Add(-retention), log)
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

// PruneOnce deletes every record older than before, 10000 at a time.
func PruneOnce(ctx context.Context, st store.Audits, before time.Time, log *slog.Logger) int {
	total := 0
	for ctx.Err() == nil {
		n, err := st.PruneAudit(ctx, before, 10000)
		total += n
		if err != nil {
			if log != nil {
				log.Warn("audit: prune failed", "err", err)
			}
			break
		}
		if n < 10000 {
			break
		}
	}
	if total > 0 && log != nil {
		log.Info("audit: pruned", "records", total, "before", before)
	}
	return total
}

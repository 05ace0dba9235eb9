package audit

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/spore-run/spore/internal/store"
)

// memAudits is an in-memory store.Audits that can fail its next appends.
type memAudits struct {
	mu      sync.Mutex
	recs    []store.AuditRecord
	batches int
	failing int // appends to refuse
}

func (m *memAudits) AppendAudit(_ context.Context, recs []store.AuditRecord) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.failing > 0 {
		m.failing--
		return errors.New("store down")
	}
	m.batches++
	m.recs = append(m.recs, recs...)
	return nil
}

func (m *memAudits) ListAudit(context.Context, store.AuditFilter) ([]store.AuditRecord, string, error) {
	return nil, "", nil
}

func (m *memAudits) PruneAudit(context.Context, time.Time, int) (int, error) { return 0, nil }

func (m *memAudits) got() []store.AuditRecord {
	m.mu.Lock()
	defer m.mu.Unlock()
	return append([]store.AuditRecord(nil), m.recs...)
}

// Records arrive in order, in batches, stamped; Flush waits for what was
// queued before it; Close writes the rest; a record after Close is
// written at once.
func TestWriterKeepsEveryRecordInOrder(t *testing.T) {
	m := &memAudits{}
	w := NewWriter(m, nil)
	for i := range 1200 {
		w.Record(store.AuditRecord{Action: fmt.Sprint(i)})
	}
	if err := w.Flush(context.Background()); err != nil {
		t.Fatal(err)
	}
	got := m.got()
	if len(got) != 1200 {
		t.Fatalf("%d records after a flush, want 1200", len(got))
	}
	for i, r := range got {
		if r.Action != fmt.Sprint(i) || r.At.IsZero() || r.At.Location() != time.UTC {
			t.Fatalf("record %d = %+v", i, r)
		}
	}
	if m.batches >= 1200 || m.batches < 3 {
		t.Fatalf("%d batches for 1200 records (at most %d each)", m.batches, BatchMax)
	}
	w.Record(store.AuditRecord{Action: "last"})
	w.Close()
	w.Record(store.AuditRecord{Action: "after close"})
	if got := m.got(); len(got) != 1202 || got[1200].Action != "last" || got[1201].Action != "after close" {
		t.Fatalf("after close: %d records", len(got))
	}
	if err := w.Close(); err != nil {
		t.Fatal(err)
	}
}

// A store that fails for a while loses nothing: the batch is tried again.
func TestWriterRetries(t *testing.T) {
	m := &memAudits{failing: 2}
	w := NewWriter(m, nil)
	defer w.Close()
	w.Record(store.AuditRecord{Action: "a"})
	if err := w.Flush(context.Background()); err != nil {
		t.Fatal(err)
	}
	if got := m.got(); len(got) != 1 || got[0].Action != "a" {
		t.Fatalf("after two failed appends: %+v", got)
	}
}

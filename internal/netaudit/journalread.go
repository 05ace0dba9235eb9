package netaudit

import (
	"bufio"
	"bytes"
	"encoding/json"
	"errors"
	"io"
	"os"
	"time"
)

// maxLine bounds a journal line: a longer one is no entry Append wrote
// (an entry is a few hundred bytes) and is skipped.
const maxLine = 64 << 10

// read returns the newest limit entries of a sandbox's journal at or
// after since, oldest first. One pass over the file keeps where the
// newest limit lines that qualify are (a ring of offsets; a line's time
// is read without decoding it), then a second pass from the first of them
// reads and decodes only those lines: the
// memory a query takes is bounded by limit, whatever the journal's size
// (TestQueryMemoryIsBoundedByLimit, BenchmarkQuery). Before, the whole
// file was read into memory and every line decoded.
//
// The file is read up to its size when opened: what is appended meanwhile
// is the next query's, and a rewrite (compact) renames a new file over
// the path without touching the one this reads. A last line without its
// newline (torn by a crash mid-write) and lines that are not entries
// are skipped.
func (j *Journal) read(sandboxID string, since time.Time, limit int) ([]Entry, error) {
	f, err := os.Open(j.path(sandboxID))
	if err != nil {
		return nil, err
	}
	defer f.Close()
	fi, err := f.Stat()
	if err != nil {
		return nil, err
	}
	ring := spanRing{max: limit}
	br := bufio.NewReaderSize(io.NewSectionReader(f, 0, fi.Size()), maxLine)
	var off int64
	for {
		line, err := br.ReadSlice('\n')
		start := off
		off += int64(len(line))
		if errors.Is(err, bufio.ErrBufferFull) {
			for errors.Is(err, bufio.ErrBufferFull) { // skip the rest of an overlong line
				line, err = br.ReadSlice('\n')
				off += int64(len(line))
			}
			if err == nil {
				continue
			}
		}
		if err == io.EOF {
			break
		}
		if err != nil {
			return nil, err
		}
		if at, ok := lineTime(line); ok && !at.Before(since) && wellFormed(line) {
			ring.push(span{off: start, n: len(line)})
		}
	}
	out := make([]Entry, 0, len(ring.s))
	if len(ring.s) == 0 {
		return out, nil
	}
	// The kept lines, in file order, read in one sequential pass from the
	// first (the reader's buffer again), skipping what lies between.
	pos := ring.at(0).off
	br.Reset(io.NewSectionReader(f, pos, fi.Size()-pos))
	var b []byte
	for i := range ring.s {
		s := ring.at(i)
		if _, err := br.Discard(int(s.off - pos)); err != nil {
			return nil, err
		}
		if cap(b) < s.n {
			b = make([]byte, s.n)
		}
		b = b[:s.n]
		if _, err := io.ReadFull(br, b); err != nil {
			return nil, err
		}
		pos = s.off + int64(s.n)
		var e Entry
		if json.Unmarshal(b, &e) == nil {
			out = append(out, e)
		}
	}
	return out, nil
}

// lineTime is the time of a journal line: read from its first field as
// Append writes it (`{"at":"<RFC 3339>",`) without allocating, else by
// decoding that field.
func lineTime(line []byte) (time.Time, bool) {
	const prefix = `{"at":`
	var t time.Time
	if rest, ok := bytes.CutPrefix(line, []byte(prefix)); ok && len(rest) > 1 && rest[0] == '"' {
		if end := bytes.IndexByte(rest[1:], '"'); end >= 0 && t.UnmarshalJSON(rest[:end+2]) == nil {
			return t, true
		}
	}
	var h struct {
		At *time.Time `json:"at"`
	}
	if json.Unmarshal(line, &h) != nil || h.At == nil {
		return time.Time{}, false
	}
	return *h.At, true
}

// wellFormed says whether a line looks like one whole entry: a JSON
// object, and not a line a crash tore with the next entry appended to it
// (which holds a second entry's start). Checked without decoding (and
// without json.Valid, whose pooled scanner allocates when the pool is
// drained) so that a query allocates for the entries it returns only; a
// line that passes and still does not decode is skipped when decoded.
func wellFormed(line []byte) bool {
	return bytes.HasSuffix(line, []byte("}\n")) && !bytes.Contains(line[1:], []byte(`{"at":`))
}

// span is where a journal line is.
type span struct {
	off int64
	n   int
}

// spanRing keeps the last max spans pushed.
type spanRing struct {
	s    []span
	next int // the oldest, once full
	max  int
}

func (r *spanRing) push(x span) {
	if len(r.s) < r.max {
		r.s = append(r.s, x)
		return
	}
	r.s[r.next] = x
	r.next = (r.next + 1) % r.max
}

// at is the i-th oldest span kept.
func (r *spanRing) at(i int) span { return r.s[(r.next+i)%len(r.s)] }

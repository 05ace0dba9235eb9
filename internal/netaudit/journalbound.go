package netaudit

import (
	"bufio"
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"time"
)

// tempMark is in the name of a rewrite's temporary file
// (".<sandbox>.jsonl.tmp-<random>"), which never ends in ".jsonl".
const tempMark = ".jsonl.tmp-"

// compact rewrites a sandbox's journal (f, size bytes, under the
// sandbox's lock) that appending buf would take past the bound: the
// oldest entries go, so that what stays and buf fill about half the
// bound, under a first line (an entry of Rule DroppedRule) saying how
// many went in all, those of earlier rewrites included. Halving rather
// than trimming to the bound makes a rewrite happen once per half a
// bound of appends, not at each one.
//
// The new journal is written beside the old one, synced and renamed over
// it: a crash leaves the old journal or the new one, never a mix, and at
// worst a temporary file, which OpenJournalConfig removes. A query
// reading the old file meanwhile keeps reading it whole (its descriptor
// holds the old file).
func (j *Journal) compact(sandboxID string, f *os.File, size int64, buf []byte) error {
	half := j.maxBytes / 2
	var dropped int64
	if int64(len(buf)) > half {
		// A batch bigger than half the bound keeps only its newest lines.
		cut := lineStartIn(buf, len(buf)-int(half))
		dropped += int64(bytes.Count(buf[:cut], []byte{'\n'}))
		buf = buf[cut:]
	}
	keepFrom, err := lineStartAt(f, size, size-(half-int64(len(buf))))
	if err != nil {
		return fmt.Errorf("egress journal: %w", err)
	}
	n, err := countDropped(f, keepFrom)
	if err != nil {
		return fmt.Errorf("egress journal: %w", err)
	}
	dropped += n
	marker, err := json.Marshal(Entry{At: j.firstAt(f, keepFrom, size, buf), Rule: DroppedRule, Dropped: dropped,
		Reason: fmt.Sprintf("%d older entries dropped: this sandbox's egress journal reached its bound of %d bytes on its node", dropped, j.maxBytes)})
	if err != nil {
		return err
	}
	tmp, err := os.CreateTemp(j.dir, "."+sandboxID+tempMark+"*")
	if err != nil {
		return fmt.Errorf("egress journal: %w", err)
	}
	defer os.Remove(tmp.Name()) // a no-op once renamed
	err = writeCompacted(tmp, append(marker, '\n'), io.NewSectionReader(f, keepFrom, size-keepFrom), torn(f, size), buf)
	if cerr := tmp.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		err = os.Rename(tmp.Name(), j.path(sandboxID))
	}
	if err != nil {
		return fmt.Errorf("egress journal: rewrite %s's journal at its bound: %w", sandboxID, err)
	}
	return nil
}

// writeCompacted writes a rewritten journal: the marker line, the kept
// tail (ended with a newline when a crash tore its last line) and the
// new entries; then syncs it, so that the rename never publishes a file
// whose content a power loss could still take.
func writeCompacted(tmp *os.File, marker []byte, tail io.Reader, tornTail bool, buf []byte) error {
	if _, err := tmp.Write(marker); err != nil {
		return err
	}
	if _, err := io.Copy(tmp, tail); err != nil {
		return err
	}
	if tornTail {
		if _, err := tmp.Write([]byte{'\n'}); err != nil {
			return err
		}
	}
	if _, err := tmp.Write(buf); err != nil {
		return err
	}
	return tmp.Sync()
}

// lineStartIn is the first line start in b at or after i.
func lineStartIn(b []byte, i int) int {
	if i <= 0 {
		return 0
	}
	k := bytes.IndexByte(b[i-1:], '\n')
	if k < 0 {
		return len(b)
	}
	return i + k
}

// lineStartAt is the first line start in f (size bytes) at or after pos;
// size when no line starts there.
func lineStartAt(f *os.File, size, pos int64) (int64, error) {
	if pos <= 0 {
		return 0, nil
	}
	if pos >= size {
		return size, nil
	}
	br := bufio.NewReaderSize(io.NewSectionReader(f, pos-1, size-pos+1), 64<<10)
	off := pos - 1
	for {
		b, err := br.ReadSlice('\n')
		off += int64(len(b))
		switch {
		case err == nil:
			return off, nil
		case errors.Is(err, bufio.ErrBufferFull):
			continue
		case err == io.EOF:
			return size, nil
		default:
			return 0, err
		}
	}
}

// countDropped counts the entries in f before end (a line start): its
// lines, where a first line that says how many an earlier rewrite
// dropped counts for those.
func countDropped(f *os.File, end int64) (int64, error) {
	if end == 0 {
		return 0, nil
	}
	br := bufio.NewReaderSize(io.NewSectionReader(f, 0, end), 64<<10)
	var n int64
	first, err := br.ReadSlice('\n')
	var e Entry
	if err == nil && json.Unmarshal(first, &e) == nil && e.Rule == DroppedRule && e.Dropped > 0 {
		n = e.Dropped
	} else if len(first) > 0 && first[len(first)-1] == '\n' {
		n = 1
	}
	if err != nil && !errors.Is(err, bufio.ErrBufferFull) && err != io.EOF {
		return 0, err
	}
	chunk := make([]byte, 64<<10)
	for {
		k, err := br.Read(chunk)
		n += int64(bytes.Count(chunk[:k], []byte{'\n'}))
		if err == io.EOF {
			return n, nil
		}
		if err != nil {
			return 0, err
		}
	}
}

// firstAt is the time of the first entry a rewrite keeps (of f's tail
// from keepFrom, else of buf), which the marker takes so it sorts before
// the entries it precedes; now when neither has one to read.
func (j *Journal) firstAt(f *os.File, keepFrom, size int64, buf []byte) time.Time {
	line := buf
	if keepFrom < size {
		b := make([]byte, min(size-keepFrom, 64<<10))
		k, _ := f.ReadAt(b, keepFrom)
		line = b[:k]
	}
	if i := bytes.IndexByte(line, '\n'); i >= 0 {
		line = line[:i+1]
	}
	if t, ok := lineTime(line); ok {
		return t
	}
	return j.now().UTC()
}

// removeTemps removes what rewrites a crash interrupted left in dir.
func removeTemps(dir string) error {
	ents, err := os.ReadDir(dir)
	if err != nil {
		return err
	}
	for _, e := range ents {
		if strings.HasPrefix(e.Name(), ".") && strings.Contains(e.Name(), tempMark) {
			if err := os.Remove(filepath.Join(dir, e.Name())); err != nil && !errors.Is(err, os.ErrNotExist) {
				return err
			}
		}
	}
	return nil
}

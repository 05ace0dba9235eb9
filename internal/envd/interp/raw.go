package interp

import (
	"bytes"
	"io"
	"strconv"
	"unicode/utf8"
)

// Output written to the kernel's real stdout and stderr (by child
// processes, os.system, C extensions) travels on pipes of its own, apart
// from the events on fd 3. To end an execution only after all of it, the
// kernel writes a sync marker to both pipes before it reports the end:
//
//	"\x00spore-sync:" + token + ":" + 16 hex digits of the execution count
//
// One write of under PIPE_BUF bytes, so no other writer's bytes land inside
// it. The token is random per kernel, so output that merely looks like a
// marker (a user printing one, a guessed token) stays output.
const (
	syncPrefix = "\x00spore-sync:"
	countLen   = 16
	syncEvent  = "\x00sync" // never sent to clients: execute consumes it
)

// rawScanner splits a raw output stream into text and sync markers.
type rawScanner struct {
	prefix []byte // syncPrefix + token + ":"
	held   []byte // bytes not yet delivered
}

func newRawScanner(token string) *rawScanner {
	return &rawScanner{prefix: []byte(syncPrefix + token + ":")}
}

// scan takes the next bytes of the stream and reports, in stream order,
// text that is complete and the execution counts of markers. It holds back
// what may be the start of a marker, and the start of a multi-byte
// character (so a read boundary never splits one into two invalid halves),
// until the bytes after it tell.
func (s *rawScanner) scan(p []byte, text func(string), sync func(uint64)) {
	s.held = append(s.held, p...)
	b := s.held
	mlen := len(s.prefix) + countLen
	for {
		i := bytes.Index(b, s.prefix)
		if i < 0 {
			break
		}
		if len(b)-i < mlen {
			// The count is still to come: the text before the marker is whole.
			emit(b[:i], text)
			b = b[i:]
			s.keep(b)
			return
		}
		n, err := strconv.ParseUint(string(b[i+len(s.prefix):i+mlen]), 16, 64)
		if err != nil {
			// The token but no count: output, however unlikely.
			emit(b[:i+len(s.prefix)], text)
			b = b[i+len(s.prefix):]
			continue
		}
		emit(b[:i], text)
		sync(n)
		b = b[i+mlen:]
	}
	cut := len(b) - partialPrefix(b, s.prefix)
	cut -= partialRune(b[:cut])
	emit(b[:cut], text)
	s.keep(b[cut:])
}

// flush delivers whatever is held: the stream ended.
func (s *rawScanner) flush(text func(string)) {
	emit(s.held, text)
	s.held = s.held[:0]
}

func (s *rawScanner) keep(b []byte) {
	s.held = append(s.held[:0], b...) // b may alias held: copy is memmove-safe
}

func emit(b []byte, text func(string)) {
	if len(b) > 0 {
		text(string(b))
	}
}

// partialPrefix is the length of the longest end of b that begins prefix.
func partialPrefix(b, prefix []byte) int {
	for n := min(len(prefix)-1, len(b)); n > 0; n-- {
		if bytes.HasSuffix(b, prefix[:n]) {
			return n
		}
	}
	return 0
}

// partialRune is the length of an incomplete UTF-8 sequence ending b (0 if
// b ends with a whole character or with bytes that can never become one).
func partialRune(b []byte) int {
	for n := 1; n <= min(utf8.UTFMax-1, len(b)); n++ {
		c := b[len(b)-n]
		if utf8.RuneStart(c) {
			if c >= 0xC0 && !utf8.FullRune(b[len(b)-n:]) {
				return n
			}
			return 0
		}
	}
	return 0
}

// readRaw forwards what r (the kernel's stdout or stderr pipe) delivers as
// kind events, and each sync marker as a sync event, on the events channel:
// the same channel as the kernel's own events, so a sync comes after every
// byte written before its marker.
func (k *kernel) readRaw(r io.Reader, kind string) {
	sc := newRawScanner(k.token)
	text := func(t string) { k.send(message{ev: Event{"type": kind, "text": t}, raw: kind}) }
	sync := func(n uint64) { k.send(message{ev: Event{"type": syncEvent, "stream": kind, "count": n}, raw: kind}) }
	buf := make([]byte, 32*1024)
	for {
		n, err := r.Read(buf)
		if n > 0 {
			sc.scan(buf[:n], text, sync)
		}
		if err != nil {
			sc.flush(text)
			return
		}
	}
}

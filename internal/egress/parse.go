package egress

import (
	"bytes"
	"errors"
	"net/url"
	"strings"
)

// Errors of the parsers. ErrNeedMore: the bytes so far are a valid
// beginning; read more and ask again.
var (
	ErrNeedMore = errors.New("egress: need more bytes")
	ErrNotTLS   = errors.New("egress: not a TLS ClientHello")
	ErrNotHTTP  = errors.New("egress: not an HTTP/1.x request")
)

// MaxPeek bounds what is read before deciding: a ClientHello (with
// post-quantum key shares ~2 KiB, at most 64 KiB by its length field) or
// an HTTP request's head.
const MaxPeek = 64 << 10

// maxHead bounds an HTTP request head.
const maxHead = 16 << 10

// ServerName returns the SNI host name of the TLS ClientHello that b
// begins with ("" when it has none). The hello may span several
// handshake records. b is only read.
func ServerName(b []byte) (string, error) {
	var hs []byte
	rest := b
	for {
		if len(rest) < 5 {
			if len(rest) > 0 && rest[0] != 22 {
				return "", ErrNotTLS
			}
			return "", ErrNeedMore
		}
		if rest[0] != 22 || rest[1] != 3 {
			return "", ErrNotTLS
		}
		n := int(rest[3])<<8 | int(rest[4])
		if n == 0 || n > 1<<14+2048 {
			return "", ErrNotTLS
		}
		if len(rest) < 5+n {
			// A partial record: parse what there is only once it is
			// whole (a record is at most ~16 KiB).
			return "", ErrNeedMore
		}
		hs = append(hs, rest[5:5+n]...)
		rest = rest[5+n:]
		if len(hs) >= 4 {
			if hs[0] != 1 { // client_hello
				return "", ErrNotTLS
			}
			l := int(hs[1])<<16 | int(hs[2])<<8 | int(hs[3])
			if l > MaxPeek {
				return "", ErrNotTLS
			}
			if len(hs) >= 4+l {
				return helloSNI(hs[4 : 4+l])
			}
		}
	}
}

// reader walks a byte string; a short read marks it bad.
type reader struct {
	b   []byte
	bad bool
}

func (r *reader) take(n int) []byte {
	if r.bad || n > len(r.b) {
		r.bad = true
		return nil
	}
	out := r.b[:n]
	r.b = r.b[n:]
	return out
}

func (r *reader) u8() int {
	b := r.take(1)
	if b == nil {
		return 0
	}
	return int(b[0])
}
func (r *reader) u16() int {
	b := r.take(2)
	if b == nil {
		return 0
	}
	return int(b[0])<<8 | int(b[1])
}

// helloSNI parses a ClientHello body (RFC 8446 4.1.2, RFC 6066 3).
func helloSNI(body []byte) (string, error) {
	r := &reader{b: body}
	r.take(2 + 32)  // legacy_version, random
	r.take(r.u8())  // legacy_session_id
	r.take(r.u16()) // cipher_suites
	r.take(r.u8())  // legacy_compression_methods
	if r.bad {
		return "", ErrNotTLS
	}
	if len(r.b) == 0 {
		return "", nil // no extensions
	}
	ext := &reader{b: r.take(r.u16())}
	if r.bad {
		return "", ErrNotTLS
	}
	for len(ext.b) > 0 {
		typ := ext.u16()
		data := ext.take(ext.u16())
		if ext.bad {
			return "", ErrNotTLS
		}
		if typ != 0 { // server_name
			continue
		}
		list := &reader{b: data}
		names := &reader{b: list.take(list.u16())}
		for len(names.b) > 0 && !names.bad {
			kind := names.u8()
			name := names.take(names.u16())
			if names.bad {
				break
			}
			if kind == 0 { // host_name
				if len(name) == 0 || bytes.IndexByte(name, 0) >= 0 {
					return "", ErrNotTLS
				}
				return NormalizeHost(string(name)), nil
			}
		}
		if list.bad || names.bad {
			return "", ErrNotTLS
		}
		return "", nil
	}
	return "", nil
}

// HTTPHost returns the host an HTTP/1.x request that b begins with asks
// for: its Host header (port and trailing dot dropped), or the host of an
// absolute-form target when it has none. Two Host headers are refused (a
// proxy and the server could read different ones). "" when it names none.
func HTTPHost(b []byte) (string, error) {
	end := bytes.Index(b, []byte("\r\n\r\n"))
	if end < 0 {
		if len(b) >= maxHead {
			return "", ErrNotHTTP
		}
		// Fail early on what cannot become a request line.
		if i := bytes.IndexByte(b, ' '); i == 0 || i < 0 && len(b) > 32 {
			return "", ErrNotHTTP
		}
		return "", ErrNeedMore
	}
	lines := strings.Split(string(b[:end]), "\r\n")
	parts := strings.Split(lines[0], " ")
	if len(parts) != 3 || !strings.HasPrefix(parts[2], "HTTP/1.") || parts[0] == "" {
		return "", ErrNotHTTP
	}
	host, seen := "", false
	for _, l := range lines[1:] {
		k, v, ok := strings.Cut(l, ":")
		if !ok {
			return "", ErrNotHTTP
		}
		if strings.EqualFold(k, "host") {
			if seen {
				return "", ErrNotHTTP
			}
			host, seen = NormalizeHost(v), true
		}
	}
	if !seen {
		if u, err := url.Parse(parts[1]); err == nil && u.Host != "" {
			host = NormalizeHost(u.Host)
		}
	}
	return host, nil
}

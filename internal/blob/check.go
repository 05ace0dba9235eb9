package blob

import (
	"context"
	"fmt"
	"io"
	"strings"

	"github.com/spore-run/spore/internal/errdefs"
)

// MaxKeyLen is the longest key a Store accepts, in bytes.
const MaxKeyLen = 512

// MaxElemLen is the longest element of a key, in bytes: a file name's limit
// (NAME_MAX) on Linux, which the local store and versitygw's posix backend
// map elements to.
const MaxElemLen = 255

// CheckKey returns nil when key is a valid key (see Store) and an
// errdefs.ErrInvalidArgument naming what is wrong otherwise. Stores check
// every key before touching anything, so a bad key changes nothing.
func CheckKey(key string) error {
	if key == "" {
		return errdefs.Invalidf("blob key is empty")
	}
	if len(key) > MaxKeyLen {
		return errdefs.Invalidf("blob key %.40q... is %d bytes, more than %d", key, len(key), MaxKeyLen)
	}
	if i := strings.IndexFunc(key, func(r rune) bool { return !keyByte(r) && r != '/' }); i >= 0 {
		return errdefs.Invalidf("blob key %q: byte %d is not one of [a-z0-9._-/]", key, i)
	}
	for elem := range strings.SplitSeq(key, "/") {
		switch elem {
		case "":
			return errdefs.Invalidf("blob key %q has an empty element (leading, trailing or double slash)", key)
		case ".", "..":
			return errdefs.Invalidf("blob key %q has a %q element", key, elem)
		}
		if len(elem) > MaxElemLen {
			return errdefs.Invalidf("blob key %.40q...: an element is %d bytes, more than %d", key, len(elem), MaxElemLen)
		}
	}
	return nil
}

// CheckPrefix returns nil when prefix may start a key: at most MaxKeyLen
// bytes of the key alphabet. (A prefix such as "a//" is valid and simply
// matches nothing.)
func CheckPrefix(prefix string) error {
	if len(prefix) > MaxKeyLen {
		return errdefs.Invalidf("blob prefix is %d bytes, more than %d", len(prefix), MaxKeyLen)
	}
	if i := strings.IndexFunc(prefix, func(r rune) bool { return !keyByte(r) && r != '/' }); i >= 0 {
		return errdefs.Invalidf("blob prefix %q: byte %d is not one of [a-z0-9._-/]", prefix, i)
	}
	return nil
}

func keyByte(r rune) bool {
	return r >= 'a' && r <= 'z' || r >= '0' && r <= '9' || r == '.' || r == '_' || r == '-'
}

// CheckRange checks a GetRange of an object of size bytes: offset in
// [0, size], and offset+length <= size unless length < 0 (to the end).
func CheckRange(key string, offset, length, size int64) error {
	if offset < 0 || offset > size || length >= 0 && length > size-offset {
		return errdefs.Invalidf("blob %s: range %d+%d outside its %d bytes", key, offset, length, size)
	}
	return nil
}

// ExactReader reads exactly size bytes from r: it ends with io.EOF after
// them, fails with an ErrInvalidArgument wrapping io.ErrUnexpectedEOF when
// r ends before, and with ctx's error once ctx ends. Stores read a Put's
// body through it, so a short reader fails the Put instead of storing a
// short object.
func ExactReader(ctx context.Context, r io.Reader, size int64) io.Reader {
	return &exactReader{ctx: ctx, r: r, size: size, left: size}
}

type exactReader struct {
	ctx        context.Context
	r          io.Reader
	size, left int64
}

func (e *exactReader) Read(p []byte) (int, error) {
	if err := e.ctx.Err(); err != nil {
		return 0, err
	}
	if e.left == 0 {
		return 0, io.EOF
	}
	if int64(len(p)) > e.left {
		p = p[:e.left]
	}
	n, err := e.r.Read(p)
	e.left -= int64(n)
	if err == io.EOF {
		if e.left > 0 {
			return n, fmt.Errorf("%w: the reader ended after %d of %d bytes: %w",
				errdefs.ErrInvalidArgument, e.size-e.left, e.size, io.ErrUnexpectedEOF)
		}
		err = nil
	}
	if err == nil && e.left == 0 {
		err = io.EOF
	}
	return n, err
}

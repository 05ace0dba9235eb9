// Package ids generates and validates the identifiers and names Spore accepts.
//
// Every identifier that reaches a file path passes Validate first, so no
// request can name a path outside the directory it was meant for.
package ids

import (
	"crypto/rand"
	"crypto/sha256"
	"regexp"

	"github.com/spore-run/spore/internal/errdefs"
)

const alphabet = "abcdefghijklmnopqrstuvwxyz0123456789"

// idLen is the length of generated IDs (20 characters, like E2B's).
const idLen = 20

var (
	idRE   = regexp.MustCompile(`^[a-z0-9][a-z0-9-]{0,62}$`)
	nameRE = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$`)
)

// New returns a fresh random ID with a one-letter prefix naming its kind
// ("i" sandbox, "s" snapshot...).
func New(prefix byte) string {
	b := make([]byte, idLen)
	rand.Read(b) // never fails (crypto/rand panics on an unusable source)
	for i := range b {
		b[i] = alphabet[int(b[i])%len(alphabet)]
	}
	b[0] = prefix
	return string(b)
}

// Derive returns the ID of the given kind that parts name: the same parts
// always give the same ID (a hash of them, in New's shape), so two
// components name a thing they both make without telling each other (a
// fork child's copy of its parent's exclusive volume: Derive('v', child,
// volume)).
func Derive(prefix byte, parts ...string) string {
	h := sha256.New()
	for _, p := range parts {
		h.Write([]byte(p))
		h.Write([]byte{0})
	}
	sum := h.Sum(nil)
	b := make([]byte, idLen)
	for i := range b {
		b[i] = alphabet[int(sum[i])%len(alphabet)]
	}
	b[0] = prefix
	return string(b)
}

// Validate checks that id is a well-formed identifier: lower-case letters,
// digits and dashes, 1 to 63 characters, starting with a letter or digit.
// kind names the identifier in the error ("sandbox ID", "snapshot ID").
func Validate(kind, id string) error {
	if !idRE.MatchString(id) {
		return errdefs.Invalidf("%s %q is malformed: want 1-63 characters of [a-z0-9-], starting with a letter or digit", kind, id)
	}
	return nil
}

// ValidateName checks a user-given name (snapshot or template name):
// letters, digits, '.', '_' and '-', 1 to 128 characters, not starting with
// a dot or dash (so never "." or "..").
func ValidateName(kind, name string) error {
	if !nameRE.MatchString(name) {
		return errdefs.Invalidf("%s %q is malformed: want 1-128 characters of [A-Za-z0-9._-], starting with a letter or digit", kind, name)
	}
	return nil
}

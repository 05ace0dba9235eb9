// Package errdefs defines the error kinds shared by every Spore package.
//
// Packages wrap one of these sentinels with %w and the identifier involved;
// the edges (HTTP, CLI) map kinds to wire codes with the Is* helpers and
// never look at error strings.
package errdefs

import (
	"errors"
	"fmt"
)

// The kinds. Each maps to one HTTP status at the API edge.
var (
	ErrInvalidArgument = errors.New("invalid argument")   // 400
	ErrNotFound        = errors.New("not found")          // 404
	ErrAlreadyExists   = errors.New("already exists")     // 409
	ErrConflict        = errors.New("conflict")           // 409: wrong state for the operation
	ErrPermission      = errors.New("permission denied")  // 403: the caller may not do this
	ErrUnavailable     = errors.New("unavailable")        // 503: runtime or resource not ready
	ErrResourceLimit   = errors.New("resource exhausted") // 429/507
	ErrInternal        = errors.New("internal error")     // 500
	// ErrDataLoss: stored data failed its integrity check (a chunk whose
	// bytes do not match its hash) and no other copy was usable.
	ErrDataLoss = errors.New("data loss") // 500
)

// IsInvalidArgument reports whether err is of kind ErrInvalidArgument.
func IsInvalidArgument(err error) bool { return errors.Is(err, ErrInvalidArgument) }

// IsNotFound reports whether err is of kind ErrNotFound.
func IsNotFound(err error) bool { return errors.Is(err, ErrNotFound) }

// IsAlreadyExists reports whether err is of kind ErrAlreadyExists.
func IsAlreadyExists(err error) bool { return errors.Is(err, ErrAlreadyExists) }

// IsPermission reports whether err is of kind ErrPermission.
func IsPermission(err error) bool { return errors.Is(err, ErrPermission) }

// Forbiddenf returns an ErrPermission with a message.
func Forbiddenf(format string, args ...any) error {
	return fmt.Errorf("%w: %s", ErrPermission, fmt.Sprintf(format, args...))
}

// IsConflict reports whether err is of kind ErrConflict.
func IsConflict(err error) bool { return errors.Is(err, ErrConflict) }

// IsUnavailable reports whether err is of kind ErrUnavailable.
func IsUnavailable(err error) bool { return errors.Is(err, ErrUnavailable) }

// IsDataLoss reports whether err is of kind ErrDataLoss.
func IsDataLoss(err error) bool { return errors.Is(err, ErrDataLoss) }

// Invalidf returns an ErrInvalidArgument with a message.
func Invalidf(format string, args ...any) error {
	return fmt.Errorf("%w: %s", ErrInvalidArgument, fmt.Sprintf(format, args...))
}

// NotFoundf returns an ErrNotFound with a message.
func NotFoundf(format string, args ...any) error {
	return fmt.Errorf("%w: %s", ErrNotFound, fmt.Sprintf(format, args...))
}

// Conflictf returns an ErrConflict with a message.
func Conflictf(format string, args ...any) error {
	return fmt.Errorf("%w: %s", ErrConflict, fmt.Sprintf(format, args...))
}

// Unavailablef returns an ErrUnavailable with a message.
func Unavailablef(format string, args ...any) error {
	return fmt.Errorf("%w: %s", ErrUnavailable, fmt.Sprintf(format, args...))
}

package rpc

import (
	"context"
	"errors"

	"connectrpc.com/connect"

	"github.com/spore-run/spore/internal/errdefs"
)

// The errdefs kinds on the wire. The node answers an error with the Connect
// code of its kind and its message unchanged (it names the ID; nothing is
// added); the client turns the code back into the same kind, so the
// control plane's errdefs.Is* checks answer as they do in process.
//
// ErrConflict travels as FailedPrecondition ("the sandbox's state does not
// allow the operation", gRPC's meaning of that code); Aborted, which no
// node sends, reads back as ErrConflict too. A deadline or cancellation is
// not a kind: it is context.DeadlineExceeded / context.Canceled on both
// sides. An error of no kind (CodeUnknown), and any code without a kind,
// reads back as ErrUnavailable or ErrInternal (below): never as "nothing
// happened".
var kindCodes = []struct {
	kind error
	code connect.Code
}{
	{errdefs.ErrInvalidArgument, connect.CodeInvalidArgument},
	{errdefs.ErrNotFound, connect.CodeNotFound},
	{errdefs.ErrAlreadyExists, connect.CodeAlreadyExists},
	{errdefs.ErrConflict, connect.CodeFailedPrecondition},
	{errdefs.ErrResourceLimit, connect.CodeResourceExhausted},
	{errdefs.ErrUnavailable, connect.CodeUnavailable},
	{errdefs.ErrInternal, connect.CodeInternal},
}

// codeOf is the Connect code for a node's error.
func codeOf(err error) connect.Code {
	for _, kc := range kindCodes {
		if errors.Is(err, kc.kind) {
			return kc.code
		}
	}
	switch {
	case errors.Is(err, context.DeadlineExceeded):
		return connect.CodeDeadlineExceeded
	case errors.Is(err, context.Canceled):
		return connect.CodeCanceled
	}
	return connect.CodeUnknown
}

// toConnect is the error the handler returns for a node's error.
func toConnect(err error) error {
	if err == nil {
		return nil
	}
	var ce *connect.Error
	if errors.As(err, &ce) {
		return ce
	}
	ce = connect.NewError(codeOf(err), err)
	return ce
}

// kindOf is the errdefs kind (or context error) a Connect code reads back
// as.
func kindOf(code connect.Code) error {
	for _, kc := range kindCodes {
		if kc.code == code {
			return kc.kind
		}
	}
	switch code {
	case connect.CodeAborted:
		return errdefs.ErrConflict
	case connect.CodeOutOfRange:
		return errdefs.ErrInvalidArgument
	case connect.CodeDeadlineExceeded:
		return context.DeadlineExceeded
	case connect.CodeCanceled:
		return context.Canceled
	case connect.CodeUnknown:
		// The node's error had no kind, or the call broke in a way the
		// transport could not classify: the operation may or may not have
		// happened, so the caller retries its idempotent call.
		return errdefs.ErrUnavailable
	}
	// Unauthenticated, PermissionDenied, Unimplemented, DataLoss: a
	// misconfigured fleet (wrong token, mismatched versions), not
	// something a retry fixes.
	return errdefs.ErrInternal
}

// Error is an error a node answered (or the hop to it failed with), as
// the client returns it: its message is the node's, and it wraps both the
// errdefs kind (or context error) of its code and the *connect.Error.
type Error struct {
	kind error
	ce   *connect.Error
}

func (e *Error) Error() string {
	if msg := e.ce.Message(); msg != "" {
		return msg
	}
	return e.kind.Error()
}

// Unwrap gives errors.Is the kind and errors.As the *connect.Error.
func (e *Error) Unwrap() []error { return []error{e.kind, e.ce} }

// Code is the Connect code the error came with.
func (e *Error) Code() connect.Code { return e.ce.Code() }

// fromConnect is the error the client returns for a failed call.
func fromConnect(err error) error {
	if err == nil {
		return nil
	}
	ce := new(connect.Error)
	if !errors.As(err, &ce) {
		ce = connect.NewError(connect.CodeUnknown, err)
	}
	return &Error{kind: kindOf(ce.Code()), ce: ce}
}

// childError is a fork child's error on the wire and back.
func childError(code uint32, msg string) error {
	return &Error{kind: kindOf(connect.Code(code)), ce: connect.NewError(connect.Code(code), errors.New(msg))}
}

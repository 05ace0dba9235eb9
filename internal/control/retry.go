package control

import (
	"context"
	"errors"
	"time"

	"github.com/spore-run/spore/internal/errdefs"
)

// Node calls that make something under IDs minted here (create, fork,
// snapshot) are idempotent on the node: the same call again returns what
// the first one made, or waits for it if it still runs. So when a call
// fails indefinitely (the node, or the hop to it, was unavailable, or a
// deadline passed: the node may or may not have done it), the same call
// with the same IDs is tried again before the work is undone; a definite
// failure (invalid, no capacity, wrong state, not found, ...) is undone at
// once, since trying again would fail again.
const nodeCallTries = 3

// retryBackoff is the wait before the second try; it doubles after.
var retryBackoff = 200 * time.Millisecond

// indefinite reports whether a node call's error leaves it unknown whether
// the node did the work.
func indefinite(err error) bool {
	return errdefs.IsUnavailable(err) || errors.Is(err, context.DeadlineExceeded)
}

// retryNodeCall runs call until it succeeds, fails definitely, has been
// tried nodeCallTries times, or ctx ends. It returns the last result.
func retryNodeCall[T any](ctx context.Context, s *Service, what, id string, call func(context.Context) (T, error)) (T, error) {
	wait := retryBackoff
	for try := 1; ; try++ {
		res, err := call(ctx)
		if err == nil || !indefinite(err) || try == nodeCallTries || ctx.Err() != nil {
			return res, err
		}
		s.log.Warn("node call failed indefinitely: trying the same call again", "op", what, "id", id, "try", try, "err", err)
		select {
		case <-ctx.Done():
			return res, err
		case <-time.After(wait):
		}
		wait *= 2
	}
}

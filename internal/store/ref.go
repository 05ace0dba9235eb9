package store

import (
	"encoding/json"
	"errors"
	"fmt"

	"github.com/spore-run/spore/internal/errdefs"
)

// DecodeRef turns ResolveRef's ranked row (rank 0 and 1: a snapshot's
// data, 2 and 3: a template's) read with err into a Ref; noRows is the driver's
// "no row" error.
func DecodeRef(err error, rank int, data []byte, ref string, noRows error) (Ref, error) {
	if errors.Is(err, noRows) {
		return Ref{}, fmt.Errorf("snapshot or template %q: %w", ref, errdefs.ErrNotFound)
	}
	if err != nil {
		return Ref{}, fmt.Errorf("resolve %q: %w", ref, err)
	}
	if rank < 2 {
		var sn Snapshot
		if err := json.Unmarshal(data, &sn); err != nil {
			return Ref{}, fmt.Errorf("snapshot %q: decode: %w", ref, err)
		}
		return Ref{Snapshot: &sn}, nil
	}
	var t Template
	if err := json.Unmarshal(data, &t); err != nil {
		return Ref{}, fmt.Errorf("template %q: decode: %w", ref, err)
	}
	return Ref{Template: &t}, nil
}

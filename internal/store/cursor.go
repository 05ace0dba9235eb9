package store

import (
	"encoding/base64"
	"strconv"
	"strings"

	"github.com/spore-run/spore/internal/errdefs"
)

// EncodeCursor returns the paging token that continues after the row with
// sequence number seq. Both implementations page by an insertion sequence,
// so a token means the same in each.
func EncodeCursor(seq int64) string {
	return base64.RawURLEncoding.EncodeToString([]byte("seq:" + strconv.FormatInt(seq, 10)))
}

// DecodeCursor returns the sequence number a paging token continues after
// ("" is the beginning, 0); anything else is ErrInvalidArgument.
func DecodeCursor(c string) (int64, error) {
	if c == "" {
		return 0, nil
	}
	b, err := base64.RawURLEncoding.DecodeString(c)
	if err == nil {
		if v, ok := strings.CutPrefix(string(b), "seq:"); ok {
			if n, err := strconv.ParseInt(v, 10, 64); err == nil && n >= 0 {
				return n, nil
			}
		}
	}
	return 0, errdefs.Invalidf("malformed paging token %q", c)
}

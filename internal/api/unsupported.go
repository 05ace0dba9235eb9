package api

import (
	"bytes"
	"encoding/json"
	"fmt"

	"github.com/spore-run/spore/internal/errdefs"
)

// E2B request fields that Spore does not implement. Dropping them would let
// a user believe a security or storage feature is on (an MCP gateway, an
// egress proxy in the path, traffic needing a token) when it is not, so
// each is refused with a 400 naming it, unless its value means what Spore
// does anyway: absent, null, empty, or the stock SDKs' defaults (e2b 2.50
// sends secure: true and allow_internet_access: true on every create).
// Fields no stock SDK sends are refused by decode's strict decoding.

// unsupported is the error for a field Spore cannot honour.
func unsupported(field, value, why string) error {
	return errdefs.Invalidf("field %q = %s is not supported by Spore: %s", field, value, why)
}

// isSet reports whether a raw JSON value asks for something: anything but
// absent or null.
func isSet(raw json.RawMessage) bool {
	raw = bytes.TrimSpace(raw)
	return len(raw) > 0 && !bytes.Equal(raw, []byte("null"))
}

func (req CreateRequest) refuseUnsupported() error {
	switch {
	case req.Secure != nil && !*req.Secure:
		// E2B's secure: false means "no envd access token". Spore always
		// issues and checks one (its answer carries it, and the stock SDKs
		// use it), so the request would not get what it says.
		return unsupported("secure", "false", "every sandbox's envd requires its access token")
	case req.AutoPauseMemory != nil && !*req.AutoPauseMemory:
		return unsupported("autoPauseMemory", "false", "a paused sandbox always keeps its memory (Spore hibernates it whole)")
	case isSet(req.MCP):
		return unsupported("mcp", "(set)", "there is no MCP gateway")
	case isSet(req.IAM):
		return unsupported("iam", "(set)", "there are no IAM tokens")
	}
	if req.Network != nil {
		return req.Network.refuseUnsupported("network.", true)
	}
	return nil
}

// refuseUnsupported checks a network request; prefix names where it sits
// in the body ("network." in a create, "" in a network update); atCreate:
// it is a create's.
func (n NetworkRequest) refuseUnsupported(prefix string, atCreate bool) error {
	switch {
	case !atCreate && n.AllowPublicTraffic != nil && !*n.AllowPublicTraffic:
		// Chosen at create (as in E2B, whose update carries no such field).
		return unsupported(prefix+"allowPublicTraffic", "false", "a sandbox's ports become private at create only")
	case isSet(n.EgressProxy):
		return unsupported(prefix+"egressProxy", "(set)", "egress does not go through a proxy; use allowOut/denyOut")
	case len(n.HTTPSPorts) > 0:
		return unsupported(prefix+"httpsPorts", fmt.Sprint(n.HTTPSPorts), "ports are not terminated as HTTPS")
	case n.MaskRequestHost != nil && *n.MaskRequestHost != "":
		return unsupported(prefix+"maskRequestHost", fmt.Sprintf("%q", *n.MaskRequestHost), "the Host header is not rewritten")
	}
	return nil
}

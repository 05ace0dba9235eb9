package api_test

import (
	"net/http"
	"net/url"
	"testing"

	"github.com/spore-run/spore/internal/api"
	"github.com/spore-run/spore/internal/control"
	"github.com/spore-run/spore/internal/errdefs"
	"github.com/spore-run/spore/internal/proxy"
)

// Request decoding: any body either decodes into a request that passes
// validation or is refused as invalid input; nothing panics.
func FuzzCreateRequest(f *testing.F) {
	for _, s := range []string{`{}`, `{"templateID":"base","timeout":300}`, `{"timeout":-1}`, `{"timeout":1e20}`,
		`{"metadata":{"":"x"}}`, `{"network":{"allowOut":["10.0.0.0/8"],"denyOut":["x"]}}`, `{"templateID":"../../etc"}`,
		`{"envVars":{"A=B":"c"}}`, `{"cpuCount":-3}`, `null`, `[]`, `{"timeout":"5"}`, `{"secure":false}`, `{"mcp":{}}`,
		`{"volumeMounts":[{}]}`, `{"network":{"egressProxy":{"address":"p"}}}`, `{"unknown":1}`, `{} {}`} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, body []byte) {
		var req api.CreateRequest
		if err := api.DecodeStrict(body, &req); err != nil {
			if !errdefs.IsInvalidArgument(err) {
				t.Fatalf("DecodeStrict = %v, want invalid argument", err)
			}
			return // the handler answers 400 before parsing
		}
		cr, err := api.ParseCreate(req)
		if err != nil {
			if !errdefs.IsInvalidArgument(err) {
				t.Fatalf("ParseCreate = %v, want invalid argument", err)
			}
			return
		}
		if cr.Timeout <= 0 || cr.Timeout > control.MaxTimeout {
			t.Fatalf("accepted timeout %v", cr.Timeout)
		}
		if len(cr.Metadata) > control.MaxMetadata {
			t.Fatalf("accepted %d metadata pairs", len(cr.Metadata))
		}
	})
}

// List queries: metadata filters (a query string in a query parameter),
// states, limits, tokens.
func FuzzListQuery(f *testing.F) {
	for _, s := range []string{"metadata=a%3Db&state=running,paused&limit=10", "metadata=%25zz", "limit=0", "limit=-1",
		"state=exploded", "nextToken=abc", "metadata=" + url.QueryEscape("k=v&k=w"), ""} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, raw string) {
		q, err := url.ParseQuery(raw)
		if err != nil {
			return
		}
		flt, err := api.ParseListQuery(q)
		if err != nil {
			if !errdefs.IsInvalidArgument(err) {
				t.Fatalf("ParseListQuery(%q) = %v", raw, err)
			}
			return
		}
		if flt.Limit < 1 || flt.Limit > 1000 {
			t.Fatalf("limit %d accepted", flt.Limit)
		}
	})
}

// Proxy routing by header and Host: a valid sandbox ID and port, or an
// error; never a path-like ID.
func FuzzProxyRoute(f *testing.F) {
	for _, s := range [][3]string{{"i0123456789abcdefghi", "49983", ""}, {"", "", "49999-iabc.spore.dev"}, {"../x", "1", ""},
		{"", "", "99999-x.d"}, {"", "", "-x.d"}, {"", "", "1-..d"}, {"abc", "0", ""}, {"", "", "80-a/b.c"}} {
		f.Add(s[0], s[1], s[2])
	}
	f.Fuzz(func(t *testing.T, id, port, host string) {
		r, err := http.NewRequest("GET", "http://x/health", nil)
		if err != nil {
			return
		}
		if id != "" {
			r.Header.Set("E2b-Sandbox-Id", id)
		}
		if port != "" {
			r.Header.Set("E2b-Sandbox-Port", port)
		}
		r.Host = host
		gotID, gotPort, err := proxy.Route(r)
		if err != nil {
			return
		}
		if gotPort < 1 || gotPort > 65535 {
			t.Fatalf("port %d", gotPort)
		}
		for _, c := range gotID {
			if !(c >= 'a' && c <= 'z' || c >= '0' && c <= '9' || c == '-') {
				t.Fatalf("id %q accepted", gotID)
			}
		}
	})
}

package api_test

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"testing"

	"github.com/spore-run/spore/internal/api"
	"github.com/spore-run/spore/internal/control"
	"github.com/spore-run/spore/internal/secrets"
)

func withSecrets(t *testing.T) func(*control.Config) {
	box, err := secrets.NewBox(bytes.Repeat([]byte{7}, secrets.KeySize))
	if err != nil {
		t.Fatal(err)
	}
	return func(c *control.Config) { c.Secrets = box }
}

// E2B's secrets API: create, read by ID or name, list by pages, update
// (a new version), delete; values are write-only (no answer carries one)
// and sealed in the store; bad input is a 4xx that changes nothing.
func TestSecretsAPI(t *testing.T) {
	f := newFnode(t, withSecrets(t))
	const value = "sk-test-5f0c1d2e3b4a"
	var s api.Secret
	b := f.want(201, "POST", "/secrets", `{"name":"OpenAI-Key","value":"`+value+`","metadata":{"team":"ml"}}`)
	if err := json.Unmarshal(b, &s); err != nil || !strings.HasPrefix(s.SecretID, "sec_") || s.Name != "openai-key" ||
		s.CurrentVersion != 1 || s.Metadata["team"] != "ml" || s.CreatedAt == "" || s.UpdatedAt != s.CreatedAt {
		t.Fatalf("create = %s (%v)", b, err)
	}
	seen := [][]byte{b}
	seen = append(seen, f.want(200, "GET", "/secrets/"+s.SecretID, ""), f.want(200, "GET", "/secrets/openai-key", ""),
		f.want(200, "GET", "/secrets/OPENAI-KEY", ""))
	// Sealed at rest: the row the store keeps does not hold the value.
	row, err := f.st.GetSecret(context.Background(), "default", s.SecretID)
	if err != nil {
		t.Fatal(err)
	}
	if raw, _ := json.Marshal(row); bytes.Contains(raw, []byte(value)) || bytes.Contains(raw, []byte("sk-test")) {
		t.Fatalf("the stored row holds the value: %s", raw)
	}

	// Refused, nothing stored.
	f.want(409, "POST", "/secrets", `{"name":"openai-key","value":"x"}`)
	for _, body := range []string{
		`{"name":"","value":"x"}`, `{"name":"a{b}","value":"x"}`, `{"name":"sec_abc","value":"x"}`,
		`{"name":"ok","value":""}`, `{"name":"ok","value":"a\r\nX-Injected: 1"}`,
		`{"name":"ok","value":"` + strings.Repeat("v", secrets.MaxValueLen+1) + `"}`,
		`{"name":"ok","value":"x","metadata":{"":"v"}}`, `{"name":"ok","value":"x","extra":1}`,
	} {
		f.want(400, "POST", "/secrets", body)
	}
	f.want(404, "GET", "/secrets/nope", "")
	f.want(400, "GET", "/secrets/a%7Bb", "")

	// Update: a new version, metadata replaced when given, kept when not.
	var u api.Secret
	b = f.want(200, "POST", "/secrets/openai-key", `{"value":"sk-rotated-1"}`)
	if json.Unmarshal(b, &u); u.SecretID != s.SecretID || u.CurrentVersion != 2 || u.Metadata["team"] != "ml" || u.CreatedAt != s.CreatedAt {
		t.Fatalf("update = %s", b)
	}
	seen = append(seen, b)
	b = f.want(200, "POST", "/secrets/"+s.SecretID, `{"value":"sk-rotated-2","metadata":{"team":"infra"}}`)
	if json.Unmarshal(b, &u); u.CurrentVersion != 3 || u.Metadata["team"] != "infra" || len(u.Metadata) != 1 {
		t.Fatalf("update with metadata = %s", b)
	}
	seen = append(seen, b)
	f.want(400, "POST", "/secrets/openai-key", `{"value":"bad\nvalue"}`)
	f.want(404, "POST", "/secrets/nope", `{"value":"x"}`)
	if b := f.want(200, "GET", "/secrets/openai-key", ""); !bytes.Contains(b, []byte(`"currentVersion":3`)) {
		t.Fatalf("a refused update changed the secret: %s", b)
	}

	// Pages, oldest first.
	for i := range 4 {
		f.want(201, "POST", "/secrets", fmt.Sprintf(`{"name":"p%d","value":"v%d"}`, i, i))
	}
	var names []string
	next := ""
	for range 5 {
		code, b, h := f.do("GET", "/secrets?limit=2&nextToken="+next, "")
		if code != 200 {
			t.Fatalf("list: %d %s", code, b)
		}
		seen = append(seen, b)
		var page []api.Secret
		json.Unmarshal(b, &page)
		for _, x := range page {
			names = append(names, x.Name)
		}
		if next = h.Get("X-Next-Token"); next == "" {
			break
		}
	}
	if fmt.Sprint(names) != "[openai-key p0 p1 p2 p3]" {
		t.Fatalf("paged list: %v", names)
	}
	f.want(400, "GET", "/secrets?limit=0", "")
	f.want(400, "GET", "/secrets?limit=101", "")
	f.want(400, "GET", "/secrets?nextToken=garbage!", "")
	for _, b := range seen {
		if bytes.Contains(b, []byte("sk-")) || bytes.Contains(b, []byte(`"value"`)) {
			t.Fatalf("an answer carries a value: %s", b)
		}
	}

	f.want(204, "DELETE", "/secrets/openai-key", "")
	f.want(404, "GET", "/secrets/"+s.SecretID, "")
	f.want(404, "DELETE", "/secrets/openai-key", "")
	f.want(204, "DELETE", "/secrets/p0", "")
	// The name is free again.
	f.want(201, "POST", "/secrets", `{"name":"openai-key","value":"again"}`)
}

// Without a secrets key the API refuses to store values (503), and says
// why.
func TestSecretsWithoutAKey(t *testing.T) {
	f := newFnode(t)
	b := f.want(503, "POST", "/secrets", `{"name":"a","value":"x"}`)
	if !bytes.Contains(b, []byte("unavailable")) {
		t.Fatalf("answer: %s", b)
	}
	if b := f.want(200, "GET", "/secrets", ""); string(bytes.TrimSpace(b)) != "[]" {
		t.Fatalf("list: %s", b)
	}
}

package secrets_test

import (
	"bytes"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/spore-run/spore/internal/errdefs"
	"github.com/spore-run/spore/internal/secrets"
)

func box(t *testing.T, fill byte) *secrets.Box {
	t.Helper()
	b, err := secrets.NewBox(bytes.Repeat([]byte{fill}, secrets.KeySize))
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// A sealed value opens only with its key, its secret ID and its version,
// and does not contain the value in the clear.
func TestSealOpen(t *testing.T) {
	b := box(t, 1)
	val := []byte("sk-live-0123456789")
	s1, s2 := b.Seal("sec_a", 1, val), b.Seal("sec_a", 1, val)
	if bytes.Equal(s1, s2) {
		t.Fatal("two seals of one value are equal (nonce reused)")
	}
	if bytes.Contains(s1, val) {
		t.Fatal("the sealed value holds the value")
	}
	if got, err := b.Open("sec_a", 1, s1); err != nil || !bytes.Equal(got, val) {
		t.Fatalf("open = %q, %v", got, err)
	}
	if _, err := b.Open("sec_b", 1, s1); !errors.Is(err, errdefs.ErrDataLoss) {
		t.Fatalf("open as another secret: %v", err)
	}
	if _, err := b.Open("sec_a", 2, s1); !errors.Is(err, errdefs.ErrDataLoss) {
		t.Fatalf("open as another version: %v", err)
	}
	if _, err := box(t, 2).Open("sec_a", 1, s1); !errors.Is(err, secrets.ErrWrongKey) {
		t.Fatalf("open under another key: %v", err)
	}
	bad := bytes.Clone(s1)
	bad[len(bad)-1] ^= 1
	if _, err := b.Open("sec_a", 1, bad); !errors.Is(err, errdefs.ErrDataLoss) {
		t.Fatalf("open of a flipped bit: %v", err)
	}
	if _, err := b.Open("sec_a", 1, s1[:10]); !errors.Is(err, errdefs.ErrDataLoss) {
		t.Fatalf("open of a short value: %v", err)
	}
}

func TestKeyFile(t *testing.T) {
	p := filepath.Join(t.TempDir(), "d", "secrets-key")
	k1, err := secrets.EnsureKey(p)
	if err != nil {
		t.Fatal(err)
	}
	if st, err := os.Stat(p); err != nil || st.Mode().Perm() != 0o600 {
		t.Fatalf("key file: %v %v", st.Mode(), err)
	}
	k2, err := secrets.EnsureKey(p)
	if err != nil || !bytes.Equal(k1, k2) || len(k1) != secrets.KeySize {
		t.Fatalf("second EnsureKey: %v (same key: %v)", err, bytes.Equal(k1, k2))
	}
	os.WriteFile(p, []byte("c2hvcnQ=\n"), 0o600)
	if _, err := secrets.LoadKey(p); err == nil || !strings.Contains(err.Error(), "32 bytes") {
		t.Fatalf("short key: %v", err)
	}
}

func TestNamesValuesMetadata(t *testing.T) {
	if n, err := secrets.NormalizeName("OpenAI-Key"); err != nil || n != "openai-key" {
		t.Fatalf("name: %q %v", n, err)
	}
	for _, bad := range []string{"", "a{b", "a}b", "a\nb", "sec_x", "SEC_x", strings.Repeat("a", 257)} {
		if _, err := secrets.NormalizeName(bad); !errdefs.IsInvalidArgument(err) {
			t.Errorf("name %q: %v", bad, err)
		}
	}
	for _, bad := range []string{"", "a\r\nInjected: 1", "a\x00", strings.Repeat("a", secrets.MaxValueLen+1)} {
		if err := secrets.ValidateValue(bad); !errdefs.IsInvalidArgument(err) {
			t.Errorf("value %q: %v", bad, err)
		}
	}
	if err := secrets.ValidateValue("Bearer sk-1 with spaces\tand tabs"); err != nil {
		t.Fatal(err)
	}
	many := map[string]string{}
	for i := range 33 {
		many[strings.Repeat("k", i+1)] = "v"
	}
	for _, bad := range []map[string]string{many, {"": "v"}, {strings.Repeat("k", 129): "v"}, {"k": strings.Repeat("v", 1025)}} {
		if err := secrets.ValidateMetadata(bad); !errdefs.IsInvalidArgument(err) {
			t.Errorf("metadata of %d entries: %v", len(bad), err)
		}
	}
	big := map[string]string{}
	for i := range 10 {
		big[strings.Repeat("k", i+1)] = strings.Repeat("v", 1000)
	}
	if err := secrets.ValidateMetadata(big); !errdefs.IsInvalidArgument(err) {
		t.Errorf("metadata over 8192 bytes: %v", err)
	}
}

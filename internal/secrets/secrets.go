// Package secrets seals the values of E2B's secrets API for the store
// (AES-256-GCM under a key only the control plane holds, each value bound
// to its secret's ID and version) and checks what the API accepts: names,
// values and metadata.
package secrets

import (
	"bytes"
	"crypto/aes"
	"crypto/cipher"
	"crypto/rand"
	"crypto/sha256"
	"encoding/base64"
	"encoding/hex"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"unicode"

	"github.com/spore-run/spore/internal/atomicfs"
	"github.com/spore-run/spore/internal/errdefs"
)

// KeySize is the key's length in bytes (AES-256).
const KeySize = 32

// Limits of what the API accepts (E2B documents the metadata ones).
const (
	MaxNameLen            = 256
	MaxValueLen           = 64 << 10
	MaxMetadata           = 32
	MaxMetadataKey        = 128
	MaxMetadataValue      = 1024
	MaxMetadataTotal      = 8192
	IDPrefix              = "sec_"
	format           byte = 1
)

// ErrWrongKey is Open's error for a value sealed under another key (an
// API replica started with a key of its own).
var ErrWrongKey = errors.New("secret sealed under another key: every API replica needs the same --secrets-key-file")

// Box seals and opens values under one key.
type Box struct {
	aead cipher.AEAD
	id   [8]byte // the first bytes of the key's SHA-256: names the key in each sealed value
}

// NewBox returns a box for key (KeySize bytes).
func NewBox(key []byte) (*Box, error) {
	if len(key) != KeySize {
		return nil, fmt.Errorf("secrets key: %d bytes, want %d", len(key), KeySize)
	}
	blk, err := aes.NewCipher(key)
	if err != nil {
		return nil, err
	}
	aead, err := cipher.NewGCM(blk)
	if err != nil {
		return nil, err
	}
	b := &Box{aead: aead}
	sum := sha256.Sum256(key)
	copy(b.id[:], sum[:])
	return b, nil
}

// KeyID names the box's key (hex), never revealing it.
func (b *Box) KeyID() string { return hex.EncodeToString(b.id[:]) }

func aad(id string, version int64) []byte {
	return []byte(id + "\x00" + strconv.FormatInt(version, 10))
}

// Seal encrypts value for secret id at version: format byte, key ID,
// nonce, ciphertext and tag. The ID and version are authenticated, so a
// sealed value copied onto another secret or version does not open.
func (b *Box) Seal(id string, version int64, value []byte) []byte {
	out := make([]byte, 0, 1+len(b.id)+b.aead.NonceSize()+len(value)+b.aead.Overhead())
	out = append(out, format)
	out = append(out, b.id[:]...)
	nonce := make([]byte, b.aead.NonceSize())
	if _, err := rand.Read(nonce); err != nil {
		panic(err) // crypto/rand does not fail on Linux
	}
	out = append(out, nonce...)
	return b.aead.Seal(out, nonce, value, aad(id, version))
}

// Open decrypts what Seal returned for the same id and version.
func (b *Box) Open(id string, version int64, sealed []byte) ([]byte, error) {
	head := 1 + len(b.id) + b.aead.NonceSize()
	if len(sealed) < head+b.aead.Overhead() || sealed[0] != format {
		return nil, fmt.Errorf("secret %s: %w: sealed value malformed", id, errdefs.ErrDataLoss)
	}
	if !bytes.Equal(sealed[1:1+len(b.id)], b.id[:]) {
		return nil, fmt.Errorf("secret %s (key %x, this API's %s): %w", id, sealed[1:1+len(b.id)], b.KeyID(), ErrWrongKey)
	}
	v, err := b.aead.Open(nil, sealed[1+len(b.id):head], sealed[head:], aad(id, version))
	if err != nil {
		return nil, fmt.Errorf("secret %s: %w: sealed value does not authenticate", id, errdefs.ErrDataLoss)
	}
	return v, nil
}

// LoadKey reads a key file: the key in base64 (standard, padded), one
// line, as EnsureKey writes it (`head -c 32 /dev/urandom | base64`).
func LoadKey(path string) ([]byte, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("secrets key: %w", err)
	}
	key, err := base64.StdEncoding.DecodeString(strings.TrimSpace(string(b)))
	if err != nil || len(key) != KeySize {
		return nil, fmt.Errorf("secrets key %s: want %d bytes in base64 (head -c %d /dev/urandom | base64)", path, KeySize, KeySize)
	}
	return key, nil
}

// EnsureKey loads the key at path, generating it (mode 0600) when the
// file does not exist.
func EnsureKey(path string) ([]byte, error) {
	if _, err := os.Stat(path); err == nil {
		return LoadKey(path)
	} else if !errors.Is(err, os.ErrNotExist) {
		return nil, fmt.Errorf("secrets key: %w", err)
	}
	key := make([]byte, KeySize)
	if _, err := rand.Read(key); err != nil {
		return nil, err
	}
	if err := os.MkdirAll(filepath.Dir(path), 0o700); err != nil {
		return nil, err
	}
	if err := atomicfs.WriteFile(path, []byte(base64.StdEncoding.EncodeToString(key)+"\n"), 0o600); err != nil {
		return nil, fmt.Errorf("secrets key: %w", err)
	}
	return key, nil
}

// NewID mints a secret ID.
func NewID() string {
	b := make([]byte, 12)
	if _, err := rand.Read(b); err != nil {
		panic(err)
	}
	return IDPrefix + hex.EncodeToString(b)
}

// IsID says whether ref has the form of a secret ID.
func IsID(ref string) bool { return strings.HasPrefix(ref, IDPrefix) }

// NormalizeName checks a secret's name and returns its stored form (lower
// case). As E2B: not empty, no '{', '}' or control characters (it is
// written into the ${e2b.secrets.<name>} placeholder), not the ID prefix.
func NormalizeName(name string) (string, error) {
	n := strings.ToLower(name)
	switch {
	case n == "" || len(n) > MaxNameLen:
		return "", errdefs.Invalidf("secret name: 1-%d characters", MaxNameLen)
	case strings.ContainsAny(n, "{}") || strings.ContainsFunc(n, unicode.IsControl):
		return "", errdefs.Invalidf("secret name %q: no '{', '}' or control characters (it goes into the ${e2b.secrets.<name>} placeholder)", name)
	case strings.HasPrefix(n, IDPrefix):
		return "", errdefs.Invalidf("secret name %q: the prefix %q is reserved for secret IDs", name, IDPrefix)
	}
	return n, nil
}

// ValidateValue checks a secret's value: 1 byte to MaxValueLen, and no
// CR, LF or NUL (values are written into HTTP header values, where those
// would end the header or the request).
func ValidateValue(v string) error {
	switch {
	case v == "" || len(v) > MaxValueLen:
		return errdefs.Invalidf("secret value: 1-%d bytes", MaxValueLen)
	case strings.ContainsAny(v, "\r\n\x00"):
		return errdefs.Invalidf("secret value: no CR, LF or NUL (values go into HTTP headers)")
	}
	return nil
}

// ValidateMetadata checks a secret's metadata against E2B's limits.
func ValidateMetadata(md map[string]string) error {
	if len(md) > MaxMetadata {
		return errdefs.Invalidf("secret metadata: %d entries, at most %d", len(md), MaxMetadata)
	}
	total := 0
	for k, v := range md {
		if k == "" || len(k) > MaxMetadataKey || len(v) > MaxMetadataValue {
			return errdefs.Invalidf("secret metadata %q: keys 1-%d bytes, values up to %d", k, MaxMetadataKey, MaxMetadataValue)
		}
		total += len(k) + len(v)
	}
	if total > MaxMetadataTotal {
		return errdefs.Invalidf("secret metadata: %d bytes, at most %d", total, MaxMetadataTotal)
	}
	return nil
}

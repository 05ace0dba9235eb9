package server

import (
	"context"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/spore-run/spore/internal/fleetauth"
	"github.com/spore-run/spore/internal/store"
	"github.com/spore-run/spore/internal/store/sqlite"
)

// A replica refuses to start without a secrets key when the store holds
// secrets (it would answer 503 to every one, and create sandboxes with
// credential injection silently off), and starts with one; and a fleet
// with TLS refuses to start without its CA, or with a CA key others can
// read.
func TestReplicaStartChecks(t *testing.T) {
	dir := t.TempDir()
	db := filepath.Join(dir, "spore.db")
	st, err := sqlite.Open(context.Background(), db)
	if err != nil {
		t.Fatal(err)
	}
	if err := st.CreateSecret(context.Background(), store.Secret{ID: "sec_0000000000000001", Name: "vendor", Version: 1, Sealed: []byte("x")}); err != nil {
		t.Fatal(err)
	}
	st.Close()
	run := func(cfg APIConfig) error {
		ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
		defer cancel()
		cfg.Listen, cfg.DatabaseURL, cfg.APIKey = "127.0.0.1:0", db, "spore_configured_key_0123456789"
		cfg.Logger = slog.New(slog.DiscardHandler)
		cfg.Ready = func(string, string) { cancel() }
		return RunAPI(ctx, cfg)
	}
	insecure := FleetConfig{Insecure: true, Token: testToken}
	if err := run(APIConfig{Fleet: insecure}); err == nil || !strings.Contains(err.Error(), "secrets key") {
		t.Fatalf("a store with secrets and no key: %v, want a refusal naming the key", err)
	}
	keyFile := filepath.Join(dir, "secrets-key")
	os.WriteFile(keyFile, []byte("MDEyMzQ1Njc4OWFiY2RlZjAxMjM0NTY3ODlhYmNkZWY=\n"), 0o600)
	if err := run(APIConfig{Fleet: insecure, SecretsKeyFile: keyFile}); err != nil {
		t.Fatalf("with the key: %v", err)
	}
	if err := run(APIConfig{Fleet: FleetConfig{}, SecretsKeyFile: keyFile}); err == nil || !strings.Contains(err.Error(), "--fleet-ca") {
		t.Fatalf("no fleet CA and not insecure: %v", err)
	}
	caDir := filepath.Join(dir, "ca")
	if err := fleetauth.InitCA(caDir); err != nil {
		t.Fatal(err)
	}
	cert, key, _ := fleetauth.CAFiles(caDir)
	os.Chmod(key, 0o644)
	tlsFleet := FleetConfig{CAFile: cert, CAKeyFile: key, Listen: "127.0.0.1:0"}
	if err := run(APIConfig{Fleet: tlsFleet, SecretsKeyFile: keyFile}); err == nil || !strings.Contains(err.Error(), "chmod 600") {
		t.Fatalf("a CA key others can read: %v", err)
	}
	os.Chmod(key, 0o600)
	if err := run(APIConfig{Fleet: tlsFleet, SecretsKeyFile: keyFile}); err != nil {
		t.Fatalf("a fleet with TLS: %v", err)
	}
	// Owned by root, readable by its group (a Kubernetes Secret volume
	// with an fsGroup, systemd's credentials): accepted.
	if os.Geteuid() == 0 {
		os.Chmod(key, 0o640)
		if err := run(APIConfig{Fleet: tlsFleet, SecretsKeyFile: keyFile}); err != nil {
			t.Fatalf("a root-owned CA key of mode 0640: %v", err)
		}
	}
}

package sdk

import (
	"bytes"
	"crypto/rand"
	"crypto/tls"
	"encoding/hex"
	"encoding/pem"
	"fmt"
	"net/http"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/spore-run/spore/internal/dnsfwd/dnstest"
	"github.com/spore-run/spore/internal/testenv"
)

// Credentials injected at egress (credentials.mjs, the stock SDK): an
// HTTPS server of the test internet sees the secret in the header a
// network rule sets, the sandbox never does. After use the sandbox is
// snapshotted, memory included, and no file under the server's data
// directory (the memory image, the sandbox's files, the database) holds
// the secret's value, while a marker kept only in the sandbox's memory is
// found there (the search can see memory).
func TestCredentialsInjectedAtEgress(t *testing.T) {
	rnd := func() string { b := make([]byte, 12); rand.Read(b); return "sk-live-" + hex.EncodeToString(b) }
	value, rotated := rnd(), rnd()
	allowed, other := netip.MustParseAddr("198.19.71.2"), netip.MustParseAddr("198.19.72.2")
	cert := testenv.SelfSignedCert(t, "allowed.test", "other.test")
	caFile := filepath.Join(t.TempDir(), "upstream-ca.pem")
	if err := os.WriteFile(caFile, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: cert.Certificate[0]}), 0o644); err != nil {
		t.Fatal(err)
	}
	var mu sync.Mutex
	var auths []string
	hd := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		a := r.Header.Get("Authorization")
		mu.Lock()
		auths = append(auths, a)
		mu.Unlock()
		switch a {
		case "Bearer " + value:
			fmt.Fprint(w, "auth:ok")
		case "Bearer " + rotated:
			fmt.Fprint(w, "auth:rotated")
		case "":
			fmt.Fprint(w, "auth:none")
		default:
			fmt.Fprint(w, "auth:other")
		}
	})
	for _, h := range []struct {
		name string
		ip   netip.Addr
	}{{"allowed", allowed}, {"other", other}} {
		a := h.ip.As4()
		th := testenv.NewTestHost(t, "spcred-"+h.name, h.ip, netip.AddrFrom4([4]byte{a[0], a[1], a[2], 1}), false)
		plain := &http.Server{Handler: hd, ReadHeaderTimeout: 10 * time.Second}
		go plain.Serve(th.Listen(t, "tcp4", h.ip.String()+":80"))
		tl := &http.Server{Handler: hd, ReadHeaderTimeout: 10 * time.Second, TLSConfig: &tls.Config{Certificates: []tls.Certificate{cert}}}
		go tl.ServeTLS(th.Listen(t, "tcp4", h.ip.String()+":443"), "", "")
		t.Cleanup(func() { plain.Close(); tl.Close() })
		if h.name == "allowed" {
			dns := dnstest.Serve(th.ListenPacket(t, "udp4", h.ip.String()+":53"), th.Listen(t, "tcp4", h.ip.String()+":53"),
				map[string]netip.Addr{"allowed.test": allowed, "other.test": other})
			t.Cleanup(dns.Close)
		}
	}
	s := newServer(t, "--dns-upstream", allowed.String()+":53", "--egress-upstream-ca", caFile)
	out := s.node("credentials.mjs", "SECRET_VALUE="+value, "ROTATED_VALUE="+rotated)
	t.Log(out)
	i := strings.LastIndex(out, "SANDBOX:")
	if i < 0 || !strings.Contains(out, "7 passed, 0 failed") {
		t.Fatal("the SDK part did not pass")
	}
	id := strings.Fields(out[i+len("SANDBOX:"):])[0]
	mu.Lock()
	if !slices.Contains(auths, "Bearer "+value) || !slices.Contains(auths, "Bearer "+rotated) || slices.Contains(auths, "Bearer mine") {
		t.Errorf("the server saw %q", auths)
	}
	mu.Unlock()

	// The marker process is up when its snapshot is taken.
	time.Sleep(time.Second)
	if code, b := s.rest("POST", "/sandboxes/"+id+"/snapshots", `{}`); code != 201 {
		t.Fatalf("snapshot: %d %s", code, b)
	}
	marker := []byte("SPOREMARK" + strings.Repeat("-7f3e", 4))
	var markerIn []string
	filepath.WalkDir(s.data, func(p string, d os.DirEntry, err error) error {
		if err != nil || !d.Type().IsRegular() {
			return nil
		}
		b, err := os.ReadFile(p)
		if err != nil {
			return nil
		}
		if bytes.Contains(b, []byte(value)) || bytes.Contains(b, []byte(rotated)) {
			t.Errorf("%s holds the secret's value", p)
		}
		if bytes.Contains(b, marker) {
			markerIn = append(markerIn, p)
		}
		return nil
	})
	if len(markerIn) == 0 {
		t.Fatal("the memory marker is in no file: the search cannot see the sandbox's memory, so it proves nothing")
	}
	t.Logf("memory marker found in %v", markerIn)
	if code, b := s.rest("DELETE", "/sandboxes/"+id, ""); code != 204 {
		t.Fatalf("kill: %d %s", code, b)
	}
}

package control_test

import (
	"context"
	"crypto/sha256"
	"encoding/base64"
	"fmt"
	"net/url"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/spore-run/spore/internal/control"
	"github.com/spore-run/spore/internal/errdefs"
	"github.com/spore-run/spore/internal/store"
	"github.com/spore-run/spore/internal/store/sqlite"
)

// listCounting counts the store reads a presigned URL check makes.
type listCounting struct {
	store.Store
	lists, gets atomic.Int64
}

func (c *listCounting) ListSandboxes(ctx context.Context, f store.SandboxFilter) ([]store.Sandbox, string, error) {
	c.lists.Add(1)
	return c.Store.ListSandboxes(ctx, f)
}

func (c *listCounting) GetSandbox(ctx context.Context, id string) (store.Sandbox, error) {
	c.gets.Add(1)
	return c.Store.GetSandbox(ctx, id)
}

// runningRows writes n rows of running sandboxes (no node: only their rows
// matter here) and returns their IDs and tokens.
func runningRows(t testing.TB, st store.Store, from, n int) (ids, tokens []string) {
	ctx := context.Background()
	for i := from; i < from+n; i++ {
		id, tok := fmt.Sprintf("i%019d", i), fmt.Sprintf("tok-%d-%d", i, time.Now().UnixNano())
		if err := st.CreateSandbox(ctx, store.Sandbox{ID: id, State: store.StateRunning, TemplateID: "base", NodeID: "n1",
			EnvdAccessToken: tok, StartedAt: time.Now(), EndAt: time.Now().Add(time.Hour)}); err != nil {
			t.Fatal(err)
		}
		ids, tokens = append(ids, id), append(tokens, tok)
	}
	return ids, tokens
}

func presigned(path, op, user, token string, exp int64) url.Values {
	q := url.Values{"path": {path}, "username": {user}}
	raw := path + ":" + op + ":" + user + ":" + token
	if exp != 0 {
		raw += ":" + fmt.Sprint(exp)
		q.Set("signature_expiration", fmt.Sprint(exp))
	}
	sum := sha256.Sum256([]byte(raw))
	q.Set("signature", "v1_"+strings.TrimRight(base64.StdEncoding.EncodeToString(sum[:]), "="))
	return q
}

func openSQLite(t testing.TB) store.Store {
	st, err := sqlite.Open(context.Background(), filepath.Join(t.TempDir(), "spore.db"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { st.Close() })
	return st
}

// A presigned URL of a running sandbox resolves to it, also one made on
// another replica; an expired, foreign or malformed one to nothing; a URL
// used before costs no search; and a request that went stops the search.
func TestSignedBy(t *testing.T) {
	ctx := context.Background()
	st := &listCounting{Store: openSQLite(t)}
	ids, tokens := runningRows(t, st, 0, 50)
	c := control.New(control.Config{Store: st})
	defer c.Close()
	exp := time.Now().Add(time.Hour).Unix()
	for _, i := range []int{0, 17, 49} {
		for _, op := range []string{"read", "write"} {
			got, err := c.SignedBy(ctx, presigned("/home/user/a.txt", op, "user", tokens[i], exp), op)
			if err != nil || got != ids[i] {
				t.Fatalf("sandbox %d %s: %q %v", i, op, got, err)
			}
		}
	}
	// The same URL again: remembered, no search and no store read.
	before := st.lists.Load()
	if got, err := c.SignedBy(ctx, presigned("/home/user/a.txt", "read", "user", tokens[17], exp), "read"); err != nil || got != ids[17] {
		t.Fatalf("again: %q %v", got, err)
	}
	if st.lists.Load() != before {
		t.Fatal("a URL used before read the store again")
	}
	for name, q := range map[string]url.Values{
		"expired":        presigned("/a", "read", "user", tokens[1], time.Now().Add(-time.Minute).Unix()),
		"another op":     presigned("/a", "write", "user", tokens[1], exp),
		"unknown token":  presigned("/a", "read", "user", "not-a-token", exp),
		"no v1 prefix":   {"signature": {"abc"}, "path": {"/a"}},
		"over-long":      {"signature": {"v1_" + strings.Repeat("A", 100)}},
		"bad expiration": {"signature": {"v1_x"}, "signature_expiration": {"soon"}},
	} {
		if got, err := c.SignedBy(ctx, q, "read"); !errdefs.IsNotFound(err) {
			t.Errorf("%s: %q %v, want not found", name, got, err)
		}
	}
	// A sandbox made after this replica's last refresh, by another
	// replica: found once the refresh interval passed.
	more, moreTok := runningRows(t, st, 50, 1)
	time.Sleep(control.PresignRefreshEvery)
	if got, err := c.SignedBy(ctx, presigned("/b", "read", "user", moreTok[0], 0), "read"); err != nil || got != more[0] {
		t.Fatalf("a sandbox made elsewhere: %q %v", got, err)
	}
	cctx, cancel := context.WithCancel(ctx)
	cancel()
	if _, err := c.SignedBy(cctx, presigned("/c", "read", "user", "nobody", exp), "read"); err == nil || errdefs.IsNotFound(err) && cctx.Err() == nil {
		t.Fatalf("a cancelled request: %v", err)
	}
}

// A flood of bad presigned URLs against running rows: no store read per
// URL (at most one paged read of the running rows per
// PresignRefreshEvery), no match, and past the replica's search rate the
// answer is "retry later" rather than more work. (Sized for -race, where a
// hash costs ~100 times more; the 10,000 × 1,000 figures:
// BenchmarkBadSignedURL.)
func TestBadSignedURLFlood(t *testing.T) {
	ctx := context.Background()
	st := &listCounting{Store: openSQLite(t)}
	runningRows(t, st, 0, 100)
	c := control.New(control.Config{Store: st})
	defer c.Close()
	const n = 2000
	exp := time.Now().Add(time.Hour).Unix()
	start := time.Now()
	notFound, limited := 0, 0
	for i := range n {
		_, err := c.SignedBy(ctx, presigned(fmt.Sprintf("/f%d", i), "read", "user", "forged", exp), "read")
		switch {
		case errdefs.IsNotFound(err):
			notFound++
		case errdefs.IsUnavailable(err):
			t.Fatal(err)
		case err != nil:
			limited++
		default:
			t.Fatal("a forged URL matched")
		}
	}
	took := time.Since(start)
	lists := st.lists.Load()
	t.Logf("%d bad URLs against 100 running rows: %v, %d searched (not found), %d refused (retry later), %d paged store reads, %d row reads",
		n, took, notFound, limited, lists, st.gets.Load())
	// One refresh per interval at most, each a paged read (one page).
	if max := int64(took/control.PresignRefreshEvery) + 2; lists > max || st.gets.Load() != 0 {
		t.Fatalf("%d store list reads and %d row reads in %v: want at most %d and none", lists, st.gets.Load(), took, max)
	}
	if notFound == 0 || notFound+limited != n {
		t.Fatalf("%d not found, %d limited of %d", notFound, limited, n)
	}
}

// BenchmarkBadSignedURL is the cost of one bad presigned URL against 1,000
// running rows (the search: the rate bound is off).
func BenchmarkBadSignedURL(b *testing.B) {
	ctx := context.Background()
	st := &listCounting{Store: openSQLite(b)}
	runningRows(b, st, 0, 1000)
	c := control.New(control.Config{Store: st, PresignSearchRate: -1})
	defer c.Close()
	exp := time.Now().Add(time.Hour).Unix()
	c.SignedBy(ctx, presigned("/warm", "read", "user", "forged", exp), "read")
	b.ResetTimer()
	for i := 0; b.Loop(); i++ {
		c.SignedBy(ctx, presigned(fmt.Sprintf("/f%d", i), "read", "user", "forged", exp), "read")
	}
	b.ReportMetric(float64(st.lists.Load())/float64(b.N), "lists/op")
}

// BenchmarkBadSignedURLFlood is the measure: 10,000 bad presigned
// URLs against 1,000 running rows, as fast as one client sends them, with
// the default rate bound (go test -run '^$' -bench BadSignedURLFlood
// -benchtime 1x ./internal/control/).
func BenchmarkBadSignedURLFlood(b *testing.B) {
	ctx := context.Background()
	st := &listCounting{Store: openSQLite(b)}
	runningRows(b, st, 0, 1000)
	exp := time.Now().Add(time.Hour).Unix()
	for b.Loop() {
		c := control.New(control.Config{Store: st})
		st.lists.Store(0)
		start := time.Now()
		searched, limited := 0, 0
		for i := range 10000 {
			_, err := c.SignedBy(ctx, presigned(fmt.Sprintf("/f%d", i), "read", "user", "forged", exp), "read")
			if errdefs.IsNotFound(err) {
				searched++
			} else {
				limited++
			}
		}
		b.ReportMetric(float64(time.Since(start).Milliseconds()), "ms/10k")
		b.ReportMetric(float64(st.lists.Load()), "lists/10k")
		b.ReportMetric(float64(searched), "searched/10k")
		b.ReportMetric(float64(limited), "limited/10k")
		c.Close()
	}
}

// Package blobtest is the conformance suite of blob.Store: every
// implementation runs it from its own tests,
//
//	func TestConformance(t *testing.T) {
//		blobtest.Run(t, func(t *testing.T) blob.Store { return open(t) })
//	}
//
// Each subtest gets a new, empty store from the factory.
package blobtest

import (
	"bytes"
	"context"
	"crypto/sha256"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/spore-run/spore/internal/blob"
	"github.com/spore-run/spore/internal/errdefs"
	"github.com/spore-run/spore/internal/testenv"
)

// Factory returns a new, empty store for one subtest (cleaned up by t).
type Factory func(t *testing.T) blob.Store

// Run runs the whole suite against the stores f makes.
func Run(t *testing.T, f Factory) {
	tests := []struct {
		name string
		fn   func(*testing.T, blob.Store)
	}{
		{"RoundTrip", testRoundTrip},
		{"Overwrite", testOverwrite},
		{"GetRange", testGetRange},
		{"Stat", testStat},
		{"Delete", testDelete},
		{"NotFound", testNotFound},
		{"List", testList},
		{"ListPaging", testListPaging},
		{"BadKeys", testBadKeys},
		{"AtomicPut", testAtomicPut},
		{"ConcurrentReaders", testConcurrentReaders},
		{"ConcurrentPutsSameKey", testConcurrentPuts},
		{"Cancel", testCancel},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) { tc.fn(t, f(t)) })
	}
}

func ctxT(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(t.Context(), 5*time.Minute)
	t.Cleanup(cancel)
	return ctx
}

// data returns n pseudo-random bytes from a seed the test logs.
func data(t *testing.T, n int) []byte {
	r := testenv.Rand(t)
	b := make([]byte, n)
	c := rand.NewChaCha8([32]byte{byte(r.Uint64()), byte(r.Uint64()), byte(r.Uint64())})
	c.Read(b)
	return b
}

func put(t *testing.T, ctx context.Context, s blob.Store, key string, b []byte) {
	t.Helper()
	// A plain io.Reader (not a bytes.Reader, which is also a Seeker) is
	// what most callers pass: stores must not rely on seeking.
	if err := s.Put(ctx, key, struct{ io.Reader }{bytes.NewReader(b)}, int64(len(b))); err != nil {
		t.Fatalf("Put %s (%d bytes): %v", key, len(b), err)
	}
}

func read(t *testing.T, rc io.ReadCloser, err error) []byte {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
	defer rc.Close()
	b, err := io.ReadAll(rc)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

func get(t *testing.T, ctx context.Context, s blob.Store, key string) []byte {
	t.Helper()
	rc, err := s.Get(ctx, key)
	return read(t, rc, err)
}

func same(t *testing.T, what string, got, want []byte) {
	t.Helper()
	if !bytes.Equal(got, want) {
		t.Fatalf("%s: got %d bytes (sha256 %x), want %d bytes (sha256 %x)",
			what, len(got), sha256.Sum256(got), len(want), sha256.Sum256(want))
	}
}

func wantKind(t *testing.T, what string, err, kind error) {
	t.Helper()
	if !errors.Is(err, kind) {
		t.Fatalf("%s: got error %v, want one of kind %q", what, err, kind)
	}
}

func keys(t *testing.T, ctx context.Context, s blob.Store, prefix string) []string {
	t.Helper()
	var out []string
	if err := s.List(ctx, prefix, func(i blob.Info) error {
		out = append(out, i.Key)
		return nil
	}); err != nil {
		t.Fatalf("List %q: %v", prefix, err)
	}
	return out
}

func testRoundTrip(t *testing.T, s blob.Store) {
	ctx := ctxT(t)
	for _, n := range []int{0, 1, 20 << 20} {
		key := fmt.Sprintf("round/trip-%d", n)
		b := data(t, n)
		put(t, ctx, s, key, b)
		same(t, "Get "+key, get(t, ctx, s, key), b)
		info, err := s.Stat(ctx, key)
		if err != nil {
			t.Fatal(err)
		}
		if info.Key != key || info.Size != int64(n) {
			t.Fatalf("Stat %s = %+v, want size %d", key, info, n)
		}
	}
}

func testOverwrite(t *testing.T, s blob.Store) {
	ctx := ctxT(t)
	a, b := data(t, 3000), data(t, 1000)
	put(t, ctx, s, "over/write", a)
	put(t, ctx, s, "over/write", b)
	same(t, "Get after overwrite", get(t, ctx, s, "over/write"), b)
	if info, err := s.Stat(ctx, "over/write"); err != nil || info.Size != 1000 {
		t.Fatalf("Stat after overwrite = %+v, %v; want size 1000", info, err)
	}
}

func testGetRange(t *testing.T, s blob.Store) {
	ctx := ctxT(t)
	b := data(t, 1000)
	put(t, ctx, s, "range", b)
	put(t, ctx, s, "empty", nil)
	for _, r := range []struct{ off, n int64 }{
		{100, 200}, {0, 1000}, {0, -1}, {900, -1}, {999, 1}, {999, -1}, {1000, -1}, {1000, 0}, {500, 0},
	} {
		rc, err := s.GetRange(ctx, "range", r.off, r.n)
		end := int64(len(b))
		if r.n >= 0 {
			end = r.off + r.n
		}
		same(t, fmt.Sprintf("GetRange(%d, %d)", r.off, r.n), read(t, rc, err), b[r.off:end])
	}
	for _, r := range []struct{ off, n int64 }{{0, -1}, {0, 0}} {
		rc, err := s.GetRange(ctx, "empty", r.off, r.n)
		same(t, fmt.Sprintf("GetRange of an empty object (%d, %d)", r.off, r.n), read(t, rc, err), nil)
	}
	for _, r := range []struct {
		key    string
		off, n int64
	}{{"range", 1001, -1}, {"range", 1001, 0}, {"range", 900, 101}, {"range", 0, 1001}, {"range", -1, 10}, {"empty", 0, 1}, {"empty", 1, -1}} {
		rc, err := s.GetRange(ctx, r.key, r.off, r.n)
		if err == nil {
			rc.Close()
		}
		wantKind(t, fmt.Sprintf("GetRange(%s, %d, %d)", r.key, r.off, r.n), err, errdefs.ErrInvalidArgument)
	}
}

func testStat(t *testing.T, s blob.Store) {
	ctx := ctxT(t)
	before := time.Now()
	put(t, ctx, s, "stat/me", data(t, 4321))
	after := time.Now()
	info, err := s.Stat(ctx, "stat/me")
	if err != nil {
		t.Fatal(err)
	}
	if info.Key != "stat/me" || info.Size != 4321 {
		t.Fatalf("Stat = %+v, want key stat/me size 4321", info)
	}
	// The store's clock (a server's, a file system's): the same host here,
	// but S3 reports whole seconds, so allow a little either side.
	if info.Modified.Before(before.Add(-2*time.Second)) || info.Modified.After(after.Add(2*time.Second)) {
		t.Fatalf("Stat Modified = %v, want between %v and %v", info.Modified, before, after)
	}
}

func testDelete(t *testing.T, s blob.Store) {
	ctx := ctxT(t)
	put(t, ctx, s, "del/a", []byte("a"))
	put(t, ctx, s, "del/b", []byte("b"))
	if err := s.Delete(ctx, "del/a"); err != nil {
		t.Fatal(err)
	}
	_, err := s.Get(ctx, "del/a")
	wantKind(t, "Get after Delete", err, errdefs.ErrNotFound)
	_, err = s.Stat(ctx, "del/a")
	wantKind(t, "Stat after Delete", err, errdefs.ErrNotFound)
	if err := s.Delete(ctx, "del/a"); err != nil {
		t.Fatalf("second Delete: %v", err)
	}
	if err := s.Delete(ctx, "never/there"); err != nil {
		t.Fatalf("Delete of a missing key: %v", err)
	}
	same(t, "the other object", get(t, ctx, s, "del/b"), []byte("b"))
	if got := keys(t, ctx, s, ""); !slices.Equal(got, []string{"del/b"}) {
		t.Fatalf("List after Delete = %v, want [del/b]", got)
	}
	// The emptied folder holds objects again.
	put(t, ctx, s, "del/a", []byte("again"))
	same(t, "Put after Delete", get(t, ctx, s, "del/a"), []byte("again"))
}

func testNotFound(t *testing.T, s blob.Store) {
	ctx := ctxT(t)
	put(t, ctx, s, "present/x", []byte("x"))
	for _, key := range []string{"missing", "present/y", "present"} {
		_, err := s.Get(ctx, key)
		wantKind(t, "Get "+key, err, errdefs.ErrNotFound)
		_, err = s.GetRange(ctx, key, 0, -1)
		wantKind(t, "GetRange "+key, err, errdefs.ErrNotFound)
		_, err = s.Stat(ctx, key)
		wantKind(t, "Stat "+key, err, errdefs.ErrNotFound)
	}
}

func testList(t *testing.T, s blob.Store) {
	ctx := ctxT(t)
	all := []string{"a-b", "a/b-c", "a/b/c", "a/b/d", "a/c", "a0", "ab", "b", "b.x/y", "b_", "z/z/z/z"}
	// Put in a scrambled order: the order of List is the keys', not the puts'.
	for _, i := range []int{5, 2, 9, 0, 7, 3, 10, 1, 8, 6, 4} {
		put(t, ctx, s, all[i], []byte(all[i]))
	}
	for _, c := range []struct {
		prefix string
		want   []string
	}{
		{"", all},
		{"a", all[:7]},
		{"a/", all[1:5]},
		{"a/b", all[1:4]},
		{"a/b/", all[2:4]},
		{"a/b/c", all[2:3]},
		{"b", all[7:10]},
		{"z/z/", all[10:]},
		{"nothing", nil},
		{"a//", nil},
		{"a/../", nil},
	} {
		if got := keys(t, ctx, s, c.prefix); !slices.Equal(got, c.want) {
			t.Errorf("List %q = %q, want %q", c.prefix, got, c.want)
		}
	}
	var infos []blob.Info
	if err := s.List(ctx, "a/b/", func(i blob.Info) error { infos = append(infos, i); return nil }); err != nil {
		t.Fatal(err)
	}
	for _, i := range infos {
		if i.Size != int64(len(i.Key)) || i.Modified.IsZero() {
			t.Errorf("List info %+v: want size %d and a time", i, len(i.Key))
		}
	}
	stop := errors.New("stop here")
	calls := 0
	err := s.List(ctx, "", func(blob.Info) error { calls++; return stop })
	if !errors.Is(err, stop) || calls != 1 {
		t.Fatalf("List whose fn fails: %v after %d calls, want the fn's error after 1", err, calls)
	}
	err = s.List(ctx, "A", func(blob.Info) error { return nil })
	wantKind(t, "List with an upper-case prefix", err, errdefs.ErrInvalidArgument)
}

// testListPaging lists more keys than one S3 page (1000) holds.
func testListPaging(t *testing.T, s blob.Store) {
	ctx := ctxT(t)
	const n = 1100
	var want []string
	for i := range n {
		want = append(want, fmt.Sprintf("page/%04d", i))
	}
	work := make(chan string)
	errs := make(chan error, 8)
	var wg sync.WaitGroup
	for range 8 {
		wg.Go(func() {
			for k := range work {
				if err := s.Put(ctx, k, strings.NewReader(k), int64(len(k))); err != nil {
					errs <- err
					return
				}
			}
		})
	}
	for _, i := range testenv.Rand(t).Perm(n) {
		work <- want[i]
	}
	close(work)
	wg.Wait()
	close(errs)
	if err := <-errs; err != nil {
		t.Fatal(err)
	}
	put(t, ctx, s, "pagf", []byte("after the pages"))
	if got := keys(t, ctx, s, "page/"); !slices.Equal(got, want) {
		t.Fatalf("List page/: %d keys, want %d in order (first difference at %d)", len(got), n, firstDiff(got, want))
	}
	stop := errors.New("enough")
	var got []string
	err := s.List(ctx, "", func(i blob.Info) error {
		if len(got) == 1050 {
			return stop
		}
		got = append(got, i.Key)
		return nil
	})
	if !errors.Is(err, stop) || !slices.Equal(got, want[:1050]) {
		t.Fatalf("List stopped on the second page: %v with %d keys, want the fn's error after 1050", err, len(got))
	}
}

func firstDiff(a, b []string) int {
	for i := range min(len(a), len(b)) {
		if a[i] != b[i] {
			return i
		}
	}
	return min(len(a), len(b))
}

// BadKeys are keys every store refuses.
var BadKeys = []string{
	"", "/", "/a", "a/", "a//b", "..", "../x", "x/..", "a/./b", ".", "./a", "A", "a/B", "a b", "a\x00b",
	"a\\b", "é", "a:b", "a?b", "a*b", strings.Repeat("a", blob.MaxElemLen+1),
	"x/" + strings.Repeat("a", blob.MaxElemLen+1), strings.Repeat("a/", blob.MaxKeyLen/2) + "a",
}

// longestKey is a valid key of MaxKeyLen bytes with elements of MaxElemLen.
var longestKey = strings.Repeat("k", blob.MaxElemLen) + "/" + strings.Repeat("k", blob.MaxElemLen-1) + "/k"

func testBadKeys(t *testing.T, s blob.Store) {
	ctx := ctxT(t)
	put(t, ctx, s, "a/b", []byte("keep"))
	put(t, ctx, s, longestKey, []byte("longest"))
	for _, key := range BadKeys {
		name := key
		if len(name) > 40 {
			name = name[:40] + "..."
		}
		r := &countingReader{r: strings.NewReader("bad")}
		wantKind(t, fmt.Sprintf("Put %q", name), s.Put(ctx, key, r, 3), errdefs.ErrInvalidArgument)
		if r.n != 0 {
			t.Errorf("Put %q read its body before refusing the key", name)
		}
		_, err := s.Get(ctx, key)
		wantKind(t, fmt.Sprintf("Get %q", name), err, errdefs.ErrInvalidArgument)
		_, err = s.GetRange(ctx, key, 0, 1)
		wantKind(t, fmt.Sprintf("GetRange %q", name), err, errdefs.ErrInvalidArgument)
		_, err = s.Stat(ctx, key)
		wantKind(t, fmt.Sprintf("Stat %q", name), err, errdefs.ErrInvalidArgument)
		wantKind(t, fmt.Sprintf("Delete %q", name), s.Delete(ctx, key), errdefs.ErrInvalidArgument)
	}
	wantKind(t, "Put with a negative size", s.Put(ctx, "neg", strings.NewReader(""), -1), errdefs.ErrInvalidArgument)
	if got, want := keys(t, ctx, s, ""), []string{"a/b", longestKey}; !slices.Equal(got, want) {
		t.Fatalf("after the bad keys the store holds %q, want %q", got, want)
	}
	same(t, "a/b", get(t, ctx, s, "a/b"), []byte("keep"))
}

type countingReader struct {
	r io.Reader
	n int
}

func (c *countingReader) Read(p []byte) (int, error) {
	n, err := c.r.Read(p)
	c.n += n
	return n, err
}

// failingReader yields n bytes of data, then fails with err (io.EOF: a
// reader shorter than the Put's size).
type failingReader struct {
	data []byte
	n    int
	err  error
	hook func() // called when it fails
}

func (f *failingReader) Read(p []byte) (int, error) {
	if f.n == 0 {
		if f.hook != nil {
			f.hook()
		}
		return 0, f.err
	}
	k := copy(p[:min(len(p), f.n)], f.data)
	f.data, f.n = f.data[k:], f.n-k
	return k, nil
}

func testAtomicPut(t *testing.T, s blob.Store) {
	ctx := ctxT(t)
	const size = 8 << 20
	old, next := data(t, size/2), data(t, size)
	broken := errors.New("the source broke")
	cases := []struct {
		name string
		err  error
		kind error
	}{
		{"reader fails", broken, broken},
		{"reader ends early", io.EOF, io.ErrUnexpectedEOF},
	}
	for _, c := range cases {
		for _, existing := range []bool{true, false} {
			key := fmt.Sprintf("atomic/%s-%v", strings.ReplaceAll(c.name, " ", "-"), existing)
			if existing {
				put(t, ctx, s, key, old)
			}
			err := s.Put(ctx, key, &failingReader{data: next, n: size / 2, err: c.err}, size)
			if !errors.Is(err, c.kind) {
				t.Fatalf("%s: Put = %v, want an error wrapping %v", c.name, err, c.kind)
			}
			if existing {
				same(t, c.name+": the previous object", get(t, ctx, s, key), old)
			} else {
				_, err := s.Stat(ctx, key)
				wantKind(t, c.name+": Stat of a key whose first Put failed", err, errdefs.ErrNotFound)
			}
		}
	}
	// Cancelled midway.
	cctx, cancel := context.WithCancel(ctx)
	put(t, ctx, s, "atomic/cancel", old)
	err := s.Put(cctx, "atomic/cancel", &failingReader{data: next, n: size / 2, err: context.Canceled, hook: cancel}, size)
	if !errors.Is(err, context.Canceled) {
		t.Fatalf("Put cancelled midway = %v, want context.Canceled", err)
	}
	same(t, "the object after a cancelled Put", get(t, ctx, s, "atomic/cancel"), old)
	if got := keys(t, ctx, s, ""); len(got) != 3 {
		t.Fatalf("after failed puts the store holds %q, want the 3 previous objects", got)
	}
}

// testConcurrentReaders overwrites one key with two values while readers
// read it: each read is one whole value, never a mix or a part.
func testConcurrentReaders(t *testing.T, s blob.Store) {
	ctx := ctxT(t)
	vals := [][]byte{bytes.Repeat([]byte{'a'}, 3<<20), bytes.Repeat([]byte{'b'}, 2<<20+12345)}
	put(t, ctx, s, "hot", vals[0])
	done := make(chan struct{})
	var wg sync.WaitGroup
	wg.Go(func() {
		defer close(done)
		for i := range 20 {
			if err := s.Put(ctx, "hot", bytes.NewReader(vals[i%2]), int64(len(vals[i%2]))); err != nil {
				t.Errorf("Put: %v", err)
				return
			}
		}
	})
	var reads sync.Map
	for r := range 3 {
		wg.Go(func() {
			for n := 0; ; n++ {
				select {
				case <-done:
					reads.Store(r, n)
					return
				default:
				}
				rc, err := s.Get(ctx, "hot")
				if err != nil {
					t.Errorf("Get: %v", err)
					return
				}
				b, err := io.ReadAll(rc)
				rc.Close()
				if err != nil {
					t.Errorf("read: %v", err)
					return
				}
				if !bytes.Equal(b, vals[0]) && !bytes.Equal(b, vals[1]) {
					t.Errorf("a reader saw %d bytes that are neither value (first %q, last %q)", len(b), b[:min(len(b), 1)], b[max(len(b)-1, 0):])
					return
				}
			}
		})
	}
	wg.Wait()
	reads.Range(func(k, v any) bool { t.Logf("reader %v: %v whole reads", k, v); return true })
}

func testConcurrentPuts(t *testing.T, s blob.Store) {
	ctx := ctxT(t)
	const n = 6
	vals := make([][]byte, n)
	var wg sync.WaitGroup
	for i := range n {
		vals[i] = bytes.Repeat([]byte{byte('a' + i)}, 1<<20+i)
		wg.Go(func() {
			if err := s.Put(ctx, "same/key", bytes.NewReader(vals[i]), int64(len(vals[i]))); err != nil {
				t.Errorf("Put %d: %v", i, err)
			}
		})
	}
	wg.Wait()
	got := get(t, ctx, s, "same/key")
	if !slices.ContainsFunc(vals, func(v []byte) bool { return bytes.Equal(v, got) }) {
		t.Fatalf("after %d concurrent puts the object is %d bytes that are none of them", n, len(got))
	}
}

func testCancel(t *testing.T, s blob.Store) {
	ctx := ctxT(t)
	b := data(t, 8<<20)
	put(t, ctx, s, "cancel/big", b)
	done, cancel := context.WithCancel(ctx)
	cancel()
	want := func(what string, err error) {
		t.Helper()
		if !errors.Is(err, context.Canceled) {
			t.Fatalf("%s with a cancelled context: %v, want context.Canceled", what, err)
		}
	}
	want("Put", s.Put(done, "cancel/new", bytes.NewReader(b[:10]), 10))
	_, err := s.Get(done, "cancel/big")
	want("Get", err)
	_, err = s.GetRange(done, "cancel/big", 1, 2)
	want("GetRange", err)
	_, err = s.Stat(done, "cancel/big")
	want("Stat", err)
	want("Delete", s.Delete(done, "cancel/big"))
	want("List", s.List(done, "", func(blob.Info) error { return nil }))
	if got := keys(t, ctx, s, ""); !slices.Equal(got, []string{"cancel/big"}) {
		t.Fatalf("after cancelled calls the store holds %q, want [cancel/big]", got)
	}
	// Cancelled while reading a body: the reads fail.
	rctx, rcancel := context.WithCancel(ctx)
	rc, err := s.Get(rctx, "cancel/big")
	if err != nil {
		t.Fatal(err)
	}
	defer rc.Close()
	if _, err := io.ReadFull(rc, make([]byte, 1)); err != nil {
		t.Fatal(err)
	}
	rcancel()
	n, err := io.Copy(io.Discard, rc)
	if err == nil {
		t.Fatalf("reading a body after its context was cancelled: %d more bytes and no error", n)
	}
}

package oci

import (
	"context"
	"errors"
	"net"
	"strings"
	"testing"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/mutate"

	"github.com/spore-run/spore/internal/errdefs"
)

var local = Options{Insecure: true}

func TestPullByTagAndByDigest(t *testing.T) {
	r := newRegistry(t)
	img := imageOf(t, "linux/amd64", layerOf(t, file("hello", "hi", 0o644)))
	ref := r.push(t, "app:v1", img)
	want, _ := img.Digest()

	ctx := context.Background()
	byTag, err := Pull(ctx, ref, local)
	if err != nil {
		t.Fatal(err)
	}
	got, _ := byTag.Digest()
	if got != want || byTag.Ref != ref || byTag.Platform != "linux/amd64" {
		t.Fatalf("by tag: digest %s ref %s platform %q, want %s %s linux/amd64", got, byTag.Ref, byTag.Platform, want, ref)
	}
	byDigest, err := Pull(ctx, r.host+"/app@"+want.String(), local)
	if err != nil {
		t.Fatal(err)
	}
	if got, _ := byDigest.Digest(); got != want {
		t.Fatalf("by digest: %s, want %s", got, want)
	}
}

func TestPullErrorKinds(t *testing.T) {
	r := newRegistry(t)
	r.push(t, "app:v1", imageOf(t, "", layerOf(t, file("x", "x", 0o644))))
	// A port nothing listens on.
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	dead := l.Addr().String()
	l.Close()

	ctx := context.Background()
	for _, c := range []struct {
		name, ref string
		opts      Options
		kind      error
		says      string
	}{
		{"unknown tag", r.host + "/app:v2", local, errdefs.ErrNotFound, ""},
		{"unknown repo", r.host + "/nope:v1", local, errdefs.ErrNotFound, ""},
		{"unknown digest", r.host + "/app@sha256:" + strings.Repeat("0", 64), local, errdefs.ErrNotFound, ""},
		{"malformed", r.host + "/App:v1::", local, errdefs.ErrInvalidArgument, "reference"},
		{"bad platform", r.host + "/app:v1", Options{Insecure: true, Platform: "amd64"}, errdefs.ErrInvalidArgument, "platform"},
		{"plain http not allowed", r.host + "/app:v1", Options{}, errdefs.ErrInvalidArgument, "Insecure"},
		{"unreachable", dead + "/app:v1", local, errdefs.ErrUnavailable, ""},
	} {
		t.Run(c.name, func(t *testing.T) {
			_, err := Pull(ctx, c.ref, c.opts)
			t.Logf("%v", err)
			if !errors.Is(err, c.kind) || !strings.Contains(err.Error(), c.says) {
				t.Fatalf("err %v, want kind %v saying %q", err, c.kind, c.says)
			}
		})
	}
}

func TestPullAuth(t *testing.T) {
	r := newRegistry(t)
	r.user, r.pass, r.token = "alice", "s3cret", "tok-123"
	ref := r.push(t, "private:v1", imageOf(t, "", layerOf(t, file("x", "x", 0o644))))

	ctx := context.Background()
	for _, c := range []struct {
		name string
		opts Options
		ok   bool
	}{
		{"anonymous", Options{Insecure: true}, false},
		{"wrong password", Options{Insecure: true, Username: "alice", Password: "nope"}, false},
		{"wrong token", Options{Insecure: true, Token: "nope"}, false},
		{"basic", Options{Insecure: true, Username: "alice", Password: "s3cret"}, true},
		{"bearer token", Options{Insecure: true, Token: "tok-123"}, true},
	} {
		t.Run(c.name, func(t *testing.T) {
			img, err := Pull(ctx, ref, c.opts)
			if c.ok {
				if err != nil {
					t.Fatal(err)
				}
				// The layers come through the same credentials.
				if _, err := Unpack(ctx, img, t.TempDir(), Limits{}); err != nil {
					t.Fatal(err)
				}
				return
			}
			if !errors.Is(err, ErrUnauthorized) || !errdefs.IsInvalidArgument(err) {
				t.Fatalf("err %v, want ErrUnauthorized", err)
			}
		})
	}
	if _, err := Pull(ctx, ref, Options{Insecure: true, Token: "t", Username: "u"}); !errdefs.IsInvalidArgument(err) {
		t.Fatalf("token and username together: %v", err)
	}
}

func TestPullSelectsPlatformFromIndex(t *testing.T) {
	r := newRegistry(t)
	amd := imageOf(t, "linux/amd64", layerOf(t, file("arch", "amd64", 0o644)))
	arm := imageOf(t, "linux/arm64/v8", layerOf(t, file("arch", "arm64", 0o644)))
	idx := mutate.AppendManifests(empty.Index,
		mutate.IndexAddendum{Add: amd, Descriptor: v1.Descriptor{Platform: &v1.Platform{OS: "linux", Architecture: "amd64"}}},
		mutate.IndexAddendum{Add: arm, Descriptor: v1.Descriptor{Platform: &v1.Platform{OS: "linux", Architecture: "arm64", Variant: "v8"}}},
	)
	ref := r.pushIndex(t, "multi:v1", idx)
	ctx := context.Background()

	for _, c := range []struct {
		platform string
		want     v1.Image
	}{{"", amd}, {"linux/amd64", amd}, {"linux/arm64", arm}, {"linux/arm64/v8", arm}} {
		img, err := Pull(ctx, ref, Options{Insecure: true, Platform: c.platform})
		if err != nil {
			t.Fatalf("%q: %v", c.platform, err)
		}
		got, _ := img.Digest()
		want, _ := c.want.Digest()
		if got != want {
			t.Fatalf("platform %q: got %s, want %s", c.platform, got, want)
		}
	}
	_, err := Pull(ctx, ref, Options{Insecure: true, Platform: "linux/s390x"})
	if !errdefs.IsNotFound(err) || !strings.Contains(err.Error(), "linux/amd64, linux/arm64/v8") {
		t.Fatalf("missing platform: %v", err)
	}
	// A single-platform image for another platform is refused the same way.
	single := r.push(t, "armonly:v1", arm)
	if _, err := Pull(ctx, single, local); !errdefs.IsNotFound(err) || !strings.Contains(err.Error(), "linux/arm64") {
		t.Fatalf("single arm64 image pulled as amd64: %v", err)
	}
}

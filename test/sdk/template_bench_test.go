package sdk

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/spore-run/spore/internal/build"
	"github.com/spore-run/spore/internal/testenv"
)

// BenchmarkTemplateBuild times template builds through E2B's build API
// (request, start, status polled every 10 ms until ready) against a real
// server and an in-process registry:
//
//	go test -run '^$' -bench BenchmarkTemplateBuild -benchtime 5x ./test/sdk/
//
// image-first: the first build of an image (pull, unpack, register,
// boot, snapshot the image's template) with 3 steps; cached-image-3-steps:
// the image's template kept, 3 steps that changed (a run, an env, a
// workdir) each snapshotted for the cache, start and ready, the template;
// rebuild-cached: the same spec again (every step a cache hit: a sandbox
// from the final cache entry, snapshotted as the template).
func BenchmarkTemplateBuild(b *testing.B) {
	reg := testenv.NewRegistry(b, "", "")
	s := newServer(b, "--insecure-registry", registryHost(b, reg.Push(b, "bench/busybox:1", testenv.BusyboxImage(b))))
	image := func(i int) string {
		return reg.Push(b, fmt.Sprintf("bench/busybox:%d", i+2), testenv.BusyboxImage(b))
	}
	spec := func(ref, text string) string {
		return fmt.Sprintf(`{"fromImage":%q,"steps":[{"type":"RUN","args":["echo %s > /srv/work/x"]},{"type":"ENV","args":["K","%s"]},{"type":"WORKDIR","args":["/srv/%s"]}],"startCmd":"sleep 100000"}`, ref, text, text, text)
	}
	n := 0
	b.Run("image-first", func(b *testing.B) {
		for i := 0; i < b.N; i++ {
			b.StopTimer()
			// A new tag of the same layers: the image's template is made
			// again (a new reference), its tree is shared.
			ref := image(n)
			n++
			b.StartTimer()
			buildOnce(b, s, "bench-first", spec(ref, "a"))
			b.StopTimer()
		}
	})
	ref := image(n)
	buildOnce(b, s, "bench-cached", spec(ref, "warm"))
	v := 0
	b.Run("cached-image-3-steps", func(b *testing.B) {
		for i := 0; i < b.N; i++ {
			v++ // changed steps every time, across the runs of this function
			buildOnce(b, s, "bench-cached", spec(ref, fmt.Sprintf("v%d", v)))
		}
	})
	b.Run("rebuild-cached", func(b *testing.B) {
		for i := 0; i < b.N; i++ {
			buildOnce(b, s, "bench-cached", spec(ref, "warm"))
		}
	})
}

// buildOnce requests and starts a build of spec under name and waits for
// it to end; it returns the build's status body.
func buildOnce(tb testing.TB, s *server, name, spec string) string {
	tb.Helper()
	code, body := s.rest("POST", "/v3/templates", fmt.Sprintf(`{"name":%q}`, name))
	if code != 202 {
		tb.Fatalf("request: %d %s", code, body)
	}
	var r struct{ TemplateID, BuildID string }
	json.Unmarshal(body, &r)
	if code, body := s.rest("POST", "/v2/templates/"+r.TemplateID+"/builds/"+r.BuildID, spec); code != 202 {
		tb.Fatalf("start: %d %s", code, body)
	}
	deadline := time.Now().Add(5 * time.Minute)
	for {
		_, body = s.rest("GET", "/templates/"+r.TemplateID+"/builds/"+r.BuildID+"/status", "")
		switch {
		case strings.Contains(string(body), `"status":"ready"`):
			return string(body)
		case strings.Contains(string(body), `"status":"error"`), time.Now().After(deadline):
			tb.Fatalf("build %s: %s", name, body)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// BenchmarkExportColdStart times the export of a base sandbox's
// filesystem after a small change (pushed to an in-process registry; the
// root filesystem's layer is made by a first export outside the timing)
// and a cold start from the exported image: a template built from it
// (pull, unpack, register, boot, snapshot) and a sandbox created from
// that template.
//
//	go test -run '^$' -bench BenchmarkExportColdStart -benchtime 5x ./test/sdk/
func BenchmarkExportColdStart(b *testing.B) {
	reg := testenv.NewRegistry(b, "", "")
	host := registryHost(b, reg.Push(b, "seed/busybox:1", testenv.BusyboxImage(b)))
	s := newServer(b, "--insecure-registry", host)
	code, body := s.rest("POST", "/v2/sandboxes", `{"templateID":"base","timeout":3600}`)
	if code != 201 {
		b.Fatalf("create: %d %s", code, body)
	}
	var sb struct{ SandboxID, EnvdAccessToken string }
	json.Unmarshal(body, &sb)
	rem := &build.Remote{HTTP: &http.Client{}, Base: "http://" + s.addr, SID: sb.SandboxID, Token: sb.EnvdAccessToken}
	n := 0
	export := func(b *testing.B) string {
		n++
		if code, err := rem.Run(context.Background(), []string{"/bin/sh", "-c", fmt.Sprintf("echo %d > /home/user/f%d", n, n)}, "", func(string) {}); err != nil || code != 0 {
			b.Fatalf("write a file: %d %v", code, err)
		}
		ref := fmt.Sprintf("%s/bench/exported:%d", host, n)
		b.StartTimer()
		code, body := s.rest("POST", "/sandboxes/"+sb.SandboxID+"/export", fmt.Sprintf(`{"ref":%q}`, ref))
		b.StopTimer()
		if code != 200 {
			b.Fatalf("export: %d %s", code, body)
		}
		return ref
	}
	b.StopTimer()
	first := export(b) // the root filesystem's layer, once
	b.Run("export-small-change", func(b *testing.B) {
		b.StopTimer()
		for i := 0; i < b.N; i++ {
			export(b)
		}
	})
	b.Run("cold-start-from-export", func(b *testing.B) {
		for i := 0; i < b.N; i++ {
			b.StopTimer()
			ref := first
			if i > 0 || n > 1 {
				ref = export(b)
			}
			name := fmt.Sprintf("from-export-%d", n)
			b.StartTimer()
			buildOnce(b, s, name, fmt.Sprintf(`{"fromImage":%q}`, ref))
			code, body := s.rest("POST", "/v2/sandboxes", fmt.Sprintf(`{"templateID":%q}`, name))
			b.StopTimer()
			if code != 201 {
				b.Fatalf("create from %s: %d %s", name, code, body)
			}
			var c struct{ SandboxID string }
			json.Unmarshal(body, &c)
			s.rest("DELETE", "/sandboxes/"+c.SandboxID, "")
		}
	})
}

package sdk

import (
	"encoding/json"
	"fmt"
	"strings"
	"testing"
	"time"

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

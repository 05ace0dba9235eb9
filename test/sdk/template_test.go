package sdk

import (
	"bufio"
	"encoding/json"
	"fmt"
	"net"
	"strings"
	"testing"
	"time"

	"github.com/spore-run/spore/internal/testenv"
)

// TestTemplateBuildThroughTheSDK: E2B's template build API through the
// stock SDK (template.mjs), against an image the test pushes to a
// registry it serves: steps, cache, tags, failures, a Dockerfile.
func TestTemplateBuildThroughTheSDK(t *testing.T) {
	reg := testenv.NewRegistry(t, "", "")
	ref := reg.Push(t, "apps/busybox:1", testenv.BusyboxImage(t))
	s := newServer(t, "--insecure-registry", registryHost(t, ref))
	out := s.node("template.mjs", "IMAGE="+ref)
	t.Log(out)
	if !strings.Contains(out, "9 passed, 0 failed") {
		t.Fatal("template flow did not pass")
	}
	// Deleting a template takes its builds and tags along.
	if code, b := s.rest("DELETE", "/templates/sdk-app", ""); code != 204 {
		t.Fatalf("delete: %d %s", code, b)
	}
	for _, p := range []string{"/templates/aliases/sdk-app", "/templates/sdk-app/tags", "/templates/sdk-app"} {
		if code, b := s.rest("GET", p, ""); code != 404 {
			t.Errorf("GET %s after the delete: %d %s", p, code, b)
		}
	}
	if code, b := s.rest("POST", "/v2/sandboxes", `{"templateID":"sdk-app:v2"}`); code != 404 {
		t.Errorf("create from a deleted template's tag: %d %s", code, b)
	}
}

func registryHost(t testing.TB, ref string) string {
	host, _, _ := strings.Cut(ref, "/")
	if _, _, err := net.SplitHostPort(host); err != nil {
		t.Fatalf("registry ref %q: %v", ref, err)
	}
	return host
}

// TestTemplateBuildRefusesBadInput: the build routes answer bad input with
// a 4xx and change nothing.
func TestTemplateBuildRefusesBadInput(t *testing.T) {
	s := newServer(t)
	code, b := s.rest("POST", "/v3/templates", `{"name":"bad-input"}`)
	if code != 202 {
		t.Fatalf("request a build: %d %s", code, b)
	}
	var req struct{ TemplateID, BuildID string }
	json.Unmarshal(b, &req)
	start := "/v2/templates/" + req.TemplateID + "/builds/" + req.BuildID
	hash := strings.Repeat("ab", 32)
	for _, c := range []struct {
		method, path, body string
		want               int
	}{
		{"POST", "/v3/templates", `{"name":"../etc"}`, 400},
		{"POST", "/v3/templates", `{"name":"ok:bad tag"}`, 400},
		{"POST", "/v3/templates", `{}`, 400},
		{"POST", start, `{}`, 400},                                      // no base
		{"POST", start, `{"fromTemplate":"base","fromImage":"x"}`, 400}, // two bases
		{"POST", start, `{"fromTemplate":"base","steps":[{"type":"ADD"}]}`, 400},
		{"POST", start, `{"fromTemplate":"base","steps":[{"type":"COPY","args":["../../etc/passwd","/x"],"filesHash":"` + hash + `"}]}`, 400},
		{"POST", start, `{"fromTemplate":"base","steps":[{"type":"COPY","args":["/etc/passwd","/x"],"filesHash":"` + hash + `"}]}`, 400},
		{"POST", start, `{"fromTemplate":"base","fromImageRegistry":{"type":"aws"}}`, 400},
		{"POST", start, `{"fromTemplate":"base","unknownField":1}`, 400},
		{"POST", "/v2/templates/other/builds/" + req.BuildID, `{"fromTemplate":"base"}`, 404},
		{"POST", "/v2/templates/bad-input/builds/no-such-build", `{"fromTemplate":"base"}`, 404},
		{"GET", "/templates/bad-input/files/not-a-hash", ``, 400},
		{"GET", "/templates/bad-input/builds/no-such-build/status", ``, 404},
		{"GET", "/templates/bad-input/builds/" + req.BuildID + "/status?logsOffset=-1", ``, 400},
		{"POST", "/templates/tags", `{"target":"bad-input:v9","tags":["x"]}`, 404},
		{"POST", "/templates/tags", `{"target":"bad-input","tags":["no spaces"]}`, 400},
		{"DELETE", "/templates/tags", `{"name":"bad-input","tags":["nope"]}`, 404},
		{"GET", "/templates/no-such-template", ``, 404},
		{"GET", "/templates/no-such-template/tags", ``, 404},
	} {
		code, b := s.rest(c.method, c.path, c.body)
		if code != c.want {
			t.Errorf("%s %s %s: %d %s, want %d", c.method, c.path, c.body, code, b, c.want)
			continue
		}
		var e struct {
			Code    int    `json:"code"`
			Message string `json:"message"`
		}
		if err := json.Unmarshal(b, &e); err != nil || e.Code != c.want || e.Message == "" {
			t.Errorf("%s %s: body %s is not a {code,message} error", c.method, c.path, b)
		}
	}
	// Nothing changed: the build still waits and starts once.
	code, b = s.rest("GET", "/templates/bad-input/builds/"+req.BuildID+"/status", "")
	if code != 200 || !strings.Contains(string(b), `"status":"waiting"`) {
		t.Fatalf("after refused starts: %d %s", code, b)
	}
	if code, b := s.rest("POST", start, `{"fromTemplate":"base","steps":[{"type":"RUN","args":["echo hi > /tmp/x"]}]}`); code != 202 {
		t.Fatalf("start: %d %s", code, b)
	}
	if code, b := s.rest("POST", start, `{"fromTemplate":"base"}`); code != 409 {
		t.Fatalf("second start: %d %s, want 409", code, b)
	}
	deadline := time.Now().Add(3 * time.Minute)
	for {
		_, b = s.rest("GET", "/templates/bad-input/builds/"+req.BuildID+"/status", "")
		if strings.Contains(string(b), `"status":"ready"`) {
			break
		}
		if strings.Contains(string(b), `"status":"error"`) || time.Now().After(deadline) {
			t.Fatalf("build: %s", b)
		}
		time.Sleep(200 * time.Millisecond)
	}
	// A huge upload is refused from its Content-Length, before any byte.
	if got := rawStatus(t, s.addr, "PUT /templates/bad-input/files/"+hash+" HTTP/1.1\r\nHost: x\r\nX-API-Key: "+apiKey+
		"\r\nContent-Length: 4294967296\r\n\r\n"); got != 413 {
		t.Fatalf("a 4 GiB upload: HTTP %d, want 413", got)
	}
	if code, b := s.rest("GET", "/templates/bad-input/files/"+hash, ""); code != 201 || !strings.Contains(string(b), `"present":false`) {
		t.Fatalf("after the refused upload: %d %s", code, b)
	}
}

// rawStatus sends a raw request and returns the status code of the answer.
func rawStatus(t *testing.T, addr, req string) int {
	t.Helper()
	c, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	c.SetDeadline(time.Now().Add(30 * time.Second))
	if _, err := c.Write([]byte(req)); err != nil {
		t.Fatal(err)
	}
	line, err := bufio.NewReader(c).ReadString('\n')
	if err != nil {
		t.Fatal(err)
	}
	var code int
	fmt.Sscanf(line, "HTTP/1.1 %d", &code)
	return code
}

package fleet

import (
	"archive/tar"
	"bytes"
	"compress/gzip"
	"encoding/json"
	"fmt"
	"net/http"
	"strings"
	"testing"
	"time"
)

// TestTemplateBuildAcrossReplicas: E2B's template build API in a fleet of
// two nodes and two API replicas: the build is requested and its files
// uploaded through replica 1 (into the fleet's S3 blob store), started
// through replica 2 (which runs it, reading the upload from S3), its
// status and logs read through replica 1; then sandboxes of the template
// on each node have the copied file and the command's output; a rebuild
// started through replica 1 is all cache hits (the cache entries another
// replica made).
func TestTemplateBuildAcrossReplicas(t *testing.T) {
	h := upFleet(t, 2, "tb", "--replicas=2")
	api1, api2 := h.st.APIURLs[0], h.st.APIURLs[1]
	// Each replica learns the nodes that registered with the other at its
	// next registry refresh (every 2 s).
	for _, api := range []string{api1, api2} {
		for _, n := range h.st.Nodes {
			if !waitFor(time.Minute, func() bool {
				code, b := h.rest(api, "POST", "/sandboxes", fmt.Sprintf(`{"templateID":"base","sporeNodeID":%q}`, n.ID))
				var sb sandbox
				json.Unmarshal(b, &sb)
				if code == 201 {
					h.rest(api, "DELETE", "/sandboxes/"+sb.SandboxID, "")
				}
				return code == 201
			}) {
				t.Fatalf("replica %s never reached node %s", api, n.ID)
			}
		}
	}
	hash := strings.Repeat("5a", 32)
	spec := fmt.Sprintf(`{"fromTemplate":"base","steps":[{"type":"COPY","args":["app","/srv/app/","user",""],"filesHash":%q},`+
		`{"type":"RUN","args":["cat /srv/app/hello.txt > /srv/app/copied.txt; id -un >> /srv/app/copied.txt"]}],"startCmd":"sleep 100000"}`, hash)

	build := func(reqVia, startVia string) (string, string) {
		code, b := h.rest(reqVia, "POST", "/v3/templates", `{"name":"fleet-tpl"}`)
		if code != 202 {
			t.Fatalf("request via %s: %d %s", reqVia, code, b)
		}
		var r struct{ TemplateID, BuildID string }
		json.Unmarshal(b, &r)
		code, b = h.rest(reqVia, "GET", "/templates/fleet-tpl/files/"+hash, "")
		var up struct {
			Present bool
			URL     string
			Headers map[string]string
		}
		if code != 201 || json.Unmarshal(b, &up) != nil {
			t.Fatalf("upload link: %d %s", code, b)
		}
		if !up.Present {
			req, _ := http.NewRequest("PUT", up.URL, bytes.NewReader(appArchive(t)))
			for k, v := range up.Headers {
				req.Header.Set(k, v)
			}
			resp, err := h.http.Do(req)
			if err != nil || resp.StatusCode != 201 {
				t.Fatalf("upload to %s: %v %v", up.URL, err, resp)
			}
			resp.Body.Close()
		}
		if code, b := h.rest(startVia, "POST", "/v2/templates/fleet-tpl/builds/"+r.BuildID, spec); code != 202 {
			t.Fatalf("start via %s: %d %s", startVia, code, b)
		}
		var status string
		deadline := time.Now().Add(5 * time.Minute)
		for {
			_, b = h.rest(reqVia, "GET", "/templates/fleet-tpl/builds/"+r.BuildID+"/status", "")
			if strings.Contains(string(b), `"status":"ready"`) {
				status = string(b)
				break
			}
			if strings.Contains(string(b), `"status":"error"`) || time.Now().After(deadline) {
				t.Fatalf("build: %s", b)
			}
			time.Sleep(100 * time.Millisecond)
		}
		// Every log entry, read through the replica that did not run it.
		_, b = h.rest(reqVia, "GET", "/templates/fleet-tpl/builds/"+r.BuildID+"/status?logsOffset=0", "")
		return status, string(b)
	}

	_, logs := build(api1, api2)
	if !strings.Contains(logs, "[2/2] RUN") {
		t.Fatalf("the first build's log: %s", logs)
	}
	for k := 1; k <= 2; k++ {
		code, b := h.rest(api1, "POST", "/sandboxes", fmt.Sprintf(`{"templateID":"fleet-tpl","sporeNodeID":%q}`, h.st.Nodes[k-1].ID))
		if code != 201 {
			t.Fatalf("create on node %d: %d %s", k, code, b)
		}
		var sb sandbox
		json.Unmarshal(b, &sb)
		if got := h.run(api2, sb.SandboxID, "cat /srv/app/copied.txt; stat -c %U /srv/app/hello.txt; pgrep -c -f 'slee[p] 100000'"); got != "hello fleet\nuser\nuser\n1" {
			t.Errorf("sandbox on node %d: %q", k, got)
		}
		h.rest(api1, "DELETE", "/sandboxes/"+sb.SandboxID, "")
	}
	_, logs = build(api2, api1)
	if strings.Count(logs, "CACHED [") != 2 || !strings.Contains(logs, "CACHED start and ready") {
		t.Fatalf("the rebuild through the other replica was not all cache hits: %s", logs)
	}
}

// appArchive is the gzipped tar of the build context's app/ directory.
func appArchive(t *testing.T) []byte {
	var buf bytes.Buffer
	gz := gzip.NewWriter(&buf)
	tw := tar.NewWriter(gz)
	tw.WriteHeader(&tar.Header{Name: "app/", Typeflag: tar.TypeDir, Mode: 0o755})
	body := "hello fleet\n"
	tw.WriteHeader(&tar.Header{Name: "app/hello.txt", Typeflag: tar.TypeReg, Mode: 0o644, Size: int64(len(body))})
	tw.Write([]byte(body))
	if err := tw.Close(); err != nil {
		t.Fatal(err)
	}
	gz.Close()
	return buf.Bytes()
}

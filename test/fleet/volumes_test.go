package fleet

import (
	"crypto/tls"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// TestVolumesOnAFleet: a shared volume on a two-node fleet (node agents
// over mutual TLS, PostgreSQL). Its content lives on the first node that
// mounts it (here the operator's choice): later sandboxes that mount it
// go there whatever the spread says, read-write or read-only, and see
// each other's files; a create that names the other node is a 409; a
// mounted volume is not deleted; once its sandboxes are gone it is, and
// its image leaves the node.
func TestVolumesOnAFleet(t *testing.T) {
	h := upFleet(t, 2, "vo")
	api := h.st.APIURLs[0]
	home, other := h.st.Nodes[1], h.st.Nodes[0]
	code, b := h.rest(api, "POST", "/volumes", `{"name":"fleet-vol","sizeMB":64}`)
	var vol struct {
		VolumeID string `json:"volumeID"`
	}
	if json.Unmarshal(b, &vol); code != 201 || vol.VolumeID == "" {
		t.Fatalf("create the volume: %d %s", code, b)
	}
	create := func(body string) sandbox {
		t.Helper()
		code, b := h.rest(api, "POST", "/v2/sandboxes", body)
		var sb sandbox
		if json.Unmarshal(b, &sb); code != 201 {
			t.Fatalf("create %s: %d %s", body, code, b)
		}
		return sb
	}
	a := create(fmt.Sprintf(`{"templateID":"base","sporeNodeID":%q,"volumeMounts":[{"name":"fleet-vol","path":"/data"}]}`, home.ID))
	h.run(api, a.SandboxID, "echo on-the-home-node > /data/f")
	var more []sandbox
	for i := range 3 {
		sb := create(fmt.Sprintf(`{"templateID":"base","volumeMounts":[{"name":"fleet-vol","path":"/v%d","readOnly":%v}]}`, i, i%2 == 0))
		if sb.ClientID != home.ID {
			t.Fatalf("a sandbox with the volume went to %s, not %s", sb.ClientID, home.ID)
		}
		if got := h.run(api, sb.SandboxID, fmt.Sprintf("cat /v%d/f", i)); strings.TrimSpace(got) != "on-the-home-node" {
			t.Fatalf("sandbox %d sees %q", i, got)
		}
		more = append(more, sb)
	}
	// The content API through the replica, served by the home node: the
	// volume's token only; the node's content route answers only a
	// replica of the fleet.
	var full struct {
		Token string `json:"token"`
	}
	_, b = h.rest(api, "GET", "/volumes/fleet-vol", "")
	json.Unmarshal(b, &full)
	files := api + "/volumecontent/" + vol.VolumeID + "/file?path=/from-the-api.txt"
	if code, out := h.raw("PUT", files, "Bearer "+full.Token, "written through the replica"); code != 200 {
		t.Fatalf("PUT through the replica: %d %s", code, out)
	}
	if got := h.run(api, a.SandboxID, "cat /data/from-the-api.txt"); strings.TrimSpace(got) != "written through the replica" {
		t.Fatalf("the sandbox sees %q", got)
	}
	if code, out := h.raw("GET", api+"/volumecontent/"+vol.VolumeID+"/file?path=/f", "Bearer "+full.Token, ""); code != 200 || out != "on-the-home-node\n" {
		t.Fatalf("GET through the replica: %d %q", code, out)
	}
	if code, out := h.raw("GET", files, "Bearer spv_wrong", ""); code != 401 {
		t.Fatalf("a wrong token: %d %s", code, out)
	}
	if code, out := h.raw("GET", "https://"+home.Listen+"/volumecontent/"+vol.VolumeID+"/file?path=/f", "Bearer "+full.Token, ""); code == 200 || strings.Contains(out, "on-the-home-node") {
		t.Fatalf("the node's content route answered a stranger: %d %s", code, out)
	}
	code, b = h.rest(api, "POST", "/v2/sandboxes", fmt.Sprintf(`{"templateID":"base","sporeNodeID":%q,"volumeMounts":[{"name":"fleet-vol","path":"/data"}]}`, other.ID))
	if code != 409 {
		t.Fatalf("a create with the volume on the other node: %d %s", code, b)
	}
	if code, b := h.rest(api, "DELETE", "/volumes/fleet-vol", ""); code != 409 {
		t.Fatalf("delete of a mounted volume: %d %s", code, b)
	}
	for _, sb := range append(more, a) {
		if code, b := h.rest(api, "DELETE", "/sandboxes/"+sb.SandboxID, ""); code != 204 {
			t.Fatalf("kill %s: %d %s", sb.SandboxID, code, b)
		}
	}
	if code, b := h.rest(api, "DELETE", "/volumes/fleet-vol", ""); code != 204 {
		t.Fatalf("delete: %d %s", code, b)
	}
	img := filepath.Join(home.DataDir, "volumes", "pool", vol.VolumeID+".img")
	if !waitFor(2*time.Minute, func() bool { _, err := os.Stat(img); return os.IsNotExist(err) }) {
		t.Fatalf("the volume's image is still on its node: %s", img)
	}

	// An exclusive volume's content at a snapshot's instant travels with
	// the snapshot through the fleet's blob store: once durable, a sandbox
	// made from it on the other node has it, in a volume of its own.
	if code, b := h.rest(api, "POST", "/volumes", `{"name":"fleet-ex","mode":"exclusive","sizeMB":256}`); code != 201 {
		t.Fatalf("create the exclusive volume: %d %s", code, b)
	}
	ex := create(fmt.Sprintf(`{"templateID":"base","sporeNodeID":%q,"volumeMounts":[{"name":"fleet-ex","path":"/work"}]}`, home.ID))
	h.run(api, ex.SandboxID, "echo at-the-snapshot > /work/f")
	code, b = h.rest(api, "POST", "/sandboxes/"+ex.SandboxID+"/snapshots", `{}`)
	var sn snapshotView
	if json.Unmarshal(b, &sn); code != 201 {
		t.Fatalf("snapshot: %d %s", code, b)
	}
	h.run(api, ex.SandboxID, "echo changed-after > /work/f")
	if !waitFor(2*time.Minute, func() bool { _, v := h.snapshotInfo(api, sn.SnapshotID); return v.Storage == "durable" }) {
		_, v := h.snapshotInfo(api, sn.SnapshotID)
		t.Fatalf("snapshot not durable: %+v", v)
	}
	moved := create(fmt.Sprintf(`{"templateID":%q,"sporeNodeID":%q}`, sn.SnapshotID, other.ID))
	if moved.ClientID != other.ID {
		t.Fatalf("the create from the snapshot went to %s, not %s", moved.ClientID, other.ID)
	}
	if got := strings.TrimSpace(h.run(api, moved.SandboxID, "cat /work/f")); got != "at-the-snapshot" {
		t.Fatalf("the sandbox made on the other node sees %q", got)
	}

	// The sandbox holding it moves with it: its node drained, it is
	// hibernated with the volume's content; a connect resumes it on the
	// other node, which makes the volume from the hibernation's copy; the
	// volume's row names that node, and the home node's old image goes
	// once it has dropped its copy of the sandbox (its reconcile).
	if code, b := h.rest(api, "POST", "/nodes/"+home.ID+"/drain", ""); code != 200 {
		t.Fatalf("drain the home node: %d %s", code, b)
	}
	if !waitFor(2*time.Minute, func() bool {
		_, b := h.rest(api, "GET", "/sandboxes/"+ex.SandboxID, "")
		return strings.Contains(string(b), `"sporeHibernation":"durable"`)
	}) {
		_, b := h.rest(api, "GET", "/sandboxes/"+ex.SandboxID, "")
		t.Fatalf("the drained sandbox's hibernation never durable: %s", b)
	}
	code, b = h.rest(api, "POST", "/sandboxes/"+ex.SandboxID+"/connect", `{"timeout":600}`)
	var back sandbox
	if json.Unmarshal(b, &back); code != 201 || back.ClientID != other.ID {
		t.Fatalf("connect to the drained sandbox: %d %s (want it on %s)", code, b, other.ID)
	}
	if got := strings.TrimSpace(h.run(api, ex.SandboxID, "cat /work/f; echo on-the-other-node >> /work/f")); got != "changed-after" {
		t.Fatalf("the sandbox moved with its volume sees %q", got)
	}
	_, b = h.rest(api, "GET", "/volumes/fleet-ex", "")
	if !strings.Contains(string(b), `"sporeNodeID":"`+other.ID+`"`) {
		t.Fatalf("the moved volume's info: %s", b)
	}
	oldImg := filepath.Join(home.DataDir, "volumes", "pool", volumeID(t, h, api, "fleet-ex")+".img")
	if !waitFor(2*time.Minute, func() bool { _, err := os.Stat(oldImg); return os.IsNotExist(err) }) {
		t.Fatalf("the moved volume's old image is still on the home node: %s", oldImg)
	}
	if code, b := h.rest(api, "POST", "/nodes/"+home.ID+"/undrain", ""); code != 204 {
		t.Fatalf("undrain the home node: %d %s", code, b)
	}
	for _, id := range []string{ex.SandboxID, moved.SandboxID} {
		if code, b := h.rest(api, "DELETE", "/sandboxes/"+id, ""); code != 204 {
			t.Fatalf("kill %s: %d %s", id, code, b)
		}
	}
	for _, name := range []string{"fleet-ex", "fleet-ex-" + moved.SandboxID} {
		if code, b := h.rest(api, "DELETE", "/volumes/"+name, ""); code != 204 {
			t.Fatalf("delete volume %s: %d %s", name, code, b)
		}
	}
	if code, b := h.rest(api, "DELETE", "/templates/"+sn.SnapshotID, ""); code != 204 {
		t.Fatalf("delete the snapshot: %d %s", code, b)
	}
}

// raw sends a request with only an Authorization header (no API key): a
// status and the body; a connection refused or a TLS handshake a
// stranger cannot complete is status 0.
func (h *harness) raw(method, url, auth, body string) (int, string) {
	h.t.Helper()
	req, _ := http.NewRequest(method, url, strings.NewReader(body))
	if auth != "" {
		req.Header.Set("Authorization", auth)
	}
	c := &http.Client{Timeout: time.Minute, Transport: &http.Transport{TLSClientConfig: &tls.Config{InsecureSkipVerify: true}}}
	resp, err := c.Do(req)
	if err != nil {
		return 0, err.Error()
	}
	defer resp.Body.Close()
	out, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(out)
}

// volumeID is a volume's ID, by its name.
func volumeID(t *testing.T, h *harness, api, name string) string {
	t.Helper()
	code, b := h.rest(api, "GET", "/volumes/"+name, "")
	var v struct {
		VolumeID string `json:"volumeID"`
	}
	if json.Unmarshal(b, &v); code != 200 || v.VolumeID == "" {
		t.Fatalf("volume %s: %d %s", name, code, b)
	}
	return v.VolumeID
}

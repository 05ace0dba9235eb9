package fleet

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"time"
)

// fleetS3Snapshot snapshots a sandbox on node 1 into the fleet's own S3
// server, checks the snapshot is durable with objects in the server's
// bucket, and starts a sandbox from it on node 2. It returns its name.
func (h *harness) fleetS3Snapshot(api1, api2 string) string {
	t := h.t
	// On node 1 by the operator's hint: the spread may keep creates off a
	// node that holds more (the warm pool), which made an earlier version
	// of this step that retried creates fail once.
	code, b := h.rest(api1, "POST", "/sandboxes", fmt.Sprintf(`{"templateID":"base","timeout":1800,"sporeNodeID":%q}`, h.st.Nodes[0].ID))
	var src sandbox
	if json.Unmarshal(b, &src) != nil || code != 201 || src.ClientID != h.st.Nodes[0].ID {
		t.Fatalf("create on node 1: %d %s", code, b)
	}
	if got := h.run(api1, src.SandboxID, "echo through-fleet-s3 > /home/user/s3.txt && cat /home/user/s3.txt"); got != "through-fleet-s3" {
		t.Fatalf("write in the source: %q", got)
	}
	code, b = h.rest(api1, "POST", "/sandboxes/"+src.SandboxID+"/snapshots", `{"name":"fleet-s3"}`)
	if code != 201 {
		t.Fatalf("snapshot: %d %s", code, b)
	}
	var sn struct {
		SnapshotID string `json:"snapshotID"`
	}
	json.Unmarshal(b, &sn)
	var storage string
	if !waitFor(2*time.Minute, func() bool {
		code, b := h.rest(api2, "GET", "/snapshots/"+sn.SnapshotID, "")
		var v struct {
			Storage string `json:"storage"`
		}
		json.Unmarshal(b, &v)
		storage = fmt.Sprint(code, " ", v.Storage)
		return v.Storage == "durable"
	}) {
		t.Fatalf("snapshot %s not durable in the fleet's S3: %s", sn.SnapshotID, storage)
	}
	objects := 0
	filepath.Walk(filepath.Join(h.st.S3.Dir, "data", h.st.S3.Bucket), func(_ string, fi os.FileInfo, err error) error {
		if err == nil && !fi.IsDir() {
			objects++
		}
		return nil
	})
	if objects == 0 {
		t.Fatalf("nothing in the fleet's bucket %s", filepath.Join(h.st.S3.Dir, "data", h.st.S3.Bucket))
	}
	t.Logf("snapshot %s durable in the fleet's S3 server (%d objects)", sn.SnapshotID, objects)
	h.rest(api1, "DELETE", "/sandboxes/"+src.SandboxID, "")
	h.fromSnapshotOn(api2, "fleet-s3", 2)
	return "fleet-s3"
}

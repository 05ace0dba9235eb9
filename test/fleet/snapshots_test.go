package fleet

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/spore-run/spore/internal/chunk"
	"github.com/spore-run/spore/internal/snapsync"
	"github.com/spore-run/spore/internal/testenv"
)

// snapshotView is GET /snapshots/{id}.
type snapshotView struct {
	SnapshotID  string `json:"snapshotID"`
	Storage     string `json:"storage"`
	StoredBytes int64  `json:"storedBytes"`
	SizeBytes   int64  `json:"sizeBytes"`
	NodeID      string `json:"nodeID"`
}

func (h *harness) snapshotInfo(base, id string) (int, snapshotView) {
	code, b := h.rest(base, "GET", "/snapshots/"+id, "")
	var v snapshotView
	json.Unmarshal(b, &v)
	return code, v
}

// nodeIndex is the 1-based index of the node with this ID.
func (h *harness) nodeIndex(id string) int {
	for i, n := range h.st.Nodes {
		if n.ID == id {
			return i + 1
		}
	}
	h.t.Fatalf("no node %s", id)
	return 0
}

// fetchLog returns the last "snapshot fetched" line of node k's log for
// snapshot id, and its from_peer and from_store counts.
func (h *harness) fetchLog(k int, id string) (line string, peer, store int) {
	b, _ := os.ReadFile(filepath.Join(h.dir, "logs", fmt.Sprintf("node-%d.log", k)))
	for _, l := range strings.Split(string(b), "\n") {
		if strings.Contains(l, `msg="snapshot fetched"`) && strings.Contains(l, "snapshot_id="+id) {
			line = l
		}
	}
	num := func(key string) int {
		m := regexp.MustCompile(key + `=(\d+)`).FindStringSubmatch(line)
		if m == nil {
			return -1
		}
		n, _ := strconv.Atoi(m[1])
		return n
	}
	return line, num("from_peer"), num("from_store")
}

// largestChunkOf is the largest file of a node's chunk cache (dir) that
// holds a chunk the manifest at manifestPath (a file of the S3 server)
// names.
func largestChunkOf(t *testing.T, dir, manifestPath string) string {
	t.Helper()
	b, err := os.ReadFile(manifestPath)
	if err != nil {
		t.Fatal(err)
	}
	m, err := chunk.DecodeManifest(b)
	if err != nil {
		t.Fatal(err)
	}
	var best string
	var size int64
	for id := range m.ChunkIDs() {
		s := id.String()
		p := filepath.Join(dir, s[:2], s)
		if fi, err := os.Stat(p); err == nil && fi.Size() > size {
			best, size = p, fi.Size()
		}
	}
	if best == "" {
		t.Fatalf("no chunk of the snapshot under %s", dir)
	}
	return best
}

// flipByte flips one byte in the middle of a file and returns the undo.
func flipByte(t *testing.T, path string) func() {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	orig := append([]byte(nil), b...)
	b[len(b)/2] ^= 0x5a
	if err := os.WriteFile(path, b, 0o600); err != nil {
		t.Fatal(err)
	}
	return func() {
		if err := os.WriteFile(path, orig, 0o600); err != nil {
			t.Fatal(err)
		}
	}
}

// bucketChunks returns, for the manifests in a bucket's prefix, the paths
// of the chunk objects they name (by manifest ID), read from versitygw's
// posix directory.
func bucketChunks(t *testing.T, prefixDir string) map[string][]string {
	t.Helper()
	out := map[string][]string{}
	files, _ := filepath.Glob(filepath.Join(prefixDir, "manifests", "*.json"))
	for _, f := range files {
		b, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		m, err := chunk.DecodeManifest(b)
		if err != nil {
			t.Fatalf("manifest %s: %v", f, err)
		}
		for id := range m.ChunkIDs() {
			out[m.ID] = append(out[m.ID], filepath.Join(prefixDir, filepath.FromSlash(id.Key())))
		}
	}
	return out
}

// largestOf returns the biggest of the files.
func largestOf(t *testing.T, files []string) string {
	t.Helper()
	var best string
	var size int64 = -1
	for _, f := range files {
		if fi, err := os.Stat(f); err == nil && fi.Size() > size {
			best, size = f, fi.Size()
		}
	}
	if best == "" {
		t.Fatal("no file")
	}
	return best
}

// startCounter writes mark into the sandbox's /home/user/kept.txt and
// starts a process counting in its memory (written to /tmp/count every
// 50 ms); it returns the count once the counter has run 2 s (its start
// waited for, up to 30 s: python3 starts slowly on a loaded host).
func (h *harness) startCounter(api, id, mark string) int {
	h.t.Helper()
	h.run(api, id, "echo "+mark+" > /home/user/kept.txt; "+
		"nohup python3 -c 'import time,os\nn=0\nwhile True:\n n+=1\n open(\"/tmp/count.tmp\",\"w\").write(str(n))\n os.rename(\"/tmp/count.tmp\",\"/tmp/count\")\n time.sleep(0.05)' >/dev/null 2>&1 & "+
		"for i in $(seq 300); do [ -s /tmp/count ] && break; sleep 0.1; done; sleep 2; echo started")
	before, _ := h.counter(api, id)
	return before
}

// counter reads the sandbox's counter file, then again until it counted
// on (or 30 s passed): how fast it counts depends on the host (a fixed
// second may see no count on a loaded host, in a sandbox whose memory is
// still being fetched); a stopped counter never counts on.
func (h *harness) counter(base, id string) (int, int) {
	h.t.Helper()
	read := func() int {
		out := h.run(base, id, "cat /tmp/count")
		n, err := strconv.Atoi(strings.TrimSpace(out))
		if err != nil {
			h.t.Fatalf("counter of %s: %q", id, out)
		}
		return n
	}
	a := read()
	b := a
	for deadline := time.Now().Add(30 * time.Second); b <= a && time.Now().Before(deadline); {
		time.Sleep(500 * time.Millisecond)
		b = read()
	}
	return a, b
}

// A snapshot is usable on every node of a fleet whose nodes share an S3
// bucket (versitygw, a real S3-compatible server): taken on node 1 it
// becomes durable (GET /snapshots/{id}: storage durable, bytes stored);
// with node 1 drained, a create from it lands on another node, which
// fetches its chunks from node 1 (the peer tier); a rollback on the third
// node fetches it from S3. In each, the file written before the snapshot
// is there and the counting process kept its memory: the count goes on
// from where it was, it does not restart. Then node 1 is killed and its
// data directory wiped: the snapshot is still durable and restorable.
func TestSnapshotsAcrossNodes(t *testing.T) {
	s3 := testenv.S3AllInterfaces(t)
	t.Setenv("AWS_ACCESS_KEY_ID", s3.AccessKey)
	t.Setenv("AWS_SECRET_ACCESS_KEY", s3.SecretKey)
	t.Setenv("AWS_REGION", s3.Region)
	h := upFleet(t, 3, "d", fmt.Sprintf("--blob-store=s3://%s/fleet?endpoint=http://{host}:%d", s3.Bucket, s3.Port))
	api := h.st.APIURLs[0]

	src := h.onNode(api, 1)
	before := h.startCounter(api, src.SandboxID, "kept-across-nodes")
	code, b := h.rest(api, "POST", "/sandboxes/"+src.SandboxID+"/snapshots", `{"name":"across"}`)
	if code != 201 {
		t.Fatalf("snapshot: %d %s", code, b)
	}
	var sn snapshotView
	json.Unmarshal(b, &sn)
	t.Logf("snapshot %s of %s on node 1 (counter was %d just before)", sn.SnapshotID, src.SandboxID, before)
	if !waitFor(2*time.Minute, func() bool { _, v := h.snapshotInfo(api, sn.SnapshotID); return v.Storage == "durable" }) {
		_, v := h.snapshotInfo(api, sn.SnapshotID)
		t.Fatalf("snapshot not durable: %+v", v)
	}
	_, info := h.snapshotInfo(api, sn.SnapshotID)
	if info.StoredBytes <= 0 || info.NodeID != h.st.Nodes[0].ID {
		t.Fatalf("durable snapshot: %+v", info)
	}
	t.Logf("durable: %d bytes, %d stored in S3", info.SizeBytes, info.StoredBytes)
	objects := 0
	filepath.Walk(filepath.Join(s3.Dir, s3.Bucket), func(_ string, fi os.FileInfo, err error) error {
		if err == nil && !fi.IsDir() {
			objects++
		}
		return nil
	})
	if objects == 0 {
		t.Fatal("nothing in the S3 bucket")
	}

	// A byte flipped in a chunk of node 1's cache: the peer serves it
	// corrupt, the fetching node catches it and takes that chunk from S3.
	// (A chunk of this snapshot: the cache also holds the chunks of the
	// root filesystem tree and the runsc build its upload published.)
	flipByte(t, largestChunkOf(t, filepath.Join(h.st.Nodes[0].DataDir, "chunk-cache"), s3.ObjectPath("fleet/"+chunk.ManifestKey(sn.SnapshotID))))

	// Node 1 drained: the create goes elsewhere, and that node fetches.
	if code, b := h.rest(api, "POST", "/nodes/"+h.st.Nodes[0].ID+"/drain", ""); code != 200 {
		t.Fatalf("drain node 1: %d %s", code, b)
	}
	code, b = h.rest(api, "POST", "/sandboxes", `{"templateID":"across","timeout":1800}`)
	if code != 201 {
		t.Fatalf("create from the snapshot: %d %s", code, b)
	}
	var moved sandbox
	json.Unmarshal(b, &moved)
	kb := h.nodeIndex(moved.ClientID)
	if kb == 1 {
		t.Fatal("the create landed on the drained node")
	}
	if got := h.run(api, moved.SandboxID, "cat /home/user/kept.txt"); got != "kept-across-nodes" {
		t.Fatalf("file on node %d: %q", kb, got)
	}
	c1, c2 := h.counter(api, moved.SandboxID)
	if c1 < before || c2 <= c1 {
		t.Fatalf("counter on node %d: %d then %d, was %d before the snapshot: the process did not continue", kb, c1, c2, before)
	}
	line, peer, fromStore := h.fetchLog(kb, sn.SnapshotID)
	if peer <= 0 || fromStore != 1 {
		t.Fatalf("node %d: want the chunks from its peer but the corrupt one from S3: %q", kb, line)
	}
	logs, _ := filepath.Glob(filepath.Join(h.dir, "logs", "node-*.log"))
	reported := false
	for _, l := range logs {
		b, _ := os.ReadFile(l)
		reported = reported || strings.Contains(string(b), "corrupt copy")
	}
	if !reported {
		t.Fatal("no node reported the corrupt copy")
	}
	t.Logf("node %d: counter %d → %d (was %d); %s", kb, c1, c2, before, line)

	// Rollback on the third node to the snapshot taken on node 1: fetched
	// from S3 (a rollback names no peer).
	kc := 5 - kb // the node neither 1 nor kb
	other := h.onNode(api, kc)
	// A byte flipped in S3 first: the only copy the rollback can use is
	// corrupt, so it fails, clearly, and leaves the sandbox as it was.
	bucket := filepath.Join(s3.Dir, s3.Bucket, "fleet")
	undo := flipByte(t, largestOf(t, bucketChunks(t, bucket)[sn.SnapshotID]))
	code, b = h.rest(api, "POST", "/sandboxes/"+other.SandboxID+"/rollback", fmt.Sprintf(`{"snapshotID":%q}`, sn.SnapshotID))
	if code < 500 {
		t.Fatalf("rollback to a snapshot corrupt in S3: %d %s", code, b)
	}
	if lc, _ := os.ReadFile(filepath.Join(h.dir, "logs", fmt.Sprintf("node-%d.log", kc))); !strings.Contains(string(lc), "data loss") {
		t.Fatalf("node %d's log does not name the data loss", kc)
	}
	if got := h.run(api, other.SandboxID, "ls /home/user/kept.txt 2>&1; echo rc=$?"); !strings.Contains(got, "rc=2") {
		t.Fatalf("the sandbox changed after a failed rollback: %q", got)
	}
	undo()
	code, b = h.rest(api, "POST", "/sandboxes/"+other.SandboxID+"/rollback", fmt.Sprintf(`{"snapshotID":%q}`, sn.SnapshotID))
	if code != 200 {
		t.Fatalf("rollback on node %d: %d %s", kc, code, b)
	}
	if got := h.run(api, other.SandboxID, "cat /home/user/kept.txt"); got != "kept-across-nodes" {
		t.Fatalf("file after the rollback on node %d: %q", kc, got)
	}
	c1, c2 = h.counter(api, other.SandboxID)
	if c1 < before || c2 <= c1 {
		t.Fatalf("counter after the rollback on node %d: %d then %d, was %d", kc, c1, c2, before)
	}
	line, _, fromStore = h.fetchLog(kc, sn.SnapshotID)
	if fromStore <= 0 {
		t.Fatalf("node %d did not fetch from S3: %q", kc, line)
	}
	t.Logf("node %d (rollback): counter %d → %d; %s", kc, c1, c2, line)

	// The drain hibernated src on node 1; its image became durable.
	if !waitFor(time.Minute, func() bool {
		_, b := h.rest(api, "GET", "/sandboxes/"+src.SandboxID, "")
		return strings.Contains(string(b), `"sporeHibernation":"durable"`)
	}) {
		_, b := h.rest(api, "GET", "/sandboxes/"+src.SandboxID, "")
		t.Fatalf("src's hibernation never durable: %s", b)
	}

	// Node 1 dies and its disk is lost: nothing of the snapshot is.
	p := h.proc("node-1")
	syscall.Kill(p.PID, syscall.SIGKILL)
	if !waitFor(30*time.Second, func() bool { return h.nodes(api)[h.st.Nodes[0].ID] == "lost" }) {
		t.Fatalf("node 1 not lost: %v", h.nodes(api))
	}
	for _, e := range []string{"snapshots", "chunk-cache"} {
		if err := os.RemoveAll(filepath.Join(h.st.Nodes[0].DataDir, e)); err != nil {
			t.Fatal(err)
		}
	}
	if code, v := h.snapshotInfo(api, sn.SnapshotID); code != 200 || v.Storage != "durable" {
		t.Fatalf("after node 1's loss: %d %+v", code, v)
	}
	code, b = h.rest(api, "POST", "/sandboxes", fmt.Sprintf(`{"templateID":%q,"timeout":1800}`, sn.SnapshotID))
	if code != 201 {
		t.Fatalf("create after node 1's loss: %d %s", code, b)
	}
	var again sandbox
	json.Unmarshal(b, &again)
	if got := h.run(api, again.SandboxID, "cat /home/user/kept.txt"); got != "kept-across-nodes" {
		t.Fatalf("file after node 1's loss: %q", got)
	}

	// src, hibernated on the lost node, resumes on another one (connect
	// through the stock SDK) with its memory: the count goes on.
	c1, c2 = h.counter(api, src.SandboxID)
	code, moved2 := h.get(api, src.SandboxID)
	if code != 200 || moved2.SporeState != "running" || moved2.ClientID == h.st.Nodes[0].ID {
		t.Fatalf("src after connect: %d %+v", code, moved2)
	}
	if c1 < before || c2 <= c1 {
		t.Fatalf("src's counter on node %d: %d then %d, was %d", h.nodeIndex(moved2.ClientID), c1, c2, before)
	}
	t.Logf("src resumed on node %d after node 1's loss: counter %d → %d (was %d)", h.nodeIndex(moved2.ClientID), c1, c2, before)

	// Delete the snapshot: only the fleet's root filesystem still names
	// chunks (the consumed hibernation was dropped), and GC frees every
	// other chunk of the bucket.
	if code, b := h.rest(api, "DELETE", "/templates/"+sn.SnapshotID, ""); code != 204 {
		t.Fatalf("delete the snapshot: %d %s", code, b)
	}
	chunks := func() int {
		n := 0
		filepath.Walk(filepath.Join(s3.Dir, s3.Bucket, "fleet", "chunks"), func(_ string, fi os.FileInfo, err error) error {
			if err == nil && fi.Mode().IsRegular() {
				n++
			}
			return nil
		})
		return n
	}
	// Left: the fleet's shared root filesystem, and the root filesystem
	// tree and the runsc build the snapshots were made with (held
	// manifests "tree-" and "runtime-": docs/engine.md "Versions kept
	// across upgrades"); nothing of the snapshot's own.
	deps := func() map[string]bool {
		named := map[string]bool{}
		for id, files := range bucketChunks(t, bucket) {
			if !strings.HasPrefix(id, "rootfs-") && !strings.HasPrefix(id, snapsync.DepTree+"-") && !strings.HasPrefix(id, snapsync.DepRuntime+"-") {
				t.Fatalf("manifest %s left in S3 after the delete", id)
			}
			for _, f := range files {
				named[f] = true
			}
		}
		return named
	}
	deps()
	beforeGC := chunks()
	time.Sleep(1100 * time.Millisecond)
	code, b = h.rest(api, "POST", "/blobs/gc", `{"graceSeconds":1}`)
	if code != 200 {
		t.Fatalf("gc: %d %s", code, b)
	}
	var rep struct {
		DeletedChunks int `json:"deletedChunks"`
	}
	json.Unmarshal(b, &rep)
	// What GC kept is exactly what the manifests left name: the snapshot's
	// own chunks are gone, and so is a build no snapshot uses any more.
	named := deps()
	if after := chunks(); after != len(named) || rep.DeletedChunks != beforeGC-after || rep.DeletedChunks == 0 {
		t.Fatalf("gc %s: %d chunks in the bucket before, %d after, the manifests left name %d", b, beforeGC, after, len(named))
	}
	for f := range named {
		if _, err := os.Stat(f); err != nil {
			t.Fatalf("gc deleted a chunk a manifest left names: %v", err)
		}
	}
	t.Logf("gc freed %d of the bucket's %d chunks, kept the %d the manifests left (root filesystem, runsc build) name: %s",
		rep.DeletedChunks, beforeGC, len(named), b)
}

// A fork bigger than its parent's node spreads over the fleet: nodes that
// promise only a quarter of their memory (--memory-overcommit=0.25) hold a
// few default sandboxes each, so of 10 children some go to the parent's
// node and the rest to the two others, restored from a durable snapshot of
// the parent (S3, with the parent's node as a peer). Every child has the
// parent's file and its counting process, whose count goes on from the
// fork; the fork's snapshot is gone afterwards.
func TestForkAcrossNodes(t *testing.T) {
	s3 := testenv.S3AllInterfaces(t)
	t.Setenv("AWS_ACCESS_KEY_ID", s3.AccessKey)
	t.Setenv("AWS_SECRET_ACCESS_KEY", s3.SecretKey)
	t.Setenv("AWS_REGION", s3.Region)
	h := upFleet(t, 3, "g", fmt.Sprintf("--blob-store=s3://%s?endpoint=http://{host}:%d", s3.Bucket, s3.Port),
		"--node-arg=--memory-overcommit=0.25")
	api := h.st.APIURLs[0]
	parent := h.onNode(api, 1)
	before := h.startCounter(api, parent.SandboxID, "from-the-parent")
	t0 := time.Now()
	kids, code, body := h.fork(api, parent.SandboxID, 10)
	if code != 201 || len(kids) != 10 {
		t.Fatalf("fork of 10: %d, %d made: %s", code, len(kids), body)
	}
	t.Logf("fork of 10 in %v", time.Since(t0).Round(time.Millisecond))
	per := map[int]int{}
	for _, id := range kids {
		_, sb := h.get(api, id)
		per[h.nodeIndex(sb.ClientID)]++
	}
	t.Logf("children per node: %v", per)
	if len(per) != 3 || per[1] == 0 {
		t.Fatalf("children per node %v: want some on the parent's node and the rest over the two others", per)
	}
	for _, id := range kids {
		if got := h.run(api, id, "cat /home/user/kept.txt"); got != "from-the-parent" {
			t.Fatalf("child %s: file %q", id, got)
		}
		v := strings.TrimSpace(h.run(api, id, "cat /tmp/count"))
		if n, err := strconv.Atoi(v); err != nil || n < before {
			t.Fatalf("child %s: counter %q, was %d before the fork", id, v, before)
		}
	}
	c1, c2 := h.counter(api, kids[len(kids)-1])
	if c2 <= c1 {
		t.Fatalf("a child's counter does not go on: %d then %d", c1, c2)
	}
	if code, b := h.rest(api, "GET", "/snapshots", ""); code != 200 || string(b) != "[]\n" {
		t.Fatalf("snapshots after the fork: %d %s", code, b)
	}
}

// With S3 down, a snapshot cannot become durable, but another node can
// already restore it: the node that took it serves the chunk manifest
// (indexed from its disk into its cache) and the chunks. Once S3 is back
// the upload completes.
func TestPeerFetchWhileS3IsDown(t *testing.T) {
	s3 := testenv.S3AllInterfaces(t)
	t.Setenv("AWS_ACCESS_KEY_ID", s3.AccessKey)
	t.Setenv("AWS_SECRET_ACCESS_KEY", s3.SecretKey)
	t.Setenv("AWS_REGION", s3.Region)
	h := upFleet(t, 2, "p", fmt.Sprintf("--blob-store=s3://%s?endpoint=http://{host}:%d", s3.Bucket, s3.Port))
	api := h.st.APIURLs[0]
	n1, n2 := h.st.Nodes[0].ID, h.st.Nodes[1].ID
	code, b := h.rest(api, "POST", "/sandboxes", fmt.Sprintf(`{"templateID":"base","timeout":900,"sporeNodeID":%q}`, n1))
	if code != 201 {
		t.Fatalf("create: %d %s", code, b)
	}
	var src sandbox
	json.Unmarshal(b, &src)
	before := h.startCounter(api, src.SandboxID, "peer-only")

	s3.Stop()
	code, b = h.rest(api, "POST", "/sandboxes/"+src.SandboxID+"/snapshots", `{}`)
	if code != 201 {
		t.Fatalf("snapshot with S3 down: %d %s", code, b)
	}
	var sn snapshotView
	json.Unmarshal(b, &sn)
	if _, v := h.snapshotInfo(api, sn.SnapshotID); v.Storage == "durable" {
		t.Fatalf("durable with S3 down: %+v", v)
	}
	code, b = h.rest(api, "POST", "/sandboxes", fmt.Sprintf(`{"templateID":%q,"timeout":900,"sporeNodeID":%q}`, sn.SnapshotID, n2))
	if code != 201 {
		t.Fatalf("create on node 2 with S3 down: %d %s", code, b)
	}
	var moved sandbox
	json.Unmarshal(b, &moved)
	if got := h.run(api, moved.SandboxID, "cat /home/user/kept.txt"); got != "peer-only" {
		t.Fatalf("file on node 2: %q", got)
	}
	c1, c2 := h.counter(api, moved.SandboxID)
	if c1 < before || c2 <= c1 {
		t.Fatalf("counter on node 2: %d then %d, was %d", c1, c2, before)
	}
	line, peer, fromStore := h.fetchLog(2, sn.SnapshotID)
	if peer <= 0 || fromStore != 0 {
		t.Fatalf("node 2 did not fetch from its peer alone: %q", line)
	}
	if _, v := h.snapshotInfo(api, sn.SnapshotID); v.Storage == "durable" {
		t.Fatalf("durable with S3 still down: %+v", v)
	}
	t.Logf("with S3 down: %s", line)

	s3.Restart(t)
	if !waitFor(3*time.Minute, func() bool { _, v := h.snapshotInfo(api, sn.SnapshotID); return v.Storage == "durable" }) {
		_, v := h.snapshotInfo(api, sn.SnapshotID)
		t.Fatalf("not durable after S3 came back: %+v", v)
	}
}

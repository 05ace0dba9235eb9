package fleet

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	s3store "github.com/spore-run/spore/internal/blob/s3"
	"github.com/spore-run/spore/internal/testenv"
)

// BenchmarkSnapshotTiers measures snapshots across a fleet of 3 nodes
// sharing a versitygw bucket (a measurement: nothing is asserted but that
// the operations work):
//
//   - a create from a small sandbox's snapshot on the node that took it,
//     on another node (chunks from that node, a peer), and on a third node
//     once the first is gone (chunks from S3), SPORE_BENCH_SNAPSHOTS
//     snapshots (default 5) each;
//   - upload and download throughput of a 256 MiB random-memory snapshot
//     beside a plain PUT and GET of the same number of bytes;
//   - the bytes stored by 10 successive snapshots of an agent editing files.
//
// Run: go test -run '^$' -bench SnapshotTiers -benchtime 1x -v ./test/fleet/
func BenchmarkSnapshotTiers(b *testing.B) {
	k := 5
	if v, err := strconv.Atoi(os.Getenv("SPORE_BENCH_SNAPSHOTS")); err == nil && v > 0 {
		k = v
	}
	s3 := testenv.S3AllInterfaces(b)
	b.Setenv("AWS_ACCESS_KEY_ID", s3.AccessKey)
	b.Setenv("AWS_SECRET_ACCESS_KEY", s3.SecretKey)
	b.Setenv("AWS_REGION", s3.Region)
	h := upFleet(b, 3, "b", fmt.Sprintf("--blob-store=s3://%s?endpoint=http://{host}:%d", s3.Bucket, s3.Port))
	api := h.st.APIURLs[0]
	n1, n2, n3 := h.st.Nodes[0].ID, h.st.Nodes[1].ID, h.st.Nodes[2].ID
	create := func(template, node string) (string, time.Duration) {
		t0 := time.Now()
		code, body := h.rest(api, "POST", "/sandboxes", fmt.Sprintf(`{"templateID":%q,"timeout":600,"sporeNodeID":%q}`, template, node))
		d := time.Since(t0)
		if code != 201 {
			b.Fatalf("create from %s on %s: %d %s", template, node, code, body)
		}
		var sb sandbox
		json.Unmarshal(body, &sb)
		return sb.SandboxID, d
	}
	snapshot := func(id string) snapshotView {
		code, body := h.rest(api, "POST", "/sandboxes/"+id+"/snapshots", `{}`)
		if code != 201 {
			b.Fatalf("snapshot: %d %s", code, body)
		}
		var sn snapshotView
		json.Unmarshal(body, &sn)
		if !waitFor(5*time.Minute, func() bool { _, v := h.snapshotInfo(api, sn.SnapshotID); sn = v; return v.Storage == "durable" }) {
			b.Fatalf("snapshot %s not durable: %+v", sn.SnapshotID, sn)
		}
		return sn
	}
	kill := func(id string) { h.rest(api, "DELETE", "/sandboxes/"+id, "") }

	// Small sandboxes: a base sandbox with a counting process.
	src, _ := create("base", n1)
	h.run(api, src, "nohup python3 -c 'import time\nn=0\nwhile True:\n n+=1\n time.sleep(0.05)' >/dev/null 2>&1 & echo ok")
	var snaps []snapshotView
	for range k {
		snaps = append(snaps, snapshot(src))
	}
	var local, peer, fromS3 []time.Duration
	for _, sn := range snaps {
		id, d := create(sn.SnapshotID, n1)
		local = append(local, d)
		kill(id)
		id, d = create(sn.SnapshotID, n2)
		peer = append(peer, d)
		kill(id)
	}

	// A big one: 256 MiB of random memory.
	big, _ := create("base", n1)
	h.run(api, big, `nohup python3 -c "import os,time
b=bytearray(os.urandom(256<<20))
open('/tmp/held','w').write('1')
time.sleep(100000)" >/dev/null 2>&1 &
for i in $(seq 600); do [ -s /tmp/held ] && break; sleep 0.1; done; echo ok`)
	bigSnap := snapshot(big)
	upBytes, upTook := logged(b, h, 1, "snapshot uploaded", bigSnap.SnapshotID)
	id, _ := create(bigSnap.SnapshotID, n2)
	kill(id)
	peerBytes, peerTook := logged(b, h, 2, "snapshot fetched", bigSnap.SnapshotID)

	// An agent editing files: 10 snapshots, each after a few edits.
	agent, _ := create("base", n1)
	h.run(api, agent, "mkdir -p /home/user/proj && cd /home/user/proj && for i in $(seq 200); do head -c 20000 /dev/urandom | base64 > f$i.py; done; echo ok")
	var agentSnaps []snapshotView
	for i := range 10 {
		h.run(api, agent, fmt.Sprintf("cd /home/user/proj && for j in 1 2 3 4 5; do head -c 2000 /dev/urandom | base64 >> f$(( (%d*5+j) %% 200 + 1 )).py; done; head -c 50000 /dev/urandom | base64 > new%d.py; echo ok", i, i))
		agentSnaps = append(agentSnaps, snapshot(agent))
	}

	// Node 1 gone: the third node can only use S3.
	syscall.Kill(h.proc("node-1").PID, syscall.SIGKILL)
	if !waitFor(time.Minute, func() bool { return h.nodes(api)[n1] == "lost" }) {
		b.Fatal("node 1 not lost")
	}
	for _, sn := range snaps {
		id, d := create(sn.SnapshotID, n3)
		fromS3 = append(fromS3, d)
		kill(id)
	}
	id, _ = create(bigSnap.SnapshotID, n3)
	kill(id)
	s3Bytes, s3Took := logged(b, h, 3, "snapshot fetched", bigSnap.SnapshotID)

	// Plain PUT and GET of as many bytes, from this host.
	rawPut, rawGet := rawThroughput(b, s3, upBytes)

	med := func(ds []time.Duration) float64 {
		c := slices.Clone(ds)
		slices.Sort(c)
		return float64(c[len(c)/2].Microseconds()) / 1000
	}
	mbps := func(n int64, d time.Duration) float64 { return float64(n) / 1e6 / d.Seconds() }
	b.ReportMetric(med(local), "local-ms")
	b.ReportMetric(med(peer), "peer-ms")
	b.ReportMetric(med(fromS3), "s3-ms")
	b.Logf("create from a %d-byte snapshot (median of %d, API round trip): on its node %.1f ms, another node from a peer %.1f ms (%.2fx), from S3 %.1f ms (%.2fx); all: local %v, peer %v, s3 %v",
		snaps[0].SizeBytes, k, med(local), med(peer), med(peer)/med(local), med(fromS3), med(fromS3)/med(local), local, peer, fromS3)
	b.Logf("256 MiB random memory (%d bytes): upload %.0f MB/s (%v), fetch from a peer %.0f MB/s, from S3 %.0f MB/s; plain PUT %.0f MB/s, GET %.0f MB/s of the same bytes: upload %.0f %%, S3 fetch %.0f %% of them",
		upBytes, mbps(upBytes, upTook), upTook, mbps(peerBytes, peerTook), mbps(s3Bytes, s3Took), rawPut, rawGet,
		100*mbps(upBytes, upTook)/rawPut, 100*mbps(s3Bytes, s3Took)/rawGet)
	var total, stored int64
	var each []string
	for _, sn := range agentSnaps {
		total += sn.SizeBytes
		stored += sn.StoredBytes
		each = append(each, strconv.FormatInt(sn.StoredBytes>>10, 10))
	}
	b.Logf("10 snapshots of an agent editing files: %d bytes in all, %d stored (dedupe %.1fx); stored per snapshot (KiB): %s",
		total, stored, float64(total)/float64(stored), strings.Join(each, " "))
}

// logged returns the bytes and duration of node k's last log line msg
// about snapshot id.
func logged(b *testing.B, h *harness, k int, msg, id string) (int64, time.Duration) {
	b.Helper()
	log, _ := os.ReadFile(filepath.Join(h.dir, "logs", fmt.Sprintf("node-%d.log", k)))
	var line string
	for _, l := range strings.Split(string(log), "\n") {
		if strings.Contains(l, `msg="`+msg+`"`) && strings.Contains(l, "snapshot_id="+id) {
			line = l
		}
	}
	m := regexp.MustCompile(` bytes=(\d+) .*took=(\S+)`).FindStringSubmatch(line)
	if m == nil {
		b.Fatalf("node %d: no %q line for %s", k, msg, id)
	}
	n, _ := strconv.ParseInt(m[1], 10, 64)
	d, err := time.ParseDuration(m[2])
	if err != nil {
		b.Fatalf("node %d: %q: %v", k, line, err)
	}
	return n, d
}

// rawThroughput PUTs and GETs n random bytes (in 4 MiB objects, as chunks
// are at most) with the blob store's S3 client, 4 at a time as Pack and
// Unpack do, and returns MB/s.
func rawThroughput(b *testing.B, s3 *testenv.S3Server, n int64) (put, get float64) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	st, err := s3store.New(ctx, s3store.Config{Endpoint: s3.Endpoint, Region: s3.Region, Bucket: s3.Bucket, Prefix: "raw/",
		PathStyle: true, AccessKeyID: s3.AccessKey, SecretAccessKey: s3.SecretKey})
	if err != nil {
		b.Fatal(err)
	}
	const part = 4 << 20
	parts := int((n + part - 1) / part)
	data := make([]byte, part)
	rand.Read(data)
	run := func(f func(i int) error) time.Duration {
		t0 := time.Now()
		sem, errs := make(chan struct{}, 4), make(chan error, parts)
		for i := range parts {
			sem <- struct{}{}
			go func() { defer func() { <-sem }(); errs <- f(i) }()
		}
		for range parts {
			if err := <-errs; err != nil {
				b.Fatal(err)
			}
		}
		return time.Since(t0)
	}
	pt := run(func(i int) error { return st.Put(ctx, fmt.Sprintf("p%d", i), bytes.NewReader(data), part) })
	gt := run(func(i int) error {
		rc, err := st.Get(ctx, fmt.Sprintf("p%d", i))
		if err != nil {
			return err
		}
		defer rc.Close()
		_, err = io.Copy(io.Discard, rc)
		return err
	})
	total := float64(parts) * part / 1e6
	return total / pt.Seconds(), total / gt.Seconds()
}

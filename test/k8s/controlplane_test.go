package k8s

import (
	"bytes"
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/hex"
	"encoding/json"
	"encoding/pem"
	"fmt"
	"io"
	"math/big"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/spore-run/spore/internal/pgcluster"
)

// controlPlane is a real Kubernetes control plane on loopback: etcd, kube-apiserver (token
// authentication, RBAC, service account keys), kube-controller-manager and kube-scheduler, plus kwok
// running fake nodes (the kubelet's part: it takes the pods scheduled to its nodes through their
// lifecycle). Everything lives under one temporary directory; every process is stopped by its PID
// and the directory removed when the test ends.
type controlPlane struct {
	t          *testing.T
	dir        string
	token      string
	url        string // https://127.0.0.1:PORT
	kubeconfig string
	client     *http.Client
	procs      []*proc
}

type proc struct {
	name string
	cmd  *exec.Cmd
	log  string
	done chan struct{}
	err  error
}

func startControlPlane(t *testing.T, tl tools) *controlPlane {
	t.Helper()
	cp := &controlPlane{t: t, dir: t.TempDir()}
	// Stop every process before t.TempDir's removal (cleanups run last-registered first).
	t.Cleanup(cp.stop)
	pki := cp.writePKI()

	etcdClient, etcdPeer := freePort(t), freePort(t)
	cp.start("etcd", tl["ETCD"],
		"--name=default", "--data-dir="+filepath.Join(cp.dir, "etcd"),
		"--listen-client-urls=http://127.0.0.1:"+etcdClient, "--advertise-client-urls=http://127.0.0.1:"+etcdClient,
		"--listen-peer-urls=http://127.0.0.1:"+etcdPeer, "--initial-advertise-peer-urls=http://127.0.0.1:"+etcdPeer,
		"--initial-cluster=default=http://127.0.0.1:"+etcdPeer,
		"--unsafe-no-fsync", "--log-level=warn")
	cp.waitFor("etcd", 60*time.Second, func() error {
		resp, err := http.Get("http://127.0.0.1:" + etcdClient + "/health")
		if err != nil {
			return err
		}
		resp.Body.Close()
		if resp.StatusCode != 200 {
			return fmt.Errorf("etcd /health: %s", resp.Status)
		}
		return nil
	})

	port := freePort(t)
	cp.url = "https://127.0.0.1:" + port
	cp.writeKubeconfig(pki.ca)
	cp.start("kube-apiserver", tl["KUBE_APISERVER"],
		"--etcd-servers=http://127.0.0.1:"+etcdClient,
		"--bind-address=127.0.0.1", "--advertise-address=127.0.0.1", "--secure-port="+port,
		"--tls-cert-file="+pki.cert, "--tls-private-key-file="+pki.key, "--cert-dir="+filepath.Join(cp.dir, "apiserver-certs"),
		"--token-auth-file="+pki.tokens, "--anonymous-auth=false", "--authorization-mode=RBAC",
		"--service-account-issuer=https://kubernetes.default.svc", "--service-account-key-file="+pki.saKey,
		"--service-account-signing-key-file="+pki.saKey,
		"--service-cluster-ip-range=10.96.0.0/16",
		// On loopback the API server cannot publish itself as the kubernetes Service's endpoint.
		"--endpoint-reconciler-type=none",
		// The node agents are privileged pods.
		"--allow-privileged=true",
		"--enable-priority-and-fairness=false", "--profiling=false")
	cp.waitFor("kube-apiserver", 120*time.Second, func() error {
		_, err := cp.do("GET", "/readyz", nil)
		return err
	})

	cp.start("kube-controller-manager", tl["KUBE_CONTROLLER_MANAGER"],
		"--kubeconfig="+cp.kubeconfig, "--leader-elect=false",
		// kwok's nodes get no pod CIDRs: no node IPAM.
		"--controllers=*,-nodeipam",
		"--service-account-private-key-file="+pki.saKey, "--root-ca-file="+pki.ca,
		"--bind-address=127.0.0.1", "--secure-port="+freePort(t), "--cert-dir="+filepath.Join(cp.dir, "kcm-certs"))
	cp.start("kube-scheduler", tl["KUBE_SCHEDULER"],
		"--kubeconfig="+cp.kubeconfig, "--leader-elect=false",
		"--bind-address=127.0.0.1", "--secure-port="+freePort(t), "--cert-dir="+filepath.Join(cp.dir, "scheduler-certs"))
	stages, err := filepath.Glob(filepath.Join(tl["KWOK_STAGES"], "*.yaml"))
	if err != nil || len(stages) == 0 {
		t.Fatalf("kwok stages in %s: %v", tl["KWOK_STAGES"], err)
	}
	kwokArgs := []string{"--kubeconfig=" + cp.kubeconfig,
		"--manage-all-nodes=false", "--manage-nodes-with-annotation-selector=kwok.x-k8s.io/node=fake",
		"--cidr=10.0.0.0/24"}
	for _, s := range stages {
		kwokArgs = append(kwokArgs, "--config="+s)
	}
	cp.start("kwok", tl["KWOK"], kwokArgs...)
	return cp
}

type pkiFiles struct{ ca, cert, key, saKey, tokens string }

// writePKI writes a CA, the API server's serving certificate, the service account signing key, the
// token file with one admin token, and the kubeconfig every client uses.
func (cp *controlPlane) writePKI() pkiFiles {
	t := cp.t
	dir := filepath.Join(cp.dir, "pki")
	if err := os.MkdirAll(dir, 0o700); err != nil {
		t.Fatal(err)
	}
	f := pkiFiles{ca: filepath.Join(dir, "ca.pem"), cert: filepath.Join(dir, "apiserver.pem"),
		key: filepath.Join(dir, "apiserver-key.pem"), saKey: filepath.Join(dir, "sa-key.pem"), tokens: filepath.Join(dir, "tokens.csv")}
	caKey := newKey(t)
	caTmpl := &x509.Certificate{SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "spore-test-ca"},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(24 * time.Hour),
		IsCA: true, BasicConstraintsValid: true, KeyUsage: x509.KeyUsageCertSign | x509.KeyUsageDigitalSignature}
	caDER, err := x509.CreateCertificate(rand.Reader, caTmpl, caTmpl, &caKey.PublicKey, caKey)
	if err != nil {
		t.Fatal(err)
	}
	caCert, _ := x509.ParseCertificate(caDER)
	srvKey := newKey(t)
	srvTmpl := &x509.Certificate{SerialNumber: big.NewInt(2), Subject: pkix.Name{CommonName: "kube-apiserver"},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(24 * time.Hour),
		IPAddresses: []net.IP{net.ParseIP("127.0.0.1"), net.ParseIP("10.96.0.1")},
		DNSNames:    []string{"localhost", "kubernetes", "kubernetes.default", "kubernetes.default.svc"},
		KeyUsage:    x509.KeyUsageDigitalSignature, ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}}
	srvDER, err := x509.CreateCertificate(rand.Reader, srvTmpl, caCert, &srvKey.PublicKey, caKey)
	if err != nil {
		t.Fatal(err)
	}
	caPEM := pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: caDER})
	writeFile(t, f.ca, caPEM)
	writeFile(t, f.cert, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: srvDER}))
	writeFile(t, f.key, keyPEM(t, srvKey))
	writeFile(t, f.saKey, keyPEM(t, newKey(t)))

	tok := make([]byte, 24)
	rand.Read(tok)
	cp.token = hex.EncodeToString(tok)
	writeFile(t, f.tokens, []byte(cp.token+`,admin,admin-uid,"system:masters"`+"\n"))

	cp.kubeconfig = filepath.Join(dir, "kubeconfig")

	pool := x509.NewCertPool()
	pool.AppendCertsFromPEM(caPEM)
	cp.client = &http.Client{Timeout: 30 * time.Second,
		Transport: &http.Transport{TLSClientConfig: &tls.Config{RootCAs: pool}}}
	return f
}

// writeKubeconfig writes the kubeconfig of the admin token (JSON is YAML).
func (cp *controlPlane) writeKubeconfig(ca string) {
	kc := map[string]any{
		"apiVersion": "v1", "kind": "Config", "current-context": "test",
		"clusters": []any{map[string]any{"name": "test", "cluster": map[string]any{"server": cp.url, "certificate-authority": ca}}},
		"users":    []any{map[string]any{"name": "admin", "user": map[string]any{"token": cp.token}}},
		"contexts": []any{map[string]any{"name": "test", "context": map[string]any{"cluster": "test", "user": "admin"}}},
	}
	b, _ := json.MarshalIndent(kc, "", "  ")
	writeFile(cp.t, cp.kubeconfig, b)
}

func newKey(t testing.TB) *ecdsa.PrivateKey {
	k, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	return k
}

func keyPEM(t testing.TB, k *ecdsa.PrivateKey) []byte {
	der, err := x509.MarshalECPrivateKey(k)
	if err != nil {
		t.Fatal(err)
	}
	return pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: der})
}

func writeFile(t testing.TB, path string, b []byte) {
	t.Helper()
	if err := os.WriteFile(path, b, 0o600); err != nil {
		t.Fatal(err)
	}
}

// freePort is a port for a server started next (see pgcluster.FreePort:
// outside the ephemeral range, so not taken before it binds).
func freePort(t testing.TB) string {
	t.Helper()
	p, err := pgcluster.FreePort()
	if err != nil {
		t.Fatal(err)
	}
	return strconv.Itoa(p)
}

// start runs bin with args in its own process group, output to <dir>/<name>.log.
func (cp *controlPlane) start(name, bin string, args ...string) *proc {
	t := cp.t
	t.Helper()
	p := &proc{name: name, log: filepath.Join(cp.dir, name+".log"), done: make(chan struct{})}
	lf, err := os.Create(p.log)
	if err != nil {
		t.Fatal(err)
	}
	p.cmd = exec.Command(bin, args...)
	p.cmd.Stdout, p.cmd.Stderr = lf, lf
	p.cmd.Dir = cp.dir
	p.cmd.Env = append(os.Environ(), "HOME="+cp.dir)
	p.cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	start := time.Now()
	if err := p.cmd.Start(); err != nil {
		lf.Close()
		t.Fatalf("start %s: %v", name, err)
	}
	go func() {
		p.err = p.cmd.Wait()
		lf.Close()
		close(p.done)
	}()
	cp.procs = append(cp.procs, p)
	t.Logf("started %s (pid %d) in %v", name, p.cmd.Process.Pid, time.Since(start).Round(time.Millisecond))
	return p
}

// stop ends every process by its PID, last started first (SIGTERM, then SIGKILL after 15 s), and
// logs each one's peak memory.
func (cp *controlPlane) stop() {
	var total int64
	for i := len(cp.procs) - 1; i >= 0; i-- {
		p := cp.procs[i]
		pid := p.cmd.Process.Pid
		hwm := peakRSSKiB(pid)
		total += hwm
		select {
		case <-p.done:
			cp.t.Logf("%s (pid %d) had already exited: %v", p.name, pid, p.err)
			continue
		default:
		}
		_ = p.cmd.Process.Signal(syscall.SIGTERM)
		select {
		case <-p.done:
		case <-time.After(15 * time.Second):
			cp.t.Logf("%s (pid %d) ignored SIGTERM for 15 s: SIGKILL", p.name, pid)
			_ = p.cmd.Process.Kill()
			<-p.done
		}
		cp.t.Logf("stopped %s (pid %d), peak RSS %d MiB", p.name, pid, hwm/1024)
	}
	if len(cp.procs) > 0 {
		cp.t.Logf("control plane peak RSS, sum over processes: %d MiB", total/1024)
	}
	cp.procs = nil
}

func peakRSSKiB(pid int) int64 {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return 0
	}
	for _, line := range strings.Split(string(b), "\n") {
		if rest, ok := strings.CutPrefix(line, "VmHWM:"); ok {
			n, _ := strconv.ParseInt(strings.TrimSuffix(strings.TrimSpace(rest), " kB"), 10, 64)
			return n
		}
	}
	return 0
}

// alive fails the test when one of the processes has exited, showing its log.
func (cp *controlPlane) alive() {
	cp.t.Helper()
	for _, p := range cp.procs {
		select {
		case <-p.done:
			cp.t.Fatalf("%s exited: %v\n%s", p.name, p.err, tail(p.log, 40))
		default:
		}
	}
}

// waitFor polls cond every 200 ms until it returns nil, failing after timeout with its last error
// and the logs' tails.
func (cp *controlPlane) waitFor(what string, timeout time.Duration, cond func() error) {
	cp.t.Helper()
	start := time.Now()
	var err error
	for time.Since(start) < timeout {
		cp.alive()
		if err = cond(); err == nil {
			cp.t.Logf("%s after %v", what, time.Since(start).Round(10*time.Millisecond))
			return
		}
		time.Sleep(200 * time.Millisecond)
	}
	var logs strings.Builder
	for _, p := range cp.procs {
		fmt.Fprintf(&logs, "--- %s ---\n%s\n", p.name, tail(p.log, 15))
	}
	cp.t.Fatalf("%s: not within %v: %v\n%s", what, timeout, err, logs.String())
}

func tail(path string, lines int) string {
	b, _ := os.ReadFile(path)
	l := strings.Split(strings.TrimRight(string(b), "\n"), "\n")
	if len(l) > lines {
		l = l[len(l)-lines:]
	}
	return strings.Join(l, "\n")
}

// do calls the API server with the admin token; a non-2xx answer is an error carrying the body.
func (cp *controlPlane) do(method, path string, body any) ([]byte, error) {
	var rd io.Reader
	if body != nil {
		b, err := json.Marshal(body)
		if err != nil {
			return nil, err
		}
		rd = bytes.NewReader(b)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, method, cp.url+path, rd)
	if err != nil {
		return nil, err
	}
	req.Header.Set("Authorization", "Bearer "+cp.token)
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Accept", "application/json")
	resp, err := cp.client.Do(req)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		return nil, err
	}
	if resp.StatusCode/100 != 2 {
		return b, fmt.Errorf("%s %s: %s: %s", method, path, resp.Status, bytes.TrimSpace(b))
	}
	return b, nil
}

// get decodes a GET into a generic object, failing the test on error.
func (cp *controlPlane) get(path string) map[string]any {
	cp.t.Helper()
	b, err := cp.do("GET", path, nil)
	if err != nil {
		cp.t.Fatal(err)
	}
	var o map[string]any
	if err := json.Unmarshal(b, &o); err != nil {
		cp.t.Fatalf("GET %s: %v", path, err)
	}
	return o
}

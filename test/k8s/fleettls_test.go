package k8s

import (
	"context"
	"crypto/tls"
	"log/slog"
	"maps"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/spore-run/spore/internal/fleetauth"
	"github.com/spore-run/spore/internal/secrets"
)

// TestHelmTemplateInsecureFleet: fleet.insecure renders the old form (cleartext, one cluster token
// in both workloads, nodes registering on the API's port) and nothing of fleet TLS: no CA, no join
// token, no fleet listener or its Service.
func TestHelmTemplateInsecureFleet(t *testing.T) {
	tl := needTools(t, "HELM")
	objs := render(t, tl, valueSets[2].args...)
	for _, o := range objs {
		if str(o, "kind") == "Service" && str(o, "metadata", "name") == "spore-fleet" {
			t.Errorf("fleet.insecure rendered the fleet listener's Service")
		}
	}
	main, node := find(t, objs, "Secret", "spore"), find(t, objs, "Secret", "spore-node")
	if got := dataKeys(main); !slices.Equal(got, []string{"api-key", "cluster-token", "database-url", "secrets-key"}) {
		t.Errorf("Secret spore holds %v", got)
	}
	if got := dataKeys(node); !slices.Equal(got, []string{"cluster-token"}) {
		t.Errorf("Secret spore-node holds %v", got)
	}
	token := b64(t, str(main, "data", "cluster-token"))
	if len(token) != 48 || b64(t, str(node, "data", "cluster-token")) != token {
		t.Errorf("cluster token: %d characters, the same in both Secrets: %v", len(token), b64(t, str(node, "data", "cluster-token")) == token)
	}

	pod, api := podOf(t, objs, "Deployment", "spore-api")
	wantAPI := []string{"api", "--listen", ":3000", "--insecure-fleet", "--cluster-token-file", "/etc/spore/token",
		"--secrets-key-file", "/etc/spore/secrets-key", "--api-key-file", "/etc/spore/api-key", "--pool", "2"}
	if got := strs(api["args"]); !slices.Equal(got, wantAPI) {
		t.Errorf("api args = %q, want %q", got, wantAPI)
	}
	if got := secretFiles(t, pod, api); !maps.Equal(got, map[string]string{"token": "spore/cluster-token",
		"api-key": "spore/api-key", "secrets-key": "spore/secrets-key"}) {
		t.Errorf("api files: %v", got)
	}
	for _, p := range list(api, "ports") {
		if str(p, "name") == "fleet" {
			t.Errorf("fleet.insecure: the api container still declares the fleet port")
		}
	}
	npod, nc := podOf(t, objs, "DaemonSet", "spore-node")
	wantNode := []string{"node", "--listen", ":3001", "--data-dir", "/var/lib/spore", "--api-url", "http://spore-api.sandboxes:3000",
		"--insecure-fleet", "--cluster-token-file", "/etc/spore/token", "--advertise-addr", "$(POD_IP):3001"}
	if got := strs(nc["args"]); !slices.Equal(got, wantNode) {
		t.Errorf("node args = %q, want %q", got, wantNode)
	}
	if got := secretFiles(t, npod, nc); !maps.Equal(got, map[string]string{"token": "spore-node/cluster-token"}) {
		t.Errorf("node files: %v", got)
	}
	if got := secretsNamed(npod); !slices.Equal(got, []string{"spore-node"}) {
		t.Errorf("node pods name Secrets %v, want spore-node alone", got)
	}
}

// TestHelmTemplateRefusesBadFleetValues: values that would give replicas or nodes something they
// refuse at start fail the render instead, naming the value.
func TestHelmTemplateRefusesBadFleetValues(t *testing.T) {
	tl := needTools(t, "HELM")
	for _, c := range []struct {
		name string
		set  []string
		want string
	}{
		{"short join token", []string{"fleet.joinToken.value=short"}, "fleet.joinToken.value"},
		{"secrets key not 32 bytes", []string{"secretsKey.value=c2hvcnQ="}, "secretsKey.value"},
		{"secrets key not base64", []string{"secretsKey.value=not~base64~at~all"}, "secretsKey.value"},
		{"node CA secret without a CA secret", []string{"fleet.ca.nodeSecret=x"}, "fleet.ca.nodeSecret"},
		{"fleet port on the API's", []string{"fleet.port=3000"}, "fleet.port"},
	} {
		t.Run(c.name, func(t *testing.T) {
			args := []string{"template", "spore", chartDir(t), "--set", "database.url=" + testDatabaseURL}
			for _, s := range c.set {
				args = append(args, "--set", s)
			}
			out, err := helm(t, tl, args...)
			if err == nil || !strings.Contains(string(out), c.want) {
				t.Fatalf("helm template --set %v: err=%v, want a failure naming %s\n%s", c.set, err, c.want, out)
			}
		})
	}
	// The positive control: a well-formed value of each renders.
	out, err := helm(t, tl, "template", "spore", chartDir(t), "--set", "database.url="+testDatabaseURL,
		"--set", "fleet.joinToken.value=0123456789abcdef", "--set", "secretsKey.value=AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA=",
		"--set", "fleet.ca.existingSecret=ca", "--set", "fleet.ca.nodeSecret=ca-cert", "--set", "fleet.port=3300")
	if err != nil {
		t.Fatalf("well-formed fleet values refused: %v\n%s", err, out)
	}
}

// TestChartKeepsSecretsOutOfArgs: no container of the chart, with any value set, gets the database
// URL (or any other Secret's value) on its command line: Kubernetes expands $(VAR) in args into the
// process's argv, which /proc shows every user of the host. The positive control renders the
// mistake the chart made before (--database-url $(SPORE_DATABASE_URL), through api.extraArgs) and
// the check catches it.
func TestChartKeepsSecretsOutOfArgs(t *testing.T) {
	tl := needTools(t, "HELM")
	for _, vs := range valueSets {
		t.Run(vs.name, func(t *testing.T) {
			for _, leak := range secretsInArgs(render(t, tl, vs.args...)) {
				t.Error(leak)
			}
		})
	}
	t.Run("positive control", func(t *testing.T) {
		objs := render(t, tl, append(slices.Clone(valueSets[0].args), "--set", "api.extraArgs={--database-url,$(SPORE_DATABASE_URL)}")...)
		leaks := secretsInArgs(objs)
		if len(leaks) != 2 {
			t.Fatalf("the check found %q in args that pass the database URL, want the flag and the expansion", leaks)
		}
	})
}

// secretsInArgs lists what the workloads' containers pass on their command lines that they should
// not: the --database-url flag, the test database URL itself, a $(VAR) expanding an environment
// variable that comes from a Secret.
func secretsInArgs(objs []map[string]any) []string {
	var leaks []string
	expand := regexp.MustCompile(`\$\(([A-Za-z_][A-Za-z0-9_]*)\)`)
	for _, o := range objs {
		kind := str(o, "kind")
		if kind != "Deployment" && kind != "DaemonSet" {
			continue
		}
		pod := get(o, "spec", "template", "spec")
		for _, c := range append(list(pod, "initContainers"), list(pod, "containers")...) {
			fromSecret := map[string]bool{}
			for _, e := range list(c, "env") {
				if get(e, "valueFrom", "secretKeyRef") != nil {
					fromSecret[str(e, "name")] = true
				}
			}
			where := kind + "/" + str(o, "metadata", "name") + " container " + str(c, "name")
			for _, field := range []string{"command", "args"} {
				for _, a := range list(c, field) {
					arg, _ := a.(string)
					switch {
					case arg == "--database-url" || strings.HasPrefix(arg, "--database-url="):
						leaks = append(leaks, where+": "+field+" pass "+arg)
					case strings.Contains(arg, testDatabaseURL):
						leaks = append(leaks, where+": "+field+" hold the database URL")
					}
					for _, m := range expand.FindAllStringSubmatch(arg, -1) {
						if fromSecret[m[1]] {
							leaks = append(leaks, where+": "+field+" expand $("+m[1]+"), a Secret's value, into the command line")
						}
					}
				}
			}
		}
	}
	return leaks
}

// checkFleetMaterial checks the fleet material the chart generated works as the binaries use it:
// the CA certificate and key load as a fleet CA (fleetauth.LoadCA, what `spore api --fleet-ca
// --fleet-ca-key` runs) valid for years; a replica holding them (the API pods' Secret) enrolls a node
// holding only the CA certificate and the join token (the node pods' Secret) with the real
// enrollment code, and refuses a node with another token; the secrets key loads as `spore api
// --secrets-key-file` loads it.
func checkFleetMaterial(t *testing.T, caCert, caKey, apiJoin, nodeCACert, nodeJoin, secretsKey string) {
	t.Helper()
	ca, err := fleetauth.LoadCA([]byte(caCert), []byte(caKey))
	if err != nil {
		t.Fatalf("the chart's fleet CA does not load as one: %v", err)
	}
	if life := time.Until(ca.Cert.NotAfter); life < 9*365*24*time.Hour {
		t.Errorf("the chart's fleet CA expires in %v, want about 10 years", life.Round(time.Hour))
	}
	if len(apiJoin) < fleetauth.MinTokenLen {
		t.Errorf("join token of %d characters", len(apiJoin))
	}

	replica, err := fleetauth.ReplicaMember(ca, []byte(caCert), "api-0")
	if err != nil {
		t.Fatal(err)
	}
	fleet := fleetauth.Secure(replica)
	log := slog.New(slog.DiscardHandler)
	en := &fleetauth.Enroller{CA: ca, Bundle: []byte(caCert), JoinToken: apiJoin, Log: log,
		Bind: func(context.Context, string, string) error { return nil }}
	mux := http.NewServeMux()
	mux.Handle("POST "+fleetauth.EnrollPath, en.Handler(fleet))
	srv := httptest.NewUnstartedServer(mux)
	srv.TLS = fleet.ServerTLS(tls.VerifyClientCertIfGiven)
	srv.StartTLS()
	defer srv.Close()

	dir := t.TempDir()
	caFile := filepath.Join(dir, "ca.crt")
	writeFile(t, caFile, []byte(nodeCACert))
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	ne := fleetauth.NodeEnrollment{Dir: filepath.Join(dir, "wrong"), CAFile: caFile, Node: "n1", Hosts: []string{"192.0.2.10"},
		APIURLs: []string{srv.URL}, JoinToken: "not-the-chart-join-token", Log: log}
	if _, err := ne.Ensure(ctx); err == nil {
		t.Errorf("a node enrolled with a join token that is not the chart's")
	}
	ne.Dir, ne.JoinToken = filepath.Join(dir, "fleet"), nodeJoin
	m, err := ne.Ensure(ctx)
	if err != nil {
		t.Fatalf("a node with the node Secret's CA certificate and join token could not enroll with a replica holding the API Secret's CA: %v", err)
	}
	if id := m.Identity(); id != (fleetauth.Identity{Role: fleetauth.RoleNode, Name: "n1"}) {
		t.Errorf("enrolled as %v", id)
	}

	keyFile := filepath.Join(dir, "secrets-key")
	writeFile(t, keyFile, []byte(secretsKey))
	if _, err := secrets.LoadKey(keyFile); err != nil {
		t.Errorf("the chart's secrets key: %v", err)
	}
}

// podOf returns the pod template of a rendered workload and its first container.
func podOf(t testing.TB, objs []map[string]any, kind, name string) (pod, container map[string]any) {
	t.Helper()
	pod = get(find(t, objs, kind, name), "spec", "template", "spec").(map[string]any)
	return pod, list(pod, "containers")[0].(map[string]any)
}

// secretFiles maps each file the container sees under /etc/spore to the "secret/key" it is
// projected from.
func secretFiles(t testing.TB, pod, container map[string]any) map[string]string {
	t.Helper()
	var vol string
	for _, m := range list(container, "volumeMounts") {
		if str(m, "mountPath") == "/etc/spore" {
			vol = str(m, "name")
		}
	}
	files := map[string]string{}
	for _, v := range list(pod, "volumes") {
		if str(v, "name") != vol {
			continue
		}
		for _, src := range list(v, "projected", "sources") {
			for _, it := range list(src, "secret", "items") {
				if _, dup := files[str(it, "path")]; dup {
					t.Errorf("%s: /etc/spore/%s projected twice", str(container, "name"), str(it, "path"))
				}
				files[str(it, "path")] = str(src, "secret", "name") + "/" + str(it, "key")
			}
		}
	}
	return files
}

// secretsNamed lists every Secret a pod names (volumes, projected sources, env and envFrom of every
// container), sorted: Kubernetes' node authorizer lets the kubelet of the pod's host read each whole.
func secretsNamed(pod map[string]any) []string {
	seen := map[string]bool{}
	for _, v := range list(pod, "volumes") {
		seen[str(v, "secret", "secretName")] = true
		for _, src := range list(v, "projected", "sources") {
			seen[str(src, "secret", "name")] = true
		}
	}
	for _, c := range append(list(pod, "initContainers"), list(pod, "containers")...) {
		for _, e := range list(c, "env") {
			seen[str(e, "valueFrom", "secretKeyRef", "name")] = true
		}
		for _, e := range list(c, "envFrom") {
			seen[str(e, "secretRef", "name")] = true
		}
	}
	for _, s := range list(pod, "imagePullSecrets") {
		seen[str(s, "name")] = true
	}
	delete(seen, "")
	var out []string
	for s := range seen {
		out = append(out, s)
	}
	slices.Sort(out)
	return out
}

func dataKeys(secret map[string]any) []string {
	var out []string
	for k := range get(secret, "data").(map[string]any) {
		out = append(out, k)
	}
	slices.Sort(out)
	return out
}

// fileMode is the mode of the pod's projected file path as rendered (nil: the volume's default).
func fileMode(pod map[string]any, path string) any {
	for _, v := range list(pod, "volumes") {
		for _, src := range list(v, "projected", "sources") {
			for _, it := range list(src, "secret", "items") {
				if str(it, "path") == path {
					return get(it, "mode")
				}
			}
		}
	}
	return nil
}

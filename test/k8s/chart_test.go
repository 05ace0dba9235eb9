package k8s

import (
	"context"
	"encoding/base64"
	"fmt"
	"maps"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"
)

const testDatabaseURL = "postgres://spore:secret@db.example.com:5432/spore?sslmode=require"

// valueSets are the chart's values the tests render with: its defaults (plus the one value it
// requires, the database URL), testdata/values-full.yaml, which switches every optional branch, and
// the defaults with fleet.insecure (the old cleartext form, the one branch full cannot switch too).
var valueSets = []struct {
	name string
	args []string
}{
	{"default", []string{"--set", "database.url=" + testDatabaseURL}},
	{"full", []string{"-f", "testdata/values-full.yaml"}},
	{"insecure", []string{"--set", "database.url=" + testDatabaseURL, "--set", "fleet.insecure=true"}},
}

// helm runs the cached helm with its own state directories (nothing read from or left in $HOME).
func helm(t testing.TB, tl tools, args ...string) ([]byte, error) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, tl["HELM"], args...)
	home := t.TempDir()
	cmd.Env = append(os.Environ(),
		"HELM_CACHE_HOME="+filepath.Join(home, "cache"),
		"HELM_CONFIG_HOME="+filepath.Join(home, "config"),
		"HELM_DATA_HOME="+filepath.Join(home, "data"),
	)
	return cmd.CombinedOutput()
}

// render returns `helm template` of the chart with args, decoded.
func render(t testing.TB, tl tools, args ...string) []map[string]any {
	t.Helper()
	// Rendered for the Kubernetes version whose schemas and API server the tests check it against.
	out, err := helm(t, tl, append([]string{"template", "spore", chartDir(t), "--namespace", "sandboxes",
		"--kube-version", tl["K8S_VERSION"]}, args...)...)
	if err != nil {
		t.Fatalf("helm template %v: %v\n%s", args, err, out)
	}
	return decodeManifests(t, out)
}

func TestHelmLint(t *testing.T) {
	tl := needTools(t, "HELM")
	for _, vs := range valueSets {
		t.Run(vs.name, func(t *testing.T) {
			out, err := helm(t, tl, append([]string{"lint", "--strict", chartDir(t)}, vs.args...)...)
			if err != nil {
				t.Fatalf("helm lint --strict (%s values): %v\n%s", vs.name, err, out)
			}
			t.Logf("%s", out)
		})
	}
}

// TestHelmTemplateRequiresDatabase: without a database the chart refuses to render (an API that
// cannot reach its store would only crash-loop), and says what to set.
func TestHelmTemplateRequiresDatabase(t *testing.T) {
	tl := needTools(t, "HELM")
	out, err := helm(t, tl, "template", "spore", chartDir(t))
	if err == nil {
		t.Fatalf("helm template without database.url succeeded:\n%s", out)
	}
	if !strings.Contains(string(out), "database.url") {
		t.Fatalf("helm template without database.url failed without naming it:\n%s", out)
	}
	out, err = helm(t, tl, "template", "spore", chartDir(t), "--set", "database.url="+testDatabaseURL,
		"--set", "s3.endpoint=https://s3.example.com")
	if err == nil || !strings.Contains(string(out), "s3.bucket") {
		t.Fatalf("helm template with an S3 endpoint and no bucket: err=%v\n%s", err, out)
	}
}

// TestHelmTemplateDefaults checks what the default values render: the commands and flags each
// workload runs with, where its secrets come from (fleet TLS: the CA key, the API key and the
// secrets key in the API pods only, in a Secret no node pod names), the generated fleet material
// working with the real enrollment code, and the host access the node agent gets.
func TestHelmTemplateDefaults(t *testing.T) {
	tl := needTools(t, "HELM")
	objs := render(t, tl, valueSets[0].args...)
	kinds := map[string][]string{}
	for _, o := range objs {
		kinds[str(o, "kind")] = append(kinds[str(o, "kind")], str(o, "metadata", "name"))
	}
	want := map[string][]string{
		"Secret":              {"spore", "spore-node"},
		"ConfigMap":           {"spore"},
		"ServiceAccount":      {"spore-api", "spore-node"},
		"Role":                {"spore-api"},
		"RoleBinding":         {"spore-api"},
		"Service":             {"spore-api", "spore-fleet", "spore-node"},
		"Deployment":          {"spore-api"},
		"DaemonSet":           {"spore-node"},
		"PodDisruptionBudget": {"spore-api"},
	}
	for k, names := range want {
		got := slices.Clone(kinds[k])
		slices.Sort(got)
		if !slices.Equal(got, names) {
			t.Errorf("%s: got %v, want %v", k, got, names)
		}
	}
	if len(kinds) != len(want) {
		t.Errorf("kinds rendered: %v", kinds)
	}

	// The API pods' Secret and the node pods' one: no cluster token (fleet TLS), and nothing in the
	// nodes' that is the API's alone.
	secret, nodeSecret := find(t, objs, "Secret", "spore"), find(t, objs, "Secret", "spore-node")
	if got := dataKeys(secret); !slices.Equal(got, []string{"api-key", "database-url", "fleet-ca.crt", "fleet-ca.key", "join-token", "secrets-key"}) {
		t.Errorf("Secret spore holds %v", got)
	}
	if got := dataKeys(nodeSecret); !slices.Equal(got, []string{"ca.crt", "join-token"}) {
		t.Errorf("Secret spore-node holds %v, want the CA certificate and the join token alone", got)
	}
	if got := b64(t, str(secret, "data", "database-url")); got != testDatabaseURL {
		t.Errorf("secret database-url = %q", got)
	}
	for _, k := range []string{"join-token", "api-key"} {
		if v := b64(t, str(secret, "data", k)); len(v) != 48 {
			t.Errorf("generated %s has %d characters, want 48", k, len(v))
		}
	}
	for k, nk := range map[string]string{"fleet-ca.crt": "ca.crt", "join-token": "join-token"} {
		if str(secret, "data", k) != str(nodeSecret, "data", nk) {
			t.Errorf("the node Secret's %s is not the API Secret's %s", nk, k)
		}
	}
	checkFleetMaterial(t, b64(t, str(secret, "data", "fleet-ca.crt")), b64(t, str(secret, "data", "fleet-ca.key")),
		b64(t, str(secret, "data", "join-token")), b64(t, str(nodeSecret, "data", "ca.crt")), b64(t, str(nodeSecret, "data", "join-token")),
		b64(t, str(secret, "data", "secrets-key")))

	dep := find(t, objs, "Deployment", "spore-api")
	if r := get(dep, "spec", "replicas"); r != 2 {
		t.Errorf("api replicas = %v", r)
	}
	pod := get(dep, "spec", "template", "spec").(map[string]any)
	api := list(pod, "containers")[0].(map[string]any)
	wantArgs := []string{"api", "--listen", ":3000", "--fleet-listen", ":3200", "--fleet-ca", "/etc/spore/ca.crt",
		"--fleet-ca-key", "/etc/spore/ca.key", "--join-token-file", "/etc/spore/join-token",
		"--secrets-key-file", "/etc/spore/secrets-key", "--api-key-file", "/etc/spore/api-key", "--pool", "2"}
	if got := strs(api["args"]); !slices.Equal(got, wantArgs) {
		t.Errorf("api args = %q, want %q", got, wantArgs)
	}
	dbEnv := envVar(t, api, "SPORE_DATABASE_URL")
	if str(dbEnv, "valueFrom", "secretKeyRef", "name") != "spore" || str(dbEnv, "valueFrom", "secretKeyRef", "key") != "database-url" {
		t.Errorf("SPORE_DATABASE_URL comes from %v", dbEnv["valueFrom"])
	}
	var fleetPort any
	for _, p := range list(api, "ports") {
		if str(p, "name") == "fleet" {
			fleetPort = get(p, "containerPort")
		}
	}
	if fleetPort != 3200 {
		t.Errorf("api container fleet port = %v, want 3200", fleetPort)
	}
	if str(api, "readinessProbe", "httpGet", "path") != "/health" || str(api, "livenessProbe", "httpGet", "path") != "/health" {
		t.Errorf("api probes: %v %v", api["readinessProbe"], api["livenessProbe"])
	}
	if get(api, "securityContext", "privileged") == true || get(pod, "hostNetwork") == true {
		t.Errorf("the api pod must not be privileged or on the host network")
	}
	if got, want := secretFiles(t, pod, api), map[string]string{"ca.crt": "spore/fleet-ca.crt", "ca.key": "spore/fleet-ca.key",
		"join-token": "spore/join-token", "api-key": "spore/api-key", "secrets-key": "spore/secrets-key"}; !maps.Equal(got, want) {
		t.Errorf("api files under /etc/spore: %v, want %v", got, want)
	}
	if m := fileMode(pod, "ca.key"); m != 0o400 {
		t.Errorf("ca.key mode %v, want 0400", m)
	}

	ds := find(t, objs, "DaemonSet", "spore-node")
	npod := get(ds, "spec", "template", "spec").(map[string]any)
	node := list(npod, "containers")[0].(map[string]any)
	wantNode := []string{"node", "--listen", ":3001", "--data-dir", "/var/lib/spore",
		"--api-url", "https://spore-fleet.sandboxes:3200", "--fleet-ca", "/etc/spore/ca.crt", "--join-token-file", "/etc/spore/join-token",
		"--advertise-addr", "$(POD_IP):3001"}
	if got := strs(node["args"]); !slices.Equal(got, wantNode) {
		t.Errorf("node args = %q, want %q", got, wantNode)
	}
	if str(envVar(t, node, "POD_IP"), "valueFrom", "fieldRef", "fieldPath") != "status.podIP" {
		t.Errorf("POD_IP is not the pod's IP")
	}
	if get(node, "securityContext", "privileged") != true {
		t.Errorf("node agent not privileged: %v", node["securityContext"])
	}
	for _, k := range []string{"hostNetwork", "hostPID"} {
		if get(npod, k) != true {
			t.Errorf("node pod %s = %v", k, get(npod, k))
		}
	}
	if get(npod, "automountServiceAccountToken") != false {
		t.Errorf("node pod mounts a service account token")
	}
	if str(npod, "dnsPolicy") != "ClusterFirstWithHostNet" {
		t.Errorf("node pod dnsPolicy = %v", npod["dnsPolicy"])
	}
	hostPaths := map[string]string{} // mount path -> host path
	vols := map[string]map[string]any{}
	for _, v := range list(npod, "volumes") {
		vols[str(v, "name")] = v.(map[string]any)
	}
	for _, m := range list(node, "volumeMounts") {
		if hp := str(vols[str(m, "name")], "hostPath", "path"); hp != "" {
			hostPaths[str(m, "mountPath")] = hp
		}
	}
	for mount, host := range map[string]string{"/var/lib/spore": "/var/lib/spore", "/sys/fs/cgroup": "/sys/fs/cgroup",
		"/dev": "/dev", "/run/netns": "/run/netns"} {
		if hostPaths[mount] != host {
			t.Errorf("node mount %s: host path %q, want %q", mount, hostPaths[mount], host)
		}
	}
	// The node agents see the CA certificate and the join token, and no pod of theirs names the
	// Secret holding the CA key, the API key, the secrets key and the database URL.
	if got, want := secretFiles(t, npod, node), map[string]string{"ca.crt": "spore-node/ca.crt", "join-token": "spore-node/join-token"}; !maps.Equal(got, want) {
		t.Errorf("node files under /etc/spore: %v, want %v", got, want)
	}
	if got := secretsNamed(npod); !slices.Equal(got, []string{"spore-node"}) {
		t.Errorf("node pods name Secrets %v, want spore-node alone", got)
	}
	if inits := list(npod, "initContainers"); len(inits) != 1 ||
		!slices.Equal(strs(get(inits[0], "args")), []string{"setup", "--data-dir", "/var/lib/spore", "--cache-dir", "/opt/spore/cache"}) {
		t.Errorf("node init containers: %v", inits)
	}
	if sel := get(npod, "nodeSelector", "kubernetes.io/os"); sel != "linux" {
		t.Errorf("node nodeSelector: %v", npod["nodeSelector"])
	}

	if ip := str(find(t, objs, "Service", "spore-node"), "spec", "clusterIP"); ip != "None" {
		t.Errorf("node Service clusterIP = %q, want None (headless)", ip)
	}
	if typ := str(find(t, objs, "Service", "spore-api"), "spec", "type"); typ != "ClusterIP" {
		t.Errorf("api Service type = %q", typ)
	}
	fsvc := find(t, objs, "Service", "spore-fleet")
	fp := list(fsvc, "spec", "ports")
	if str(fsvc, "spec", "type") != "ClusterIP" || len(fp) != 1 || get(fp[0], "port") != 3200 || str(fp[0], "targetPort") != "fleet" ||
		str(fsvc, "spec", "selector", "app.kubernetes.io/component") != "api" {
		t.Errorf("fleet Service: %v", fsvc["spec"])
	}
	role := find(t, objs, "Role", "spore-api")
	for _, r := range list(role, "rules") {
		for _, verb := range strs(get(r, "verbs")) {
			if !slices.Contains([]string{"get", "list", "watch"}, verb) {
				t.Errorf("api Role grants %q: discovery needs reads only", verb)
			}
		}
	}
}

// TestHelmTemplateFullValues checks that the non-default values reach the manifests.
func TestHelmTemplateFullValues(t *testing.T) {
	tl := needTools(t, "HELM")
	objs := render(t, tl, valueSets[1].args...)
	for _, o := range objs {
		switch str(o, "kind") {
		case "Role", "RoleBinding":
			t.Errorf("rbac.create=false rendered a %s", str(o, "kind"))
		case "ServiceAccount":
			if str(o, "metadata", "name") != "sandboxes-node" {
				t.Errorf("serviceAccount.create=false rendered ServiceAccount %s", str(o, "metadata", "name"))
			}
		}
	}
	// Every secret is the user's own but the S3 keys: the chart's one Secret is the node one, with them.
	var secretNames []string
	for _, o := range objs {
		if str(o, "kind") == "Secret" {
			secretNames = append(secretNames, str(o, "metadata", "name"))
		}
	}
	if !slices.Equal(secretNames, []string{"sandboxes-node"}) {
		t.Errorf("Secrets rendered: %v, want sandboxes-node alone", secretNames)
	}
	if got := dataKeys(find(t, objs, "Secret", "sandboxes-node")); !slices.Equal(got, []string{"access-key-id", "secret-access-key"}) {
		t.Errorf("with existing database, CA, join token, API key and secrets key Secrets the chart's Secret holds %v, want the S3 keys", got)
	}
	dep := find(t, objs, "Deployment", "sandboxes-api")
	pod := get(dep, "spec", "template", "spec").(map[string]any)
	api := list(pod, "containers")[0].(map[string]any)
	if get(dep, "spec", "replicas") != 3 || str(api, "image") != "registry.example.com/spore/spore:1.2.3" {
		t.Errorf("api replicas/image: %v %v", get(dep, "spec", "replicas"), api["image"])
	}
	if got := strs(api["args"]); !slices.Equal(got[len(got)-4:], []string{"--pool", "2", "--pool", "4"}) || got[2] != ":8080" ||
		got[3] != "--fleet-listen" || got[4] != ":4200" {
		t.Errorf("api args = %q", got)
	}
	if got := strs(api["args"]); !slices.Equal(got[len(got)-6:len(got)-4], []string{"--default-team-quotas", "sandboxes=20,vcpus=40"}) {
		t.Errorf("api args = %q, want --default-team-quotas from api.defaultTeamQuotas", got)
	}
	db := envVar(t, api, "SPORE_DATABASE_URL")
	if str(db, "valueFrom", "secretKeyRef", "name") != "spore-db" || str(db, "valueFrom", "secretKeyRef", "key") != "dsn" {
		t.Errorf("SPORE_DATABASE_URL from %v", db["valueFrom"])
	}
	if str(envVar(t, api, "AWS_ACCESS_KEY_ID"), "valueFrom", "secretKeyRef", "name") != "sandboxes-node" {
		t.Errorf("S3 credentials not wired to the api")
	}
	if got, want := secretFiles(t, pod, api), map[string]string{"ca.crt": "spore-fleet-ca/tls.crt", "ca.key": "spore-fleet-ca/tls.key",
		"join-token": "spore-join/join", "api-key": "spore-api-key/key", "secrets-key": "spore-secrets-key/sealing-key",
		"metrics-token": "spore-metrics/token"}; !maps.Equal(got, want) {
		t.Errorf("api files under /etc/spore: %v, want %v", got, want)
	}
	if fp := list(find(t, objs, "Service", "sandboxes-fleet"), "spec", "ports"); len(fp) != 1 || get(fp[0], "port") != 4200 {
		t.Errorf("fleet Service ports: %v", fp)
	}
	if str(pod, "serviceAccountName") != "spore-api-sa" || get(pod, "automountServiceAccountToken") != false {
		t.Errorf("api service account: %v automount %v", pod["serviceAccountName"], pod["automountServiceAccountToken"])
	}
	svc := find(t, objs, "Service", "sandboxes-api")
	if str(svc, "spec", "type") != "LoadBalancer" || get(svc, "spec", "ports").([]any)[0].(map[string]any)["nodePort"] != 30080 {
		t.Errorf("api Service: %v", svc["spec"])
	}
	ing := find(t, objs, "Ingress", "sandboxes")
	var hosts []string
	for _, r := range list(ing, "spec", "rules") {
		hosts = append(hosts, str(r, "host"))
	}
	if !slices.Equal(hosts, []string{"sandboxes.example.com", "*.sandboxes.example.com"}) {
		t.Errorf("ingress hosts = %v (sandbox traffic needs the wildcard)", hosts)
	}
	if pdb := find(t, objs, "PodDisruptionBudget", "sandboxes-api"); get(pdb, "spec", "maxUnavailable") != 2 {
		t.Errorf("pdb: %v", pdb["spec"])
	}
	cm := find(t, objs, "ConfigMap", "sandboxes")
	for k, v := range map[string]string{"SPORE_BLOB_STORE": "s3://spore-snapshots?endpoint=https%3A%2F%2Fs3.example.com&region=eu-west-1&path-style=false",
		"SPORE_EXTRA": "yes", "SPORE_POOL": "4"} {
		if got := str(cm, "data", k); got != v {
			t.Errorf("ConfigMap %s = %q, want %q", k, got, v)
		}
	}

	ds := find(t, objs, "DaemonSet", "sandboxes-node")
	npod := get(ds, "spec", "template", "spec").(map[string]any)
	node := list(npod, "containers")[0].(map[string]any)
	args := strs(node["args"])
	for _, want := range [][2]string{{"--listen", ":4001"}, {"--data-dir", "/srv/spore"},
		{"--api-url", "https://fleet.internal.example.com:4200"}, {"--advertise-addr", "$(POD_IP):4001"}, {"--memory-reserve", "2048"},
		{"--fleet-ca", "/etc/spore/ca.crt"}, {"--join-token-file", "/etc/spore/join-token"},
		{"--labels", "gpu=false,zone=eu-west-1a"}, {"--dns-upstream", "1.1.1.1"}, {"--metrics-listen", ":4002"},
		{"--metrics-token-file", "/etc/spore/metrics-token"}} {
		i := slices.Index(args, want[0])
		if i < 0 || i+1 >= len(args) || args[i+1] != want[1] {
			t.Errorf("node args %q lack %s %s", args, want[0], want[1])
		}
	}
	// The CA certificate from the Secret holding it alone (fleet.ca.nodeSecret), never the CA's own.
	if got, want := secretFiles(t, npod, node), map[string]string{"ca.crt": "spore-fleet-ca-cert/cert.pem", "join-token": "spore-join/join",
		"metrics-token": "spore-metrics/token"}; !maps.Equal(got, want) {
		t.Errorf("node files under /etc/spore: %v, want %v", got, want)
	}
	if got := secretsNamed(npod); slices.Contains(got, "spore-fleet-ca") || slices.Contains(got, "spore-api-key") || slices.Contains(got, "spore-secrets-key") {
		t.Errorf("node pods name Secrets %v: the CA key's, the API key's or the secrets key's among them", got)
	}
	if get(npod, "hostNetwork") != false || get(npod, "hostPID") != false || str(npod, "dnsPolicy") != "ClusterFirst" {
		t.Errorf("node host namespaces: net %v pid %v dns %v", npod["hostNetwork"], npod["hostPID"], npod["dnsPolicy"])
	}
	if npod["initContainers"] != nil {
		t.Errorf("node.setup.enabled=false rendered init containers")
	}
	if str(npod, "nodeSelector", "spore.example.com/sandbox-host") != "true" || len(list(npod, "tolerations")) != 1 {
		t.Errorf("node placement: %v %v", npod["nodeSelector"], npod["tolerations"])
	}
	if us := get(ds, "spec", "updateStrategy").(map[string]any); us["type"] != "OnDelete" || us["rollingUpdate"] != nil {
		t.Errorf("node updateStrategy = %v", us)
	}
	if p := list(node, "ports")[0].(map[string]any); p["hostPort"] != nil {
		t.Errorf("a hostPort without the host network: %v", p)
	}
}

// TestRenderedManifestsMatchAPISchemas validates every object the chart renders, with both value
// sets, against the OpenAPI schema of the Kubernetes API the cluster test runs (strict: unknown
// fields are errors).
func TestRenderedManifestsMatchAPISchemas(t *testing.T) {
	tl := needTools(t, "HELM", "KUBE_SWAGGER")
	schema := loadAPISchema(t, tl["KUBE_SWAGGER"])
	for _, vs := range valueSets {
		t.Run(vs.name, func(t *testing.T) {
			objs := render(t, tl, vs.args...)
			bad := 0
			for _, o := range objs {
				for _, e := range schema.check(o) {
					bad++
					t.Errorf("%s/%s: %s", str(o, "kind"), str(o, "metadata", "name"), e)
				}
			}
			if bad > 0 {
				return
			}
			t.Logf("%d objects valid against the Kubernetes %s API schema", len(objs), tl["K8S_VERSION"])
		})
	}
}

// TestSchemaCheckCatchesMistakes is the schema check's positive control: manifests with the
// mistakes a chart makes (a misspelt field, a wrong type, a missing required field, a kind the
// API lacks) each fail it.
func TestSchemaCheckCatchesMistakes(t *testing.T) {
	tl := needTools(t, "HELM", "KUBE_SWAGGER")
	schema := loadAPISchema(t, tl["KUBE_SWAGGER"])
	objs := render(t, tl, valueSets[0].args...)
	cases := []struct {
		name, kind string
		mutate     func(o map[string]any)
		want       string
	}{
		{"misspelt pod field", "DaemonSet", func(o map[string]any) {
			get(o, "spec", "template", "spec").(map[string]any)["hostPid"] = true
		}, `unknown field "hostPid"`},
		{"misspelt container field", "Deployment", func(o map[string]any) {
			list(get(o, "spec", "template", "spec"), "containers")[0].(map[string]any)["arg"] = []any{"api"}
		}, `unknown field "arg"`},
		{"wrong type", "Deployment", func(o map[string]any) { get(o, "spec").(map[string]any)["replicas"] = "two" }, "want an integer"},
		{"missing required", "Service", func(o map[string]any) {
			delete(list(get(o, "spec"), "ports")[0].(map[string]any), "port")
		}, `missing required field "port"`},
		{"unknown kind", "ConfigMap", func(o map[string]any) { o["apiVersion"] = "v2" }, "no such kind"},
		{"misspelt quantity holder", "Deployment", func(o map[string]any) {
			c := list(get(o, "spec", "template", "spec"), "containers")[0].(map[string]any)
			get(c, "resources").(map[string]any)["request"] = map[string]any{"cpu": "1"}
		}, `unknown field "request"`},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			var o map[string]any
			for _, x := range objs {
				if str(x, "kind") == c.kind {
					o = deepCopy(x)
					break
				}
			}
			if o == nil {
				t.Fatalf("no %s rendered", c.kind)
			}
			if errs := schema.check(o); len(errs) != 0 {
				t.Fatalf("unmutated %s invalid: %v", c.kind, errs)
			}
			c.mutate(o)
			errs := schema.check(o)
			if !slices.ContainsFunc(errs, func(e string) bool { return strings.Contains(e, c.want) }) {
				t.Fatalf("mutated %s: errors %q, want one containing %q", c.kind, errs, c.want)
			}
		})
	}
}

// ---- helpers over decoded manifests ----

func get(v any, path ...string) any {
	for _, p := range path {
		m, ok := v.(map[string]any)
		if !ok {
			return nil
		}
		v = m[p]
	}
	return v
}

func str(v any, path ...string) string { s, _ := get(v, path...).(string); return s }

func list(v any, path ...string) []any { l, _ := get(v, path...).([]any); return l }

func strs(v any) []string {
	var out []string
	for _, e := range v.([]any) {
		out = append(out, fmt.Sprint(e))
	}
	return out
}

func b64(t testing.TB, s string) string {
	t.Helper()
	b, err := base64.StdEncoding.DecodeString(s)
	if err != nil {
		t.Fatalf("base64 %q: %v", s, err)
	}
	return string(b)
}

func find(t testing.TB, objs []map[string]any, kind, name string) map[string]any {
	t.Helper()
	for _, o := range objs {
		if str(o, "kind") == kind && str(o, "metadata", "name") == name {
			return o
		}
	}
	t.Fatalf("no %s %s rendered", kind, name)
	return nil
}

func envVar(t testing.TB, container map[string]any, name string) map[string]any {
	t.Helper()
	for _, e := range list(container, "env") {
		if str(e, "name") == name {
			return e.(map[string]any)
		}
	}
	t.Fatalf("container %s has no env %s", str(container, "name"), name)
	return nil
}

func deepCopy(o map[string]any) map[string]any {
	var c func(v any) any
	c = func(v any) any {
		switch x := v.(type) {
		case map[string]any:
			m := make(map[string]any, len(x))
			for k, e := range x {
				m[k] = c(e)
			}
			return m
		case []any:
			l := make([]any, len(x))
			for i, e := range x {
				l[i] = c(e)
			}
			return l
		}
		return v
	}
	return c(o).(map[string]any)
}

package k8s

import (
	"encoding/base64"
	"encoding/json"
	"slices"
	"strings"
	"testing"
)

// With metrics.enabled the chart gives both chart Secrets one generated
// metrics token, mounts it in the API and node pods, passes it to `spore
// api` (--metrics-token-file) and `spore node` (--metrics-listen on
// metrics.nodePort), publishes the nodes' metrics port, and with
// serviceMonitor.enabled renders a ServiceMonitor scraping both with the
// token from the node Secret. Every other object stays valid against the
// Kubernetes API schema; without metrics.enabled none of it renders; a
// short token or a ServiceMonitor without metrics is refused.
func TestHelmMetrics(t *testing.T) {
	tl := needTools(t, "HELM", "KUBE_SWAGGER")
	schema := loadAPISchema(t, tl["KUBE_SWAGGER"])
	base := []string{"--set", "database.url=" + testDatabaseURL}
	objs := render(t, tl, append(slices.Clone(base), "--set", "metrics.enabled=true", "--set", "metrics.serviceMonitor.enabled=true",
		"--set", "metrics.serviceMonitor.labels.release=prom")...)
	var monitors int
	for _, o := range objs {
		if str(o, "kind") == "ServiceMonitor" {
			monitors++
			continue // a CRD's kind: not in the Kubernetes API schema
		}
		for _, e := range schema.check(o) {
			t.Errorf("%s/%s: %s", str(o, "kind"), str(o, "metadata", "name"), e)
		}
	}
	tokens := map[string]bool{}
	for _, name := range []string{"spore", "spore-node"} {
		v, err := base64.StdEncoding.DecodeString(str(find(t, objs, "Secret", name), "data", "metrics-token"))
		if err != nil || len(v) < 16 {
			t.Fatalf("Secret %s's metrics-token: %q %v", name, v, err)
		}
		tokens[string(v)] = true
	}
	if len(tokens) != 1 {
		t.Fatalf("the two Secrets hold %d metrics tokens, want one", len(tokens))
	}
	api := list(get(find(t, objs, "Deployment", "spore-api"), "spec", "template", "spec"), "containers")[0]
	if args := strs(get(api, "args")); !containsRun(args, "--metrics-token-file", "/etc/spore/metrics-token") {
		t.Errorf("api args %q, want --metrics-token-file", args)
	}
	ds := get(find(t, objs, "DaemonSet", "spore-node"), "spec", "template", "spec")
	var node any
	for _, c := range list(ds, "containers") {
		if str(c, "name") == "node" {
			node = c
		}
	}
	if args := strs(get(node, "args")); !containsRun(args, "--metrics-listen", ":3002", "--metrics-token-file", "/etc/spore/metrics-token") {
		t.Errorf("node args %q, want --metrics-listen :3002 and the token file", args)
	}
	if !slices.ContainsFunc(list(node, "ports"), func(p any) bool { return str(p, "name") == "metrics" && get(p, "containerPort") == 3002 }) {
		t.Errorf("node ports %v, want metrics 3002", list(node, "ports"))
	}
	for _, pod := range []any{ds, get(find(t, objs, "Deployment", "spore-api"), "spec", "template", "spec")} {
		if !strings.Contains(toJSON(t, list(pod, "volumes")), `"path":"metrics-token"`) {
			t.Errorf("a pod's secrets volume lacks metrics-token: %s", toJSON(t, list(pod, "volumes")))
		}
	}
	if !slices.ContainsFunc(list(find(t, objs, "Service", "spore-node"), "spec", "ports"), func(p any) bool { return str(p, "name") == "metrics" }) {
		t.Error("the node Service has no metrics port")
	}
	if monitors != 1 {
		t.Fatalf("%d ServiceMonitors rendered, want 1", monitors)
	}
	sm := find(t, objs, "ServiceMonitor", "spore")
	if str(sm, "apiVersion") != "monitoring.coreos.com/v1" || str(sm, "metadata", "labels", "release") != "prom" {
		t.Errorf("ServiceMonitor: %s", toJSON(t, sm))
	}
	var ports []string
	for _, e := range list(sm, "spec", "endpoints") {
		ports = append(ports, str(e, "port"))
		if str(e, "path") != "/metrics" || str(e, "bearerTokenSecret", "name") != "spore-node" || str(e, "bearerTokenSecret", "key") != "metrics-token" {
			t.Errorf("ServiceMonitor endpoint %s", toJSON(t, e))
		}
	}
	if !slices.Equal(ports, []string{"http", "metrics"}) {
		t.Errorf("ServiceMonitor endpoints on ports %v, want http and metrics", ports)
	}

	// Off (the default): none of it.
	for _, o := range render(t, tl, base...) {
		if s := toJSON(t, o); str(o, "kind") == "ServiceMonitor" || strings.Contains(s, "metrics-token") || strings.Contains(s, "--metrics-listen") {
			t.Fatalf("metrics off rendered metrics: %s/%s", str(o, "kind"), str(o, "metadata", "name"))
		}
	}
	for _, bad := range [][]string{{"--set", "metrics.enabled=true", "--set", "metrics.token.value=short"},
		{"--set", "metrics.serviceMonitor.enabled=true"}, {"--set", "metrics.enabled=true", "--set", "metrics.nodePort=3001"}} {
		out, err := helm(t, tl, append([]string{"template", "spore", chartDir(t), "--namespace", "sandboxes"}, append(slices.Clone(base), bad...)...)...)
		if err == nil {
			t.Errorf("helm template %v rendered; want refused", bad)
		} else if !strings.Contains(string(out), "metrics") {
			t.Errorf("helm template %v: %s, want an error naming metrics", bad, out)
		}
	}
}

// containsRun reports whether want appears in args as consecutive items.
func containsRun(args []string, want ...string) bool {
	for i := 0; i+len(want) <= len(args); i++ {
		if slices.Equal(args[i:i+len(want)], want) {
			return true
		}
	}
	return false
}

func toJSON(t testing.TB, v any) string {
	t.Helper()
	b, err := json.Marshal(v)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

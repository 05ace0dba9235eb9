package k8s

import (
	"encoding/json"
	"fmt"
	"slices"
	"sort"
	"strings"
	"testing"
	"time"
)

const (
	kwokNodes   = 2
	apiReplicas = 2
	namespace   = "spore"
	release     = "spore"
)

// TestChartInstallsOnKubernetes installs the chart into a real control plane whose nodes are kwok's
// fake ones and checks what Kubernetes made of it: the API server accepts every object (its own
// validation, stricter than the offline schema check: enums, formats, cross-field rules, admission),
// the scheduler places the API replicas and the DaemonSet puts one node agent on each node, every pod
// reaches Running and ready, the node agents' headless Service publishes one endpoint per node
// (discovery from the cluster), and the API's service account may read exactly what discovery needs.
// Then `helm uninstall` removes every pod. kwok stands in for the kubelet, so no container runs: the
// test proves the manifests and their scheduling, not the spore binary inside them.
func TestChartInstallsOnKubernetes(t *testing.T) {
	tl := needTools(t, "HELM", "ETCD", "KUBE_APISERVER", "KUBE_CONTROLLER_MANAGER", "KUBE_SCHEDULER", "KWOK", "KWOK_STAGES")
	start := time.Now()
	cp := startControlPlane(t, tl)
	t.Logf("control plane up in %v", time.Since(start).Round(10*time.Millisecond))

	nodes, nodeIPs := make([]string, kwokNodes), make([]string, kwokNodes)
	for i := range nodes {
		nodes[i], nodeIPs[i] = fmt.Sprintf("kwok-node-%d", i), fmt.Sprintf("192.0.2.%d", 10+i)
		cp.createNode(nodes[i], nodeIPs[i])
	}
	cp.waitFor("kwok nodes Ready", 2*time.Minute, func() error {
		for _, n := range nodes {
			if !conditionTrue(cp.get("/api/v1/nodes/"+n), "Ready") {
				return fmt.Errorf("node %s not Ready", n)
			}
		}
		return nil
	})
	// The node agents are privileged: the namespace says so, as docs/deploy.md tells operators to.
	if _, err := cp.do("POST", "/api/v1/namespaces", map[string]any{
		"apiVersion": "v1", "kind": "Namespace",
		"metadata": map[string]any{"name": namespace, "labels": map[string]any{"pod-security.kubernetes.io/enforce": "privileged"}},
	}); err != nil {
		t.Fatal(err)
	}
	// The default ServiceAccount appears once the controller manager's controllers run: pods in a
	// namespace without it are refused by the ServiceAccount admission plugin's wait.
	cp.waitFor("namespace ready", time.Minute, func() error {
		_, err := cp.do("GET", "/api/v1/namespaces/"+namespace+"/serviceaccounts/default", nil)
		return err
	})

	// The value sets not installed below, each object created with dryRun=All: the API server's own
	// validation and admission of everything the chart renders, with no object kept.
	for _, vs := range valueSets[1:] {
		n := cp.dryRunCreate(render(t, tl, vs.args...))
		t.Logf("%s values: the API server accepts all %d objects (dry run)", vs.name, n)
	}

	installStart := time.Now()
	out, err := helm(t, tl, "install", release, chartDir(t), "--kubeconfig", cp.kubeconfig, "--namespace", namespace,
		"--set", "database.url="+testDatabaseURL, "--set", fmt.Sprintf("api.replicas=%d", apiReplicas), "--timeout", "2m")
	if err != nil {
		t.Fatalf("helm install: %v\n%s", err, out)
	}
	t.Logf("helm install in %v:\n%s", time.Since(installStart).Round(10*time.Millisecond), out)
	// NOTES.txt tells the operator where the generated API key is.
	if want := "get secret spore -o jsonpath='{.data.api-key}'"; !strings.Contains(string(out), want) {
		t.Errorf("helm install's notes lack %q", want)
	}

	cp.waitFor("every pod Running and ready on kwok nodes", 3*time.Minute, func() error {
		return cp.podsReady(nodes)
	})
	cp.waitFor("Deployment and DaemonSet report ready", time.Minute, func() error {
		dep := cp.get("/apis/apps/v1/namespaces/" + namespace + "/deployments/spore-api")
		if n := num(get(dep, "status", "readyReplicas")); n != apiReplicas {
			return fmt.Errorf("deployment readyReplicas %d", n)
		}
		ds := cp.get("/apis/apps/v1/namespaces/" + namespace + "/daemonsets/spore-node")
		if d, r := num(get(ds, "status", "desiredNumberScheduled")), num(get(ds, "status", "numberReady")); d != kwokNodes || r != kwokNodes {
			return fmt.Errorf("daemonset desired %d ready %d", d, r)
		}
		return nil
	})
	t.Logf("installed and ready in %v", time.Since(installStart).Round(10*time.Millisecond))

	// Discovery from the cluster: the headless Service lists one ready endpoint per node agent, at
	// the node's address (host network: the address the agent advertises) and the agent's port.
	cp.waitFor("node endpoints published", 20*time.Second, func() error {
		eps := cp.get("/apis/discovery.k8s.io/v1/namespaces/" + namespace + "/endpointslices?labelSelector=kubernetes.io/service-name%3Dspore-node")
		var addrs []string
		for _, s := range list(eps, "items") {
			if len(list(s, "endpoints")) == 0 {
				continue
			}
			if p := list(s, "ports"); len(p) != 1 || num(get(p[0], "port")) != 3001 {
				return fmt.Errorf("endpoint ports %v", p)
			}
			for _, e := range list(s, "endpoints") {
				if get(e, "conditions", "ready") == true {
					addrs = append(addrs, strs(get(e, "addresses"))...)
				}
			}
		}
		sort.Strings(addrs)
		if !slices.Equal(addrs, nodeIPs) {
			var podIPs []string
			for _, p := range list(cp.get("/api/v1/namespaces/"+namespace+"/pods?labelSelector=app.kubernetes.io/component%3Dnode"), "items") {
				podIPs = append(podIPs, str(p, "metadata", "name")+"="+str(p, "status", "podIP"))
			}
			b, _ := json.Marshal(list(eps, "items"))
			return fmt.Errorf("ready node endpoints %v, want the nodes' addresses %v (node pods %v; slices %s)", addrs, nodeIPs, podIPs, b)
		}
		return nil
	})

	// The API's service account: discovery reads allowed, nothing else.
	sa := "system:serviceaccount:" + namespace + ":spore-api"
	for _, c := range []struct {
		group, resource, verb string
		want                  bool
	}{
		{"", "pods", "list", true}, {"", "endpoints", "watch", true}, {"discovery.k8s.io", "endpointslices", "list", true},
		{"", "secrets", "get", false}, {"", "pods", "delete", false}, {"apps", "daemonsets", "list", false},
	} {
		if got := cp.canI(sa, c.group, c.resource, c.verb); got != c.want {
			t.Errorf("%s %s %s/%s: allowed=%v, want %v", sa, c.verb, c.group, c.resource, got, c.want)
		}
	}

	// The fleet CA, join token, API key and secrets key the chart generated are in its Secrets and
	// stay there on upgrade (a new CA would cut off every enrolled node; a new key, every client; a new
	// secrets key, every stored secret). The install's lookup-based keeping is what this proves: the
	// render without a cluster (helm template) makes new ones every time.
	kept := map[string]string{}
	for _, k := range []string{"fleet-ca.crt", "fleet-ca.key", "join-token", "api-key", "secrets-key"} {
		kept["spore/"+k] = cp.secretValue("spore", k)
	}
	for _, k := range []string{"ca.crt", "join-token"} {
		kept["spore-node/"+k] = cp.secretValue("spore-node", k)
	}
	if kept["spore-node/ca.crt"] != kept["spore/fleet-ca.crt"] || kept["spore-node/join-token"] != kept["spore/join-token"] {
		t.Errorf("the node Secret's CA certificate or join token is not the API Secret's")
	}
	checkFleetMaterial(t, kept["spore/fleet-ca.crt"], kept["spore/fleet-ca.key"], kept["spore/join-token"],
		kept["spore-node/ca.crt"], kept["spore-node/join-token"], kept["spore/secrets-key"])
	out, err = helm(t, tl, "upgrade", release, chartDir(t), "--kubeconfig", cp.kubeconfig, "--namespace", namespace,
		"--set", "database.url="+testDatabaseURL, "--set", fmt.Sprintf("api.replicas=%d", apiReplicas), "--timeout", "2m")
	if err != nil {
		t.Fatalf("helm upgrade: %v\n%s", err, out)
	}
	for k, v := range kept {
		name, key, _ := strings.Cut(k, "/")
		if again := cp.secretValue(name, key); again != v {
			t.Errorf("helm upgrade replaced the generated %s", k)
		}
	}

	uninstallStart := time.Now()
	if out, err := helm(t, tl, "uninstall", release, "--kubeconfig", cp.kubeconfig, "--namespace", namespace, "--wait", "--timeout", "2m"); err != nil {
		t.Fatalf("helm uninstall: %v\n%s", err, out)
	}
	// The positive control of the install: a value the offline schema check cannot judge (the
	// document has no enums) is refused by the API server, and the install fails.
	out, err = helm(t, tl, "install", "bad", chartDir(t), "--kubeconfig", cp.kubeconfig, "--namespace", namespace,
		"--set", "database.url="+testDatabaseURL, "--set", "image.pullPolicy=Sometimes", "--timeout", "1m")
	if err == nil || !strings.Contains(string(out), `Unsupported value: "Sometimes"`) {
		t.Errorf("helm install with imagePullPolicy Sometimes: err=%v\n%s", err, out)
	}
	if out, err := helm(t, tl, "uninstall", "bad", "--kubeconfig", cp.kubeconfig, "--namespace", namespace, "--wait", "--timeout", "1m"); err != nil {
		t.Logf("helm uninstall of the refused release: %v\n%s", err, out)
	}
	cp.waitFor("every pod and object gone", 2*time.Minute, func() error {
		for _, path := range []string{"/api/v1/namespaces/" + namespace + "/pods", "/apis/apps/v1/namespaces/" + namespace + "/deployments",
			"/apis/apps/v1/namespaces/" + namespace + "/daemonsets", "/api/v1/namespaces/" + namespace + "/services",
			"/api/v1/namespaces/" + namespace + "/secrets", "/api/v1/namespaces/" + namespace + "/configmaps?labelSelector=app.kubernetes.io/managed-by%3DHelm"} {
			if items := list(cp.get(path), "items"); len(items) > 0 {
				return fmt.Errorf("%s: %d left (%s...)", path, len(items), str(items[0], "metadata", "name"))
			}
		}
		return nil
	})
	t.Logf("uninstalled in %v; whole test %v", time.Since(uninstallStart).Round(10*time.Millisecond), time.Since(start).Round(10*time.Millisecond))
}

// createNode registers a fake node kwok manages (its annotation) with room for the pods and its own
// address (host-network pods, the node agents, get it as their pod IP).
func (cp *controlPlane) createNode(name, ip string) {
	cp.t.Helper()
	res := map[string]any{"cpu": "32", "memory": "256Gi", "pods": "110"}
	if _, err := cp.do("POST", "/api/v1/nodes", map[string]any{
		"apiVersion": "v1", "kind": "Node",
		"metadata": map[string]any{
			"name":        name,
			"annotations": map[string]any{"kwok.x-k8s.io/node": "fake", "node.alpha.kubernetes.io/ttl": "0"},
			"labels": map[string]any{"kubernetes.io/hostname": name, "kubernetes.io/os": "linux",
				"kubernetes.io/arch": "amd64", "type": "kwok"},
		},
		"status": map[string]any{"allocatable": res, "capacity": res,
			"addresses": []any{map[string]any{"type": "InternalIP", "address": ip}, map[string]any{"type": "Hostname", "address": name}}},
	}); err != nil {
		cp.t.Fatal(err)
	}
}

// podsReady: the release's pods are apiReplicas API pods and one node agent per node, each Running
// with every container ready, on kwok's nodes.
func (cp *controlPlane) podsReady(nodes []string) error {
	pods := list(cp.get("/api/v1/namespaces/"+namespace+"/pods?labelSelector=app.kubernetes.io/instance%3D"+release), "items")
	var api int
	var agents []string
	var notReady []string
	for _, p := range pods {
		name, node := str(p, "metadata", "name"), str(p, "spec", "nodeName")
		if !slices.Contains(nodes, node) {
			notReady = append(notReady, fmt.Sprintf("%s on %q", name, node))
			continue
		}
		phase := str(p, "status", "phase")
		ready := phase == "Running" && conditionTrue(p, "Ready")
		for _, c := range list(p, "status", "containerStatuses") {
			ready = ready && get(c, "ready") == true && get(c, "state", "running") != nil
		}
		if !ready {
			notReady = append(notReady, fmt.Sprintf("%s %s", name, phase))
			continue
		}
		switch str(p, "metadata", "labels", "app.kubernetes.io/component") {
		case "api":
			api++
		case "node":
			agents = append(agents, node)
		}
	}
	sort.Strings(agents)
	if len(notReady) > 0 || api != apiReplicas || !slices.Equal(agents, nodes) {
		return fmt.Errorf("api pods ready %d/%d, node agents ready on %v (want %v), not ready: %v", api, apiReplicas, agents, nodes, notReady)
	}
	return nil
}

// canI asks the API server (a SubjectAccessReview) whether user may verb group/resource in the namespace.
func (cp *controlPlane) canI(user, group, resource, verb string) bool {
	cp.t.Helper()
	b, err := cp.do("POST", "/apis/authorization.k8s.io/v1/subjectaccessreviews", map[string]any{
		"apiVersion": "authorization.k8s.io/v1", "kind": "SubjectAccessReview",
		"spec": map[string]any{"user": user, "groups": []any{"system:serviceaccounts", "system:serviceaccounts:" + namespace, "system:authenticated"},
			"resourceAttributes": map[string]any{"namespace": namespace, "group": group, "resource": resource, "verb": verb}},
	})
	if err != nil {
		cp.t.Fatal(err)
	}
	var r struct {
		Status struct{ Allowed bool } `json:"status"`
	}
	if err := json.Unmarshal(b, &r); err != nil {
		cp.t.Fatal(err)
	}
	return r.Status.Allowed
}

// dryRunCreate creates each object in the test namespace with dryRun=All (validated and admitted,
// not stored), failing the test on any refusal, and returns how many were accepted.
func (cp *controlPlane) dryRunCreate(objs []map[string]any) int {
	cp.t.Helper()
	resources := map[string]string{
		"Secret": "/api/v1/namespaces/%s/secrets", "ConfigMap": "/api/v1/namespaces/%s/configmaps",
		"ServiceAccount": "/api/v1/namespaces/%s/serviceaccounts", "Service": "/api/v1/namespaces/%s/services",
		"Role": "/apis/rbac.authorization.k8s.io/v1/namespaces/%s/roles", "RoleBinding": "/apis/rbac.authorization.k8s.io/v1/namespaces/%s/rolebindings",
		"Deployment": "/apis/apps/v1/namespaces/%s/deployments", "DaemonSet": "/apis/apps/v1/namespaces/%s/daemonsets",
		"PodDisruptionBudget": "/apis/policy/v1/namespaces/%s/poddisruptionbudgets", "Ingress": "/apis/networking.k8s.io/v1/namespaces/%s/ingresses",
	}
	for _, o := range objs {
		path, ok := resources[str(o, "kind")]
		if !ok {
			cp.t.Fatalf("dry run: no resource path for kind %s (add it)", str(o, "kind"))
		}
		if _, err := cp.do("POST", fmt.Sprintf(path, namespace)+"?dryRun=All", o); err != nil {
			cp.t.Errorf("%s %s refused: %v", str(o, "kind"), str(o, "metadata", "name"), err)
		}
	}
	return len(objs)
}

func (cp *controlPlane) secretValue(name, key string) string {
	cp.t.Helper()
	return b64(cp.t, str(cp.get("/api/v1/namespaces/"+namespace+"/secrets/"+name), "data", key))
}

func conditionTrue(obj any, typ string) bool {
	for _, c := range list(obj, "status", "conditions") {
		if str(c, "type") == typ {
			return str(c, "status") == "True"
		}
	}
	return false
}

// num reads a JSON number (float64 once decoded) as an int.
func num(v any) int {
	switch x := v.(type) {
	case float64:
		return int(x)
	case int:
		return x
	}
	return -1
}

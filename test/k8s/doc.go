// Package k8s holds the tests of Spore's Kubernetes deployment (deploy/helm/spore): helm lint and
// template, the rendered manifests checked offline against the Kubernetes API's own OpenAPI schema,
// and an install into a real control plane (etcd, kube-apiserver, kube-controller-manager,
// kube-scheduler) whose nodes are kwok's fake ones. The tools are built and cached by
// `make k8s-tools` (scripts/k8s-tools.sh); docs/deploy.md describes what the tests prove.
package k8s

#!/usr/bin/env bash
# Builds the Kubernetes tools the chart tests use (test/k8s) and caches them
# outside the checkout, one directory per tool and version:
#
#   $CACHE_DIR/k8s/kubernetes/v1.37.2/  kube-apiserver, kube-controller-manager,
#                                       kube-scheduler, swagger.json (the API's
#                                       OpenAPI v2 spec, for offline checks)
#   $CACHE_DIR/k8s/etcd/v3.6.16/        etcd
#   $CACHE_DIR/k8s/kwok/v0.8.0/         kwok, stages/ (its fast node and pod stages)
#   $CACHE_DIR/k8s/helm/v3.22.0/        helm
#   $CACHE_DIR/k8s/tools.env            KEY=absolute path, read by the tests
#
# Why from source: no Kubernetes server is packaged for Debian and nothing but
# the Go module proxy is reachable (docs/deploy.md). `go install` refuses
# k8s.io/kubernetes (its go.mod replaces its staging modules with local paths),
# so the three server commands are built from a throwaway module under the
# cache directory (never in the repository) that replaces each staging module
# with its published version. A tool already built is never rebuilt: a second
# run with everything cached takes seconds. Each build writes into a temporary
# directory renamed into place at the end, so an interrupted run leaves nothing
# half-built behind.
#
#   scripts/k8s-tools.sh               # everything (make k8s-tools)
#   scripts/k8s-tools.sh etcd kwok     # only these
set -euo pipefail

CACHE_DIR=${CACHE_DIR:-/var/cache/spore}
GO=${GO:-go}
K8S_VERSION=${K8S_VERSION:-v1.37.2}
ETCD_VERSION=${ETCD_VERSION:-v3.6.16}
KWOK_VERSION=${KWOK_VERSION:-v0.8.0}
HELM_VERSION=${HELM_VERSION:-v3.22.0}

root="$CACHE_DIR/k8s"
mkdir -p "$root"
# One run at a time: two would build into the same directories.
exec 9>"$root/.lock"
flock 9
# The builds run outside any module and never stamp VCS information.
export GOFLAGS=-buildvcs=false
export GOWORK=off
start_all=$SECONDS

log() { printf 'k8s-tools: %s\n' "$*"; }

# built DIR FILE...: true when every FILE exists in DIR.
built() {
  local dir=$1; shift
  local f
  for f in "$@"; do [ -e "$dir/$f" ] || return 1; done
}

# moddir MODULE@VERSION: the module's directory in the module cache (downloads it).
moddir() {
  $GO mod download -json "$1" | sed -n 's/^[[:space:]]*"Dir": "\(.*\)",$/\1/p'
}

kube_dir="$root/kubernetes/$K8S_VERSION"
etcd_dir="$root/etcd/$ETCD_VERSION"
kwok_dir="$root/kwok/$KWOK_VERSION"
helm_dir="$root/helm/$HELM_VERSION"

# ---- kube-apiserver, kube-controller-manager, kube-scheduler ----------------
build_kubernetes() {
  kube_bins=(kube-apiserver kube-controller-manager kube-scheduler)
  if built "$kube_dir" "${kube_bins[@]}" swagger.json; then
    log "kubernetes $K8S_VERSION: cached in $kube_dir"
  else
    t0=$SECONDS
    log "kubernetes $K8S_VERSION: building ${kube_bins[*]} (about 15 min on 2 cores, ~3 GB per link)"
    staging_minor=${K8S_VERSION#v1.}            # 37.2
    staging_version="v0.$staging_minor"          # v0.37.2
    work="$root/kubernetes/$K8S_VERSION.build"
    rm -rf "$work" && mkdir -p "$work/src" "$work/out"
    src=$(moddir "k8s.io/kubernetes@$K8S_VERSION")
    [ -n "$src" ] || { log "cannot download k8s.io/kubernetes@$K8S_VERSION"; exit 1; }
    (
      cd "$work/src"
      $GO mod init spore.local/k8s-tools >/dev/null 2>&1
      cat >tools.go <<'EOF'
//go:build tools

// Package tools records the Kubernetes commands this throwaway module builds.
package tools

import (
	_ "k8s.io/kubernetes/cmd/kube-apiserver"
	_ "k8s.io/kubernetes/cmd/kube-controller-manager"
	_ "k8s.io/kubernetes/cmd/kube-scheduler"
)
EOF
      # Every staging module k8s.io/kubernetes replaces with a local path,
      # replaced here by its published version.
      edits=(-require "k8s.io/kubernetes@$K8S_VERSION" -godebug default=go1.26)
      while read -r mod; do
        edits+=(-replace "$mod=$mod@$staging_version")
      done < <(sed -n 's#^[[:space:]]*\(k8s\.io/[A-Za-z0-9._/-]*\) => \./staging/.*#\1#p' "$src/go.mod")
      [ "${#edits[@]}" -gt 10 ] || { log "found no staging replaces in $src/go.mod"; exit 1; }
      $GO mod edit "${edits[@]}"
      $GO mod tidy
      ver=k8s.io/component-base/version
      $GO build -trimpath -o "$work/out/" \
        -ldflags "-s -w -X $ver.gitVersion=$K8S_VERSION -X $ver.gitMajor=1 -X $ver.gitMinor=${staging_minor%%.*} -X $ver.gitTreeState=clean" \
        k8s.io/kubernetes/cmd/kube-apiserver k8s.io/kubernetes/cmd/kube-controller-manager k8s.io/kubernetes/cmd/kube-scheduler
    )
    cp "$src/api/openapi-spec/swagger.json" "$work/out/swagger.json"
    rm -rf "$kube_dir" && mkdir -p "$(dirname "$kube_dir")" && mv "$work/out" "$kube_dir"
    rm -rf "$work"
    log "kubernetes $K8S_VERSION: built in $((SECONDS - t0)) s"
  fi
}

# ---- etcd (3.6: kwok's watches prefer it to Debian's 3.4) ------------------
build_etcd() {
  if built "$etcd_dir" etcd; then
    log "etcd $ETCD_VERSION: cached in $etcd_dir"
  else
    t0=$SECONDS
    log "etcd $ETCD_VERSION: building"
    work="$root/etcd/$ETCD_VERSION.build"
    rm -rf "$work" && mkdir -p "$work/src" "$work/out"
    (
      cd "$work/src"
      $GO mod init spore.local/etcd >/dev/null 2>&1
      cat >main.go <<'EOF'
// Command etcd is etcd's server, built from its published module.
package main

import (
	"os"

	"go.etcd.io/etcd/server/v3/etcdmain"
)

func main() { etcdmain.Main(os.Args) }
EOF
      $GO get "go.etcd.io/etcd/server/v3@$ETCD_VERSION"
      $GO mod tidy
      $GO build -trimpath -ldflags "-s -w" -o "$work/out/etcd" .
    )
    rm -rf "$etcd_dir" && mkdir -p "$(dirname "$etcd_dir")" && mv "$work/out" "$etcd_dir"
    rm -rf "$work"
    log "etcd $ETCD_VERSION: built in $((SECONDS - t0)) s"
  fi
}

# ---- kwok (fake nodes) and its stages --------------------------------------
build_kwok() {
  if built "$kwok_dir" kwok stages/node-fast.yaml stages/node-heartbeat.yaml stages/pod-fast.yaml; then
    log "kwok $KWOK_VERSION: cached in $kwok_dir"
  else
    t0=$SECONDS
    log "kwok $KWOK_VERSION: building"
    work="$root/kwok/$KWOK_VERSION.build"
    rm -rf "$work" && mkdir -p "$work/out/stages"
    (cd "$work" && GOBIN="$work/out" $GO install -trimpath -ldflags "-s -w" "sigs.k8s.io/kwok/cmd/kwok@$KWOK_VERSION")
    ksrc=$(cd "$work" && moddir "sigs.k8s.io/kwok@$KWOK_VERSION")
    # One file per stage directory (each holds one or more Stage documents).
    for s in node/fast:node-fast node/heartbeat:node-heartbeat pod/fast:pod-fast; do
      from=$ksrc/kustomize/stage/${s%%:*}
      out=$work/out/stages/${s#*:}.yaml
      : >"$out"
      for f in "$from"/*.yaml; do
        case $(basename "$f") in kustomization.yaml) continue ;; esac
        { echo "---"; cat "$f"; } >>"$out"
      done
      grep -q 'kind: Stage' "$out" || { log "no Stage in $from"; exit 1; }
    done
    rm -rf "$kwok_dir" && mkdir -p "$(dirname "$kwok_dir")" && mv "$work/out" "$kwok_dir"
    rm -rf "$work"
    log "kwok $KWOK_VERSION: built in $((SECONDS - t0)) s"
  fi
}

# ---- helm -----------------------------------------------------------------
build_helm() {
  if built "$helm_dir" helm; then
    log "helm $HELM_VERSION: cached in $helm_dir"
  else
    t0=$SECONDS
    log "helm $HELM_VERSION: building"
    work="$root/helm/$HELM_VERSION.build"
    rm -rf "$work" && mkdir -p "$work/out"
    # As helm's own Makefile does: the Kubernetes version `helm template` and `lint` assume is that of
    # the client-go it is built with (else v1.20, which charts requiring a newer one refuse).
    hsrc=$(cd "$work" && moddir "helm.sh/helm/v3@$HELM_VERSION")
    kminor=$(sed -n 's#^[[:space:]]*k8s.io/client-go v0\.\([0-9]*\)\..*#\1#p' "$hsrc/go.mod" | head -1)
    [ -n "$kminor" ] || { log "no k8s.io/client-go in $hsrc/go.mod"; exit 1; }
    (cd "$work" && GOBIN="$work/out" $GO install -trimpath \
      -ldflags "-s -w -X helm.sh/helm/v3/internal/version.version=$HELM_VERSION \
        -X helm.sh/helm/v3/pkg/chartutil.k8sVersionMajor=1 -X helm.sh/helm/v3/pkg/chartutil.k8sVersionMinor=$kminor \
        -X helm.sh/helm/v3/pkg/lint/rules.k8sVersionMajor=1 -X helm.sh/helm/v3/pkg/lint/rules.k8sVersionMinor=$kminor" \
      "helm.sh/helm/v3/cmd/helm@$HELM_VERSION")
    rm -rf "$helm_dir" && mkdir -p "$(dirname "$helm_dir")" && mv "$work/out" "$helm_dir"
    rm -rf "$work"
    log "helm $HELM_VERSION: built in $((SECONDS - t0)) s"
  fi
}

# Arguments name the tools to build (kubernetes etcd kwok helm); none: all of them.
for tool in "${@:-kubernetes etcd kwok helm}"; do
  for one in $tool; do
    case $one in
      kubernetes | etcd | kwok | helm) "build_$one" ;;
      *) log "unknown tool $one (kubernetes, etcd, kwok, helm)"; exit 2 ;;
    esac
  done
done

# The tests find everything through this file (rewritten on every run, so it
# always names the versions this script pins).
tmp=$(mktemp "$root/tools.env.XXXXXX")
cat >"$tmp" <<EOF
K8S_VERSION=$K8S_VERSION
KUBE_APISERVER=$kube_dir/kube-apiserver
KUBE_CONTROLLER_MANAGER=$kube_dir/kube-controller-manager
KUBE_SCHEDULER=$kube_dir/kube-scheduler
KUBE_SWAGGER=$kube_dir/swagger.json
ETCD=$etcd_dir/etcd
KWOK=$kwok_dir/kwok
KWOK_STAGES=$kwok_dir/stages
HELM=$helm_dir/helm
EOF
mv "$tmp" "$root/tools.env"
log "ready in $((SECONDS - start_all)) s: $root/tools.env"

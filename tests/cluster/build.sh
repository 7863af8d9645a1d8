#!/usr/bin/env bash
# Build what the clusters run, from Go modules at pinned versions, into a cache outside the work
# tree. Skips whatever is already cached. Prints progress (a cold build takes minutes per binary
# on 2 cores).
#
#   build.sh                 control plane: etcd, kube-apiserver, kube-controller-manager, kube-proxy
#   build.sh node            + what a real cluster runs: kubelet, kube-scheduler, kubectl,
#                            containerd (containerd, its runc shim, ctr), CoreDNS, agnhost, pause,
#                            regression-issue-74839
#   build.sh conformance     + e2e.test and the ginkgo runner
#   build.sh metallb         MetalLB's controller and speaker (the LoadBalancer provider)
#
# Users who already have the control-plane binaries set PYPROXY_KUBE_APISERVER,
# PYPROXY_KUBE_CONTROLLER_MANAGER, PYPROXY_KUBE_PROXY and PYPROXY_ETCD; the control plane is not
# built then.
set -euo pipefail

K8S_VERSION=${K8S_VERSION:-v1.36.3}
ETCD_VERSION=${ETCD_VERSION:-v3.6.10}
CONTAINERD_VERSION=${CONTAINERD_VERSION:-v2.3.7}
COREDNS_VERSION=${COREDNS_VERSION:-v1.14.2}
AGNHOST_VERSION=2.63.0     # the tag e2e v1.36.3 pulls (test/utils/image/manifest.go)
PAUSE_VERSION=3.10.2       # the sandbox image of containerd 2.3 and e2e v1.36.3
CACHE=${PYPROXY_CLUSTER_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/pyproxy/cluster}
OUT="$CACHE/bin-$K8S_VERSION-etcd-$ETCD_VERSION"
NODE_OUT="$CACHE/node-$K8S_VERSION-containerd-$CONTAINERD_VERSION-coredns-$COREDNS_VERSION"

log() { printf '[cluster-build %s] %s\n' "$(date +%H:%M:%S)" "$*"; }

# v0.16.1, not v0.16.2: v0.16.2 needs github.com/metallb/frr-k8s v0.0.27, whose archive the Go
# module proxy refuses ("403 Forbidden: This module version is not available"), and v0.0.26
# lacks its API (AsPathPrependPrefixes); v0.16.1's frr-k8s v0.0.25 is served.
METALLB_VERSION=${METALLB_VERSION:-v0.16.1}
want_node=0; want_conformance=0; want_metallb=0
for a in "$@"; do
  case "$a" in
    node) want_node=1 ;;
    conformance) want_node=1; want_conformance=1 ;;
    metallb) want_metallb=1 ;;
    *) echo "usage: $0 [node|conformance|metallb]" >&2; exit 2 ;;
  esac
done

export GOFLAGS=-mod=mod GOTOOLCHAIN=local CGO_ENABLED=0
mkdir -p "$OUT" "$NODE_OUT" "$CACHE/src"
S="v0.${K8S_VERSION#v1.}"
MINOR=$(echo "$K8S_VERSION" | cut -d. -f2)

# A build module per upstream module, so one's pins never meet another's.
module() {  # module DIR PACKAGE@VERSION [PACKAGE...]: requires the first package's module at VERSION
  local dir=$1 pkg=${2%@*} ver=${2#*@}; shift 2
  if [ ! -f "$dir/.tidy" ]; then
    log "$pkg $ver: resolving modules"
    rm -rf "$dir" && mkdir -p "$dir"
    (cd "$dir" && go mod init local/build >/dev/null 2>&1 \
      && { printf '//go:build tools\npackage tools\n'; for p in "$pkg" "$@"; do printf 'import _ "%s"\n' "$p"; done; } > tools.go \
      && go get "$pkg@$ver" 2>&1 | quiet \
      && go mod tidy 2>&1 | quiet && touch .tidy)
  fi
}

quiet() { grep -v '^go: \(downloading\|added\|upgraded\)' | tail -n 5 || true; }

compile() {  # compile DIR OUTPUT PACKAGE [go build flags...]
  local dir=$1 out=$2 pkg=$3; shift 3
  [ -x "$out" ] && return 0
  log "compiling $(basename "$out") (minutes on 2 cores when cold)"
  local start; start=$(date +%s)
  if ! (cd "$dir" && go build -trimpath "$@" -o "$out.tmp" "$pkg"); then
    log "compiling $(basename "$out") failed"; exit 1
  fi
  mv "$out.tmp" "$out"
  log "$(basename "$out"): done in $(( $(date +%s) - start ))s ($(du -h "$out" | cut -f1))"
}

# --- MetalLB: a bare-metal cluster's LoadBalancer provider (layer-2 mode needs only these two) ---
if [ "$want_metallb" = 1 ]; then
  L="$CACHE/metallb-$METALLB_VERSION"; mkdir -p "$L"
  Lsrc="$CACHE/src/metallb-$METALLB_VERSION"
  [ -x "$L/controller" ] && [ -x "$L/speaker" ] \
    || module "$Lsrc" "go.universe.tf/metallb/controller@$METALLB_VERSION" go.universe.tf/metallb/speaker
  for cmd in controller speaker; do
    compile "$Lsrc" "$L/$cmd" "go.universe.tf/metallb/$cmd" -ldflags "-s -w"
  done
  # The manifests of the same release (controller, speaker, CRDs, RBAC), for metallb.py.
  [ -f "$L/metallb-native.yaml" ] || cp "$(cd "$Lsrc" && go list -m -f '{{.Dir}}' go.universe.tf/metallb)/config/manifests/metallb-native.yaml" "$L/"
  log "MetalLB in $L"
  [ "$want_node" = 1 ] || exit 0
fi

# --- etcd ---
if [ -z "${PYPROXY_ETCD:-}" ] && [ ! -x "$OUT/etcd" ]; then
  module "$CACHE/src/etcd-$ETCD_VERSION" "go.etcd.io/etcd/server/v3@$ETCD_VERSION"
  compile "$CACHE/src/etcd-$ETCD_VERSION" "$OUT/etcd" go.etcd.io/etcd/server/v3 -ldflags "-s -w"
fi

# --- Kubernetes: a build module that requires k8s.io/kubernetes and replaces every staging module ---
B="$CACHE/src/k8s-$K8S_VERSION"
if [ ! -f "$B/.tidy-all" ]; then
  log "kubernetes $K8S_VERSION: downloading k8s.io/kubernetes go.mod"
  rm -rf "$B" && mkdir -p "$B" && cd "$B"
  go mod init local/kbuild >/dev/null 2>&1
  GOMOD=$(go mod download -json "k8s.io/kubernetes@$K8S_VERSION" | sed -n 's/.*"GoMod": "\(.*\)".*/\1/p')
  n=0
  for m in $(sed -n 's#^[[:space:]]*\(k8s\.io/[^[:space:]]*\) => \./staging/.*#\1#p' "$GOMOD"); do
    go mod edit "-replace=$m=$m@$S"; n=$((n+1))
  done
  log "replaced $n staging modules with $S"
  go mod edit "-require=k8s.io/kubernetes@$K8S_VERSION"
  grep '^godebug' "$GOMOD" >> go.mod || true
  # Every package any target builds, so one tidy serves them all (and e2e.test's test files).
  cat > tools.go <<'T'
//go:build tools
package tools
import (
	_ "k8s.io/kubernetes/cmd/kube-apiserver"
	_ "k8s.io/kubernetes/cmd/kube-controller-manager"
	_ "k8s.io/kubernetes/cmd/kube-proxy"
	_ "k8s.io/kubernetes/cmd/kubelet"
	_ "k8s.io/kubernetes/cmd/kube-scheduler"
	_ "k8s.io/kubernetes/cmd/kubectl"
	_ "k8s.io/kubernetes/test/images/agnhost"
	_ "k8s.io/kubernetes/test/images/regression-issue-74839"
	_ "k8s.io/kubernetes/test/e2e"
	_ "k8s.io/kubernetes/test/e2e/network"
	_ "k8s.io/kubernetes/test/e2e/common/network"
	_ "k8s.io/kubernetes/test/utils/image"
)
T
  log "go mod tidy (downloads a few hundred MB of modules the first time)"
  go mod tidy 2>&1 | quiet
  touch .tidy-all
fi
LDF="-s -w -X k8s.io/component-base/version.gitVersion=$K8S_VERSION -X k8s.io/client-go/pkg/version.gitVersion=$K8S_VERSION \
 -X k8s.io/component-base/version.gitMajor=1 -X k8s.io/component-base/version.gitMinor=$MINOR \
 -X k8s.io/component-base/version.gitTreeState=clean"
TAGS=-tags=selinux,notest,grpcnotrace
if [ -z "${PYPROXY_KUBE_APISERVER:-}" ]; then
  for cmd in kube-proxy kube-controller-manager kube-apiserver; do
    compile "$B" "$OUT/$cmd" "k8s.io/kubernetes/cmd/$cmd" "$TAGS" -ldflags "$LDF"
  done
fi
log "control plane in $OUT"
[ "$want_node" = 1 ] || exit 0

# --- a node: kubelet, scheduler, kubectl, agnhost, pause, containerd ---
for cmd in kubelet kube-scheduler kubectl; do
  compile "$B" "$NODE_OUT/$cmd" "k8s.io/kubernetes/cmd/$cmd" "$TAGS" -ldflags "$LDF"
done
compile "$B" "$NODE_OUT/agnhost" k8s.io/kubernetes/test/images/agnhost \
  -ldflags "-s -w -X main.Version=$AGNHOST_VERSION"
# The invalid-conntrack-state test's server (sends an out-of-window packet on each connection).
compile "$B" "$NODE_OUT/regression-issue-74839" k8s.io/kubernetes/test/images/regression-issue-74839 \
  -ldflags "-s -w"
if [ ! -x "$NODE_OUT/pause" ]; then
  # The pause binary from the same release, built with upstream's flags (build/pause/Makefile).
  K=$(cd "$B" && go list -m -f '{{.Dir}}' k8s.io/kubernetes)
  gcc -Os -Wall -Werror -static -DVERSION="v$PAUSE_VERSION" -o "$NODE_OUT/pause" "$K/build/pause/linux/pause.c"
  log "pause: built"
fi
C="$CACHE/src/containerd-$CONTAINERD_VERSION"
[ -x "$NODE_OUT/containerd" ] && [ -x "$NODE_OUT/ctr" ] && [ -x "$NODE_OUT/containerd-shim-runc-v2" ] || module "$C" "github.com/containerd/containerd/v2/cmd/containerd@$CONTAINERD_VERSION" \
  github.com/containerd/containerd/v2/cmd/containerd-shim-runc-v2 github.com/containerd/containerd/v2/cmd/ctr
CLDF="-s -w -X github.com/containerd/containerd/v2/version.Version=$CONTAINERD_VERSION"
for cmd in containerd containerd-shim-runc-v2 ctr; do
  compile "$C" "$NODE_OUT/$cmd" "github.com/containerd/containerd/v2/cmd/$cmd" -ldflags "$CLDF"
done
# CoreDNS with only the plugins the Kubernetes 1.36 add-on's Corefile uses
# (cluster/addons/dns/coredns/coredns.yaml.in) and those of the DNS tests' own servers (`hosts`:
# dns_common.go's Corefile): its full plugin set adds about a thousand packages of cloud SDKs
# to a cold build. Plugins register themselves when imported. Another list rebuilds it.
D="$CACHE/src/coredns-$COREDNS_VERSION"
PLUGINS="errors health ready kubernetes metrics forward cache loop reload loadbalance log hosts"
if [ "$(cat "$NODE_OUT/coredns.plugins" 2>/dev/null)" != "$PLUGINS" ]; then
  rm -f "$NODE_OUT/coredns" "$D/.tidy"
fi
if [ ! -x "$NODE_OUT/coredns" ]; then
  if [ ! -f "$D/.tidy" ]; then
    log "coredns $COREDNS_VERSION: resolving modules"
    rm -rf "$D" && mkdir -p "$D"
    { printf 'package main\n\nimport (\n\t"github.com/coredns/coredns/coremain"\n\t_ "github.com/coredns/coredns/core/dnsserver"\n'
      for p in $PLUGINS; do
        printf '\t_ "github.com/coredns/coredns/plugin/%s"\n' "$p"
      done
      printf ')\n\nfunc main() { coremain.Run() }\n'; } > "$D/main.go"
    (cd "$D" && go mod init local/coredns >/dev/null 2>&1 && go get "github.com/coredns/coredns@$COREDNS_VERSION" 2>&1 | quiet \
      && go mod tidy 2>&1 | quiet && touch .tidy)
  fi
  compile "$D" "$NODE_OUT/coredns" . -ldflags "-s -w"
  echo "$PLUGINS" > "$NODE_OUT/coredns.plugins"
fi
log "node binaries in $NODE_OUT"
[ "$want_conformance" = 1 ] || exit 0

# --- conformance: e2e.test and ginkgo ---
if [ ! -x "$NODE_OUT/e2e.test" ]; then
  log "compiling e2e.test (the longest link: several minutes when cold)"
  start=$(date +%s)
  if ! (cd "$B" && go test -c -trimpath "$TAGS" -ldflags "$LDF" -o "$NODE_OUT/e2e.test.tmp" k8s.io/kubernetes/test/e2e); then
    log "compiling e2e.test failed"; exit 1
  fi
  mv "$NODE_OUT/e2e.test.tmp" "$NODE_OUT/e2e.test"
  log "e2e.test: done in $(( $(date +%s) - start ))s"
fi
# ginkgo's runner, at the version Kubernetes pins, runs e2e.test's specs in parallel processes.
compile "$B" "$NODE_OUT/ginkgo" github.com/onsi/ginkgo/v2/ginkgo -ldflags "-s -w"
log "conformance binaries in $NODE_OUT"

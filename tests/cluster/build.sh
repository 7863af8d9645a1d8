#!/usr/bin/env bash
# Build kube-apiserver, kube-controller-manager, kube-proxy and etcd from Go modules at pinned
# versions into a cache outside the work tree. Skips work when the cached binaries match the pins.
# Users who already have the binaries set PYPROXY_KUBE_APISERVER, PYPROXY_KUBE_CONTROLLER_MANAGER,
# PYPROXY_KUBE_PROXY and PYPROXY_ETCD instead; nothing is built then.
set -euo pipefail

K8S_VERSION=${K8S_VERSION:-v1.36.3}
ETCD_VERSION=${ETCD_VERSION:-v3.6.10}
CACHE=${PYPROXY_CLUSTER_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/pyproxy/cluster}
OUT="$CACHE/bin-$K8S_VERSION-etcd-$ETCD_VERSION"
STAMP="$OUT/.pins"
PINS="k8s=$K8S_VERSION etcd=$ETCD_VERSION"

log() { printf '[cluster-build %s] %s\n' "$(date +%H:%M:%S)" "$*"; }

if [ -n "${PYPROXY_KUBE_APISERVER:-}" ] && [ -n "${PYPROXY_KUBE_CONTROLLER_MANAGER:-}" ] && [ -n "${PYPROXY_ETCD:-}" ]; then
  log "using installed binaries from PYPROXY_* variables; nothing to build"
  exit 0
fi

if [ -f "$STAMP" ] && [ "$(cat "$STAMP")" = "$PINS" ] \
   && [ -x "$OUT/kube-apiserver" ] && [ -x "$OUT/kube-controller-manager" ] \
   && [ -x "$OUT/kube-proxy" ] && [ -x "$OUT/etcd" ]; then
  log "cached binaries match pins ($PINS) in $OUT"
  exit 0
fi

export GOFLAGS=-mod=mod GOTOOLCHAIN=local CGO_ENABLED=0
mkdir -p "$OUT" "$CACHE/src"
S="v0.${K8S_VERSION#v1.}"
MINOR=$(echo "$K8S_VERSION" | cut -d. -f2)

# --- etcd: its own module, so its grpc/otel pins never meet Kubernetes' ---
if [ ! -x "$OUT/etcd" ]; then
  log "etcd $ETCD_VERSION: resolving modules"
  E="$CACHE/src/etcd-$ETCD_VERSION"
  rm -rf "$E" && mkdir -p "$E" && cd "$E"
  go mod init local/etcdbuild >/dev/null 2>&1
  printf '//go:build tools\npackage tools\nimport _ "go.etcd.io/etcd/server/v3"\n' > tools.go
  go get "go.etcd.io/etcd/server/v3@$ETCD_VERSION" 2>&1 | tail -n 3
  go mod tidy 2>&1 | tail -n 3
  log "etcd: compiling"
  go build -trimpath -ldflags "-s -w" -o "$OUT/etcd" go.etcd.io/etcd/server/v3
  log "etcd: done ($(du -h "$OUT/etcd" | cut -f1))"
fi

# --- Kubernetes: a build module that requires k8s.io/kubernetes and replaces every staging module ---
B="$CACHE/src/k8s-$K8S_VERSION"
if [ ! -f "$B/.tidy" ]; then
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
  cat > tools.go <<'T'
//go:build tools
package tools
import (
	_ "k8s.io/kubernetes/cmd/kube-apiserver"
	_ "k8s.io/kubernetes/cmd/kube-controller-manager"
	_ "k8s.io/kubernetes/cmd/kube-proxy"
)
T
  log "go mod tidy (downloads a few hundred MB of modules the first time)"
  go mod tidy 2>&1 | grep -v '^go: downloading' | tail -n 5 || true
  touch .tidy
fi
cd "$B"
LDF="-s -w -X k8s.io/component-base/version.gitVersion=$K8S_VERSION -X k8s.io/client-go/pkg/version.gitVersion=$K8S_VERSION \
 -X k8s.io/component-base/version.gitMajor=1 -X k8s.io/component-base/version.gitMinor=$MINOR \
 -X k8s.io/component-base/version.gitTreeState=clean"
for cmd in kube-proxy kube-controller-manager kube-apiserver; do
  if [ ! -x "$OUT/$cmd" ]; then
    log "compiling $cmd (several minutes on 2 cores)"
    start=$(date +%s)
    go build -trimpath -tags=selinux,notest,grpcnotrace -ldflags "$LDF" -o "$OUT/$cmd" "k8s.io/kubernetes/cmd/$cmd"
    log "$cmd: done in $(( $(date +%s) - start ))s"
  fi
done
echo "$PINS" > "$STAMP"
log "all binaries in $OUT"

#!/usr/bin/env bash
# The images a real cluster here runs, made without a registry and saved as OCI archives under
# exactly the names the kubelets (and e2e.test) ask for, for `ctr images import` on each node:
#   registry.k8s.io/pause:3.10.2                      pause.c from v1.36.3
#   registry.k8s.io/e2e-test-images/agnhost:2.63.0    agnhost from v1.36.3 on Debian
#   registry.k8s.io/kube-proxy:v1.36.3                upstream kube-proxy on pyproxy's image
#   docker.io/library/pyproxy:0.1.0                   pyproxy's image (make image)
#   registry.k8s.io/coredns/coredns:v1.14.2           CoreDNS (also /coredns in agnhost)
#   registry.k8s.io/e2e-test-images/glibc-dns-testing:2.0.0, nginx:1.15-4, busybox:1.37.0-1,
#     regression-issue-74839:1.4, registry.k8s.io/build-image/distroless-iptables:v0.9.6
#                                                     the other images the [sig-network] tests run
#   quay.io/metallb/controller:v0.16.1, speaker        MetalLB, when build.sh metallb has built it
# Needs tests/cluster/build.sh node first; builds pyproxy's image if missing.
set -euo pipefail
cd "$(dirname "$0")"
K8S_VERSION=${K8S_VERSION:-v1.36.3}
CONTAINERD_VERSION=${CONTAINERD_VERSION:-v2.3.7}
COREDNS_VERSION=${COREDNS_VERSION:-v1.14.2}
CACHE=${PYPROXY_CLUSTER_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/pyproxy/cluster}
CP="$CACHE/bin-$K8S_VERSION-etcd-${ETCD_VERSION:-v3.6.10}"
NODE="$CACHE/node-$K8S_VERSION-containerd-$CONTAINERD_VERSION-coredns-$COREDNS_VERSION"
OUT="$CACHE/images"
PYPROXY=${PYPROXY_IMAGE:-pyproxy:0.1.0}
BASE=localhost/pyproxy-base:bookworm
STORE=(--storage-driver vfs)
log() { printf '[images %s] %s\n' "$(date +%H:%M:%S)" "$*"; }
mkdir -p "$OUT"

# The pyproxy image's id: an archive made from another build of it is stale.
# (buildah exits 125 for an image it does not have: not an error here, under pipefail.)
pyproxy_id=$(buildah "${STORE[@]}" images --no-trunc --format '{{.ID}}' "localhost/$PYPROXY" 2>/dev/null | head -1 || true)
if [ -z "$pyproxy_id" ]; then
  log "no image $PYPROXY yet: building it (tests/image/build.sh)"
  ../image/build.sh "$PYPROXY"
  pyproxy_id=$(buildah "${STORE[@]}" images --no-trunc --format '{{.ID}}' "localhost/$PYPROXY" | head -1)
fi

image() {  # image NAME ARCHIVE CONTAINERFILE KEY [files to put in the context...]
  local name=$1 archive=$OUT/$2 file=$3 key=$4; shift 4
  if [ -f "$archive" ] && [ "$(cat "$archive.key" 2>/dev/null)" = "$key" ]; then
    log "$name: cached"; return 0
  fi
  log "$name: building"
  local ctx; ctx=$(mktemp -d /tmp/pyproxy-image-ctx.XXXXXX)
  cp -a "$@" "$ctx/"
  if ! buildah "${STORE[@]}" build --isolation chroot --network host --layers=false \
      --build-arg "BASE=$BASE" --build-arg "PYPROXY=localhost/$PYPROXY" -t "$name" \
      -f "$PWD/images/$file" "$ctx" >"$ctx.log" 2>&1; then
    tail -20 "$ctx.log"; rm -rf "$ctx"; echo "building $name failed" >&2; exit 1
  fi
  rm -rf "$ctx" "$ctx.log"
  rm -f "$archive"
  buildah "${STORE[@]}" push -q "$name" "oci-archive:$archive.tmp:$name" >/dev/null
  mv "$archive.tmp" "$archive"
  echo "$key" > "$archive.key"
  log "$name: $(du -h "$archive" | cut -f1)"
}

image registry.k8s.io/pause:3.10.2 pause.tar pause.Containerfile "$(sha256sum "$NODE/pause")" "$NODE/pause"
K=$(cd "$CACHE/src/k8s-$K8S_VERSION" && go list -m -f '{{.Dir}}' k8s.io/kubernetes)
image registry.k8s.io/e2e-test-images/agnhost:2.63.0 agnhost.tar agnhost.Containerfile \
  "$(cat "$NODE/agnhost" "$NODE/coredns" images/agnhost.Containerfile | sha256sum)" \
  "$NODE/agnhost" "$NODE/coredns" "$K/test/images/agnhost/porter/localhost.crt" \
  "$K/test/images/agnhost/porter/localhost.key"
# The DNS tests' querier image needs sh, dig and getent from glibc: agnhost's Debian has them.
if [ ! -f "$OUT/glibc-dns-testing.tar" ] || [ "$(cat "$OUT/glibc-dns-testing.tar.key")" != "$(cat "$OUT/agnhost.tar.key")" ]; then
  log "registry.k8s.io/e2e-test-images/glibc-dns-testing:2.0.0: agnhost's image under that name"
  rm -f "$OUT/glibc-dns-testing.tar"
  buildah "${STORE[@]}" push -q registry.k8s.io/e2e-test-images/agnhost:2.63.0 \
    "oci-archive:$OUT/glibc-dns-testing.tar.tmp:registry.k8s.io/e2e-test-images/glibc-dns-testing:2.0.0" >/dev/null
  mv "$OUT/glibc-dns-testing.tar.tmp" "$OUT/glibc-dns-testing.tar"
  cp "$OUT/agnhost.tar.key" "$OUT/glibc-dns-testing.tar.key"
fi
image registry.k8s.io/e2e-test-images/regression-issue-74839:1.4 regression-issue-74839.tar \
  regression-issue-74839.Containerfile \
  "$(cat "$NODE/regression-issue-74839" images/regression-issue-74839.Containerfile | sha256sum)" \
  "$NODE/regression-issue-74839"
image registry.k8s.io/build-image/distroless-iptables:v0.9.6 distroless-iptables.tar \
  distroless-iptables.Containerfile "$(sha256sum images/distroless-iptables.Containerfile)" \
  images/distroless-iptables.Containerfile
image registry.k8s.io/e2e-test-images/nginx:1.15-4 nginx.tar nginx.Containerfile \
  "$(sha256sum images/nginx.Containerfile)" images/nginx.Containerfile
image registry.k8s.io/e2e-test-images/busybox:1.37.0-1 busybox.tar busybox.Containerfile \
  "$(sha256sum /bin/busybox)" /bin/busybox
links=$(mktemp -d /tmp/pyproxy-kp-links.XXXXXX)
mkdir "$links/sbin"
# kube-proxy runs plain `iptables`, `ip6tables`(-save/-restore): the nf_tables back end, as
# upstream's image picks on a host whose rules are in nf_tables.
for t in iptables ip6tables; do for s in "" -save -restore; do ln -s "$t-nft$s" "$links/sbin/$t$s"; done; done
image registry.k8s.io/kube-proxy:$K8S_VERSION kube-proxy.tar kube-proxy.Containerfile \
  "$(sha256sum "$CP/kube-proxy") $pyproxy_id" "$CP/kube-proxy" "$links/sbin"
rm -rf "$links"
if [ ! -f "$OUT/pyproxy.tar" ] || [ "$(cat "$OUT/pyproxy.tar.key" 2>/dev/null)" != "$pyproxy_id" ]; then
  log "docker.io/library/$PYPROXY: exporting"
  rm -f "$OUT/pyproxy.tar"
  buildah "${STORE[@]}" push -q "localhost/$PYPROXY" "oci-archive:$OUT/pyproxy.tar.tmp:docker.io/library/$PYPROXY" >/dev/null
  mv "$OUT/pyproxy.tar.tmp" "$OUT/pyproxy.tar"; echo "$pyproxy_id" > "$OUT/pyproxy.tar.key"
fi
image "registry.k8s.io/coredns/coredns:$COREDNS_VERSION" coredns.tar coredns.Containerfile \
    "$(sha256sum "$NODE/coredns")" "$NODE/coredns"
METALLB="$CACHE/metallb-${METALLB_VERSION:-v0.16.1}"
if [ -x "$METALLB/controller" ] && [ -x "$METALLB/speaker" ]; then
  for c in controller speaker; do
    image "quay.io/metallb/$c:${METALLB_VERSION:-v0.16.1}" "metallb-$c.tar" "metallb-$c.Containerfile" \
      "$(cat "$METALLB/$c" "images/metallb-$c.Containerfile" | sha256sum)" "$METALLB/$c"
  done
fi
log "archives in $OUT"

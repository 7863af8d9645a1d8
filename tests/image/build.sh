#!/usr/bin/env bash
# Build the pyproxy image with buildah, on a base image made locally with debootstrap from
# Debian's packages (no registry pull needed). The Debian mirror is the one this machine's apt
# uses. Prints progress. Usage: tests/image/build.sh [IMAGE]   (default pyproxy:0.1.0)
set -euo pipefail
cd "$(dirname "$0")/../.."
IMAGE=${1:-pyproxy:0.1.0}
BASE=localhost/pyproxy-base:bookworm
STORE=(--storage-driver vfs)
log() { printf '[image %s] %s\n' "$(date +%H:%M:%S)" "$*"; }

for tool in buildah debootstrap; do
  command -v "$tool" >/dev/null || { echo "$tool is not installed (make install as root)" >&2; exit 1; }
done
mirror=${DEBIAN_MIRROR:-$(sed -n 's/^URIs: *\(.*debian\)$/\1/p' /etc/apt/sources.list.d/debian.sources 2>/dev/null | head -1)}
mirror=${mirror:-$(awk '/^deb /{print $2; exit}' /etc/apt/sources.list 2>/dev/null)}
[ -n "$mirror" ] || { echo "no Debian mirror found in apt sources; set DEBIAN_MIRROR" >&2; exit 1; }

if ! buildah "${STORE[@]}" inspect --type image "$BASE" >/dev/null 2>&1; then
  root=$(mktemp -d /tmp/pyproxy-rootfs.XXXXXX)
  trap 'rm -rf "$root"' EXIT
  log "debootstrap bookworm (minbase + python3) into $root"
  debootstrap --variant=minbase --include=python3,python3-venv,ca-certificates \
    bookworm "$root" "$mirror" >/tmp/pyproxy-debootstrap.log 2>&1 \
    || { tail -20 /tmp/pyproxy-debootstrap.log; exit 1; }
  echo "deb $mirror bookworm main" > "$root/etc/apt/sources.list"
  # The local base trusts what this build host trusts (a TLS-inspecting proxy's CA, say).
  if compgen -G "/usr/local/share/ca-certificates/*.crt" >/dev/null; then
    cp /usr/local/share/ca-certificates/*.crt "$root/usr/local/share/ca-certificates/"
    chroot "$root" update-ca-certificates >/dev/null 2>&1 || true
  fi
  rm -rf "$root/var/cache/apt/archives"/*.deb
  log "importing the root filesystem as $BASE"
  ctr=$(buildah "${STORE[@]}" from scratch)
  mnt=$(buildah "${STORE[@]}" mount "$ctr")
  cp -a "$root"/. "$mnt"/
  buildah "${STORE[@]}" umount "$ctr" >/dev/null
  buildah "${STORE[@]}" commit -q "$ctr" "$BASE" >/dev/null
  buildah "${STORE[@]}" rm "$ctr" >/dev/null
fi
log "building $IMAGE from Dockerfile (BASE=$BASE)"
buildlog=$(mktemp /tmp/pyproxy-image-build.XXXXXX)
if ! buildah "${STORE[@]}" build --isolation chroot --network host --layers=false \
  --build-arg "BASE=$BASE" -t "$IMAGE" -f Dockerfile . >"$buildlog" 2>&1; then
  tail -30 "$buildlog"; echo "image build failed (log: $buildlog)" >&2; exit 1
fi
grep -E '^(STEP|COMMIT)' "$buildlog" || true
rm -f "$buildlog"
# Each build leaves the previous image untagged: remove those, or the vfs store grows by
# the image's size with every build.
buildah "${STORE[@]}" images --filter dangling=true -q | xargs -r buildah "${STORE[@]}" rmi >/dev/null 2>&1 || true
log "built $IMAGE ($(buildah "${STORE[@]}" images --format '{{.Size}}' "$IMAGE" | head -1))"

#!/usr/bin/env bash
# `make image`: the pstrain OCI image, built without a Docker engine.
#  1. Bazel builds the four binaries (and the NCCL plugin where CUDA is).
#  2. mmdebstrap makes a minimal Debian bookworm root filesystem with only
#     the runtime libraries (runtime-packages.txt; no compilers, no -dev
#     packages, no docs), a non-root user `pstrain` (uid 10001) and the
#     binaries in /usr/local/bin.
#  3. buildah (vfs storage, chroot isolation, a private store under the work
#     directory) commits it as an image and writes an OCI archive.
#  4. Smoke check: inside the image, pstrain-ps starts and its gRPC health
#     service answers SERVING (`pstrain health`).
#
# usage: deploy/image/build.sh [--stage DIR]   (--stage: only stage the
#        binaries and the package list for `docker build`, see Dockerfile)
# Output: out/image/pstrain-oci.tar (override: IMAGE_OUT, IMAGE_TAG).
set -euo pipefail
cd "$(dirname "$0")/../.."
ROOT=$PWD
TAG=${IMAGE_TAG:-pstrain:latest}
OUT=${IMAGE_OUT:-$ROOT/out/image}
BAZEL=${BAZEL:-bazel}
log() { echo "[image] $*"; }

log "building the binaries"
$BAZEL build //server/coordinator:pstrain-coordinator //server/ps:pstrain-ps //worker:pstrain-worker \
  //client:pstrain //collective:nccl_plugin >&2
stage() {  # stage DIR: bin/ and the package list
  mkdir -p "$1/bin"
  install -m 0755 bazel-bin/server/coordinator/pstrain-coordinator bazel-bin/server/ps/pstrain-ps \
    bazel-bin/worker/pstrain-worker bazel-bin/client/pstrain "$1/bin/"
  if [ -f bazel-bin/collective/libpstrain_nccl.so ]; then
    install -m 0755 bazel-bin/collective/libpstrain_nccl.so "$1/bin/"
  fi
  cp deploy/image/runtime-packages.txt "$1/"
}
if [ "${1:-}" = "--stage" ]; then
  stage "$2"
  log "staged in $2: docker build -t $TAG -f deploy/image/Dockerfile $2"
  exit 0
fi
for tool in mmdebstrap buildah; do
  command -v $tool >/dev/null || { echo "image: $tool is missing (tools/setup.sh --image installs it)" >&2; exit 2; }
done

WORK=$(mktemp -d /var/tmp/pstrain-image.XXXXXX)
BUILDAH=(buildah --root "$WORK/storage" --runroot "$WORK/run" --storage-driver vfs)
ctr=""
cleanup() {
  [ -n "$ctr" ] && "${BUILDAH[@]}" rm "$ctr" >/dev/null 2>&1 || true
  "${BUILDAH[@]}" rmi --all --force >/dev/null 2>&1 || true
  rm -rf "$WORK"
}
trap cleanup EXIT
stage "$WORK/stage"
packages=$(grep -v '^#' deploy/image/runtime-packages.txt | paste -sd, -)
# The host's Debian sources (the same mirror apt-get uses here).
sources=/etc/apt/sources.list.d/debian.sources
[ -f "$sources" ] || sources=/etc/apt/sources.list
log "root filesystem (mmdebstrap bookworm: $packages)"
mmdebstrap --variant=essential --mode=root \
  --aptopt='APT::Install-Recommends "false"' \
  --dpkgopt='path-exclude=/usr/share/doc/*' --dpkgopt='path-exclude=/usr/share/man/*' \
  --dpkgopt='path-exclude=/usr/share/locale/*' --dpkgopt='path-exclude=/usr/share/info/*' \
  --include="$packages" \
  --customize-hook='chroot "$1" useradd --uid 10001 --user-group --home-dir /var/lib/pstrain --create-home pstrain' \
  --customize-hook="copy-in $WORK/stage/bin/. /usr/local/bin/" \
  --customize-hook='rm -rf "$1"/var/lib/apt/lists/* "$1"/var/cache/apt/*' \
  bookworm "$WORK/rootfs.tar" "$sources" >"$WORK/mmdebstrap.log" 2>&1 \
  || { tail -30 "$WORK/mmdebstrap.log" >&2; exit 1; }

log "image (buildah, vfs storage)"
ctr=$("${BUILDAH[@]}" from scratch)
"${BUILDAH[@]}" add "$ctr" "$WORK/rootfs.tar" / >/dev/null
"${BUILDAH[@]}" config --user 10001:10001 --workingdir /var/lib/pstrain \
  --env OPENBLAS_NUM_THREADS=1 --env PATH=/usr/local/bin:/usr/bin:/bin \
  --port 7000 --port 7070 --port 9100 \
  --label org.opencontainers.image.title=pstrain \
  --label org.opencontainers.image.source=https://example.invalid/pstrain \
  --cmd '["pstrain-coordinator"]' "$ctr"

log "smoke check: pstrain-ps inside the image answers its gRPC health check"
"${BUILDAH[@]}" run --isolation chroot "$ctr" -- sh -c '
  pstrain-ps --host=127.0.0.1 --port=0 --port_file=/tmp/ps.addr >/tmp/ps.log 2>&1 &
  ps_pid=$!
  for i in $(seq 100); do [ -s /tmp/ps.addr ] && break; sleep 0.1; done
  [ -s /tmp/ps.addr ] || { cat /tmp/ps.log; exit 1; }
  echo "pstrain-ps at $(cat /tmp/ps.addr): $(pstrain health "$(cat /tmp/ps.addr)")"
  pstrain health "$(cat /tmp/ps.addr)" >/dev/null; rc=$?
  kill $ps_pid; rm -f /tmp/ps.addr /tmp/ps.log
  # Runtime only: no compiler, no -dev package, not root.
  for tool in gcc g++ cc c++ make; do command -v $tool && { echo "$tool in the image"; exit 1; }; done
  dev=$(dpkg-query -W -f "\${Package}\n" | grep -- "-dev$" || true)
  [ -z "$dev" ] || { echo "-dev packages in the image: $dev"; exit 1; }
  echo "runtime only: no compiler, no -dev package; running as uid $(id -u)"
  exit $rc' | sed 's/^/[image]   /'
[ "${PIPESTATUS[0]}" -eq 0 ] || { echo "image: smoke check failed" >&2; exit 1; }

"${BUILDAH[@]}" commit --quiet "$ctr" "$TAG" >/dev/null
mkdir -p "$OUT"
rm -f "$OUT/pstrain-oci.tar"
"${BUILDAH[@]}" push --quiet "$TAG" "oci-archive:$OUT/pstrain-oci.tar:$TAG"
log "wrote $OUT/pstrain-oci.tar ($(du -h "$OUT/pstrain-oci.tar" | cut -f1), $TAG); load it with"
log "  skopeo copy oci-archive:$OUT/pstrain-oci.tar docker://REGISTRY/pstrain:TAG   (or podman load -i)"

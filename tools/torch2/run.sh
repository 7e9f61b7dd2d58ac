#!/usr/bin/env bash
# make test-torch2: the whole Bazel suite against LibTorch 2.x, without a GPU.
# Debian 13 ("trixie") ships libtorch-dev 2.6 with the rest of what pstrain
# builds with (bazel-bootstrap, gRPC, protobuf, Abseil, ...), in the same
# archive this machine installs from: mmdebstrap makes a trixie root with
# the packages tools/setup.sh names, once (cached under
# $PSTRAIN_TORCH2_ROOT, default ~/.cache/pstrain/trixie-root, with its own
# Bazel cache), the working tree is copied in, and `bazel test //...` runs
# there (or the targets given: tools/torch2/run.sh //tests:x //worker/...).
# The pods and manifest checks of `make test` are left out: they test the
# deployment, not LibTorch.  Needs root (chroot, bind mounts).
set -euo pipefail
cd "$(dirname "$0")/../.."
ROOT=${PSTRAIN_TORCH2_ROOT:-$HOME/.cache/pstrain/trixie-root}
log() { echo "[torch2] $*" >&2; }
[ "$(id -u)" -eq 0 ] || { echo "test-torch2 needs root (chroot)" >&2; exit 2; }
command -v mmdebstrap >/dev/null || tools/setup.sh --image

# (Chromium, for the dashboard's browser test, is left out: that test skips
# there saying so; this root checks LibTorch 2.6 and its neighbours.)
packages=$(tools/setup.sh --print-packages | tr ' ' '\n' | grep -v -x -e iproute2 -e iperf3 -e grpc-proto -e chromium |
  paste -sd, -)
if [ ! -f "$ROOT/.pstrain-complete" ]; then
  log "making the trixie root in $ROOT (once; a few minutes)"
  # The Debian archive of this machine's apt sources (or $PSTRAIN_DEBIAN_MIRROR).
  mirror=$(tools/debian_mirror.sh)
  log "from $mirror"
  rm -rf "$ROOT" && mkdir -p "$(dirname "$ROOT")"
  mmdebstrap --variant=apt --mode=root --aptopt='APT::Install-Recommends "false"' \
    --include="$packages,git,ca-certificates" trixie "$ROOT" "deb $mirror trixie main" >&2
  echo "$packages" >"$ROOT/.pstrain-complete"
elif [ "$(cat "$ROOT/.pstrain-complete")" != "$packages" ]; then
  # The package list grew: install what the cached root lacks.
  log "adding packages to the cached root"
  chroot "$ROOT" /bin/bash -c "apt-get update -q && DEBIAN_FRONTEND=noninteractive apt-get install -y -q \
    --no-install-recommends ${packages//,/ }" >&2
  echo "$packages" >"$ROOT/.pstrain-complete"
fi
log "LibTorch $(chroot "$ROOT" dpkg-query -W -f='${Version}' libtorch-dev), $(chroot "$ROOT" bazel --version 2>/dev/null)"

mounts=()
cleanup() { for ((i = ${#mounts[@]} - 1; i >= 0; i--)); do umount -l "${mounts[$i]}" 2>/dev/null || true; done; }
trap cleanup EXIT
for m in proc sys dev dev/pts dev/shm; do
  mkdir -p "$ROOT/$m"; mount --bind "/$m" "$ROOT/$m"; mounts+=("$ROOT/$m")
done
cp /etc/resolv.conf "$ROOT/etc/resolv.conf" 2>/dev/null || true

log "copying the working tree"
rm -rf "$ROOT/src" && mkdir -p "$ROOT/src"
git ls-files -z --cached --others --exclude-standard | tar --null -T - -cf - | tar -xf - -C "$ROOT/src"
targets=${*:-//...}
log "bazel test $targets inside trixie"
chroot "$ROOT" /bin/bash -c "cd /src && HOME=/root bazel test $targets --keep_going --test_output=errors"

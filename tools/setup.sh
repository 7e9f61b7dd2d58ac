#!/usr/bin/env bash
# Installs every Debian package pstrain needs, only if something is missing.
# Idempotent and non-interactive; run as root (or with sudo available).
set -euo pipefail

PACKAGES=(
  # build
  bazel-bootstrap g++ make pkg-config
  protobuf-compiler protobuf-compiler-grpc libprotobuf-dev
  libgrpc++-dev grpc-proto libabsl-dev
  libgtest-dev libgmock-dev
  libspdlog-dev libfmt-dev zlib1g-dev libyaml-cpp-dev nlohmann-json3-dev libcli11-dev
  libsqlite3-dev prometheus-cpp-dev
  # TLS: OpenSSL's libraries (token digests, certificates for `pstrain local --secure`)
  libssl-dev openssl
  # LibTorch (CPU) with a fast BLAS; collectives
  libtorch-dev libopenblas0-pthread libgloo-dev
  # peers for the benchmarks and interop tests (Debian's /usr/bin/python3)
  python3 python3-torch python3-grpcio python3-protobuf iperf3
  # the TensorBoard event file reader of the tests (an independent CRC-32C)
  python3-crc32c
  # the web dashboard (civetweb) and its test in a real browser
  libcivetweb-dev chromium
  # the demo's data
  dataset-fashion-mnist
  # the pods-on-one-machine test (network namespaces)
  iproute2
)

# Tools that some machines already have from another source (the
# Kubernetes project's kubectl, NodeSource's node): installed from Debian
# only when the command is missing.
declare -A COMMANDS=([kubectl]=kubernetes-client [node]=nodejs [npm]=npm)
# The package list alone, for tools/torch2/run.sh's Debian 13 root.
if [ "${1:-}" = "--print-packages" ]; then
  echo "${PACKAGES[@]}"
  exit 0
fi
# `make image` only: an OCI image without a Docker engine.
if [ "${1:-}" = "--image" ]; then
  PACKAGES+=(mmdebstrap buildah uidmap)
fi

missing=()
for p in "${PACKAGES[@]}"; do
  if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed"; then
    missing+=("$p")
  fi
done
for c in "${!COMMANDS[@]}"; do
  command -v "$c" >/dev/null 2>&1 || missing+=("${COMMANDS[$c]}")
done

if [ ${#missing[@]} -eq 0 ]; then
  echo "setup: all ${#PACKAGES[@]} packages present"
else
  SUDO=""
  if [ "$(id -u)" -ne 0 ]; then SUDO="sudo"; fi
  echo "setup: installing ${missing[*]}"
  export DEBIAN_FRONTEND=noninteractive
  $SUDO apt-get update -q
  # iperf3 asks whether to start a daemon; answer no.
  echo "iperf3 iperf3/start_daemon boolean false" | $SUDO debconf-set-selections || true
  $SUDO apt-get install -y -q --no-install-recommends "${missing[@]}"
  echo "setup: done"
fi

# The Kubernetes manifest validator's npm packages (exact versions from
# package-lock.json), from the npm registry.
validate=deploy/validate
cd "$(dirname "$0")/.."
if ! cmp -s "$validate/package-lock.json" "$validate/node_modules/.installed-lock.json" 2>/dev/null; then
  echo "setup: npm ci in $validate"
  npm ci --prefix "$validate" --no-audit --no-fund --loglevel=error
  cp "$validate/package-lock.json" "$validate/node_modules/.installed-lock.json"
fi

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
  # LibTorch (CPU) with a fast BLAS; collectives
  libtorch-dev libopenblas0-pthread libgloo-dev
  # peers for the benchmarks and interop tests (Debian's /usr/bin/python3)
  python3 python3-torch python3-grpcio python3-protobuf iperf3
  # the demo's data
  dataset-fashion-mnist
)

missing=()
for p in "${PACKAGES[@]}"; do
  if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed"; then
    missing+=("$p")
  fi
done

if [ ${#missing[@]} -eq 0 ]; then
  echo "setup: all ${#PACKAGES[@]} packages present"
  exit 0
fi

SUDO=""
if [ "$(id -u)" -ne 0 ]; then SUDO="sudo"; fi
echo "setup: installing ${missing[*]}"
export DEBIAN_FRONTEND=noninteractive
$SUDO apt-get update -q
# iperf3 asks whether to start a daemon; answer no.
echo "iperf3 iperf3/start_daemon boolean false" | $SUDO debconf-set-selections || true
$SUDO apt-get install -y -q --no-install-recommends "${missing[@]}"
echo "setup: done"

#!/usr/bin/env bash
# Prepares, on this Debian machine, what a GPU machine needs to build and
# test pstrain against its own (CUDA) LibTorch: the GPU machines this
# project borrows have nvcc, cmake, ninja and a pip-installed torch with
# NCCL, but no Bazel, no gRPC, no Debian packages and no network.
#
# Writes .gpu/ (ignored by git, under 64 MiB):
#   debs/   the Debian packages of the libraries the build needs (gRPC,
#           protobuf, Abseil, spdlog, ...), fetched with `apt-get download`;
#           tools/gpu/run.sh unpacks them into a prefix there, never over
#           that machine's system;
#   gen/    the protobuf and gRPC sources generated here by Debian's protoc
#           (the same version as the libprotobuf in debs/), and the
#           dashboard's assets as C++ (Bazel's genrule);
#   data/   the workers' --data_root: fashion-mnist/ in it, for the demo-accuracy test.
# Then, with a GPU machine:  tools/gpu/run.sh   (there, from the repo root).
set -euo pipefail
cd "$(dirname "$0")/../.."
OUT=.gpu
rm -rf "$OUT" && mkdir -p "$OUT/debs" "$OUT/gen/proto" "$OUT/data/fashion-mnist"
exclude=$(git rev-parse --git-path info/exclude)
mkdir -p "$(dirname "$exclude")"
grep -qx '/.gpu/' "$exclude" 2>/dev/null || echo '/.gpu/' >> "$exclude"

# Headers and libraries pstrain links, beyond what an Ubuntu 24.04 CUDA
# image has (glibc, libstdc++, zlib). OpenSSL's headers and libraries come
# along too (the security code calls it directly; the same 3.0 ABI as the
# image's), so gRPC and pstrain use one OpenSSL.
PACKAGES=(
  libgrpc++-dev libgrpc-dev libgrpc++1.51 libgrpc29 libc-ares2 libre2-9
  libprotobuf-dev libprotobuf32
  libabsl-dev libabsl20220623
  libspdlog-dev libspdlog1.10 libfmt-dev libfmt9
  libyaml-cpp-dev libyaml-cpp0.7 nlohmann-json3-dev libcli11-dev
  libsqlite3-dev libsqlite3-0
  prometheus-cpp-dev libprometheus-cpp-core1.0 libprometheus-cpp-pull1.0 libcivetweb-dev libcivetweb1
  libgloo-dev libgtest-dev libgmock-dev zlib1g-dev
  libssl-dev libssl3
)
(cd "$OUT/debs" && apt-get download "${PACKAGES[@]}" >/dev/null)

# Generated code, from the Bazel build's own rules: the protobuf and gRPC
# sources, and the dashboard's page, script and style as C++.
bazel build //proto/... //server/coordinator:dashboard_assets_gen >/dev/null 2>&1 ||
  bazel build //proto/... //server/coordinator:dashboard_assets_gen
cp bazel-bin/proto/*.pb.h bazel-bin/proto/*.pb.cc "$OUT/gen/proto/"
mkdir -p "$OUT/gen/server/coordinator"
cp bazel-bin/server/coordinator/dashboard_assets.h bazel-bin/server/coordinator/dashboard_assets.cc \
  "$OUT/gen/server/coordinator/"

cp /usr/share/datasets/fashion-mnist/*.gz "$OUT/data/fashion-mnist/"
du -sh "$OUT"/* | sed 's/^/prepare: /'
echo "prepare: done; on the GPU machine run tools/gpu/run.sh (carry .gpu)"
